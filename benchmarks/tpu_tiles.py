"""Backward tile sizes of the Pallas TPU kernel (`pallas_tpu`), chosen without a TPU.

    python benchmarks/tpu_tiles.py                        # v5e, v5p, v6e at B1 S4096 H16 KV8 D128
    python benchmarks/tpu_tiles.py --generations=v6e --seq=8192 --packed

For each TPU generation, each backward phase (the dq kernel; the dk/dv kernel) and each
candidate (block_q, block_kv) of that phase, the other phase keeping the table's tiles:

1. Compile: the phase's Mosaic call is compiled for one chip of the generation (deviceless,
   libtpu). A candidate the compiler refuses (scoped VMEM exceeded, an illegal tile) is out.
   The compiler's `bytes accessed` for the call is printed too: it counts the call's operands
   and results once, whatever the tiles, so on its own it cannot rank them.
2. Count: the phase's own work, read off its grid. HBM bytes: Pallas copies a block in (or
   out) when its block index differs from the previous grid step's, so the kernel's own index
   maps are evaluated over the whole grid and the changes counted. MXU FLOPs: the tiles it
   visits (causal blocks above the diagonal, and blocks of other documents, are skipped) times
   its matmuls per tile (dq 3, dk/dv 4). Grid steps: all of them, skipped or not.
3. Estimate: max(FLOPs / peak bf16 MXU rate, bytes / HBM bandwidth) + steps x 0.35 us (a
   commonly quoted per-step overhead of a Pallas TPU grid; --step_us). A roofline from
   published chip figures, not a timing: exp throughput, VMEM spills, DMA latency and how
   well copies overlap the compute are not in it.

Tiles go up to 512 (--max_block): the kernel pads the length to a multiple of its largest
tile, and the forward's is 512.

Ranked by the estimate; the winner per generation is printed as the literal that
`ops/block_sizes.py` holds. Only a measurement on a TPU can overrule it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks/ folder

import tpu_bytes  # noqa: E402 - benchmarks/tpu_bytes.py: compile-only TPU devices

from gated_attention import ops  # noqa: E402
from gated_attention.cli import flags as cli_flags
from gated_attention.ops import block_sizes, pallas_tpu  # noqa: E402

# Published per-chip figures: peak bf16 MXU FLOP/s and HBM bytes/s.
CHIPS = {"v5e": (197e12, 819e9, "v5e:2x2"), "v5p": (459e12, 2765e9, "v5p:2x2x1"),
         "v6e": (918e12, 1640e9, "v6e:2x2")}
STEP_US = 0.35  # per grid step, the figure commonly quoted for Pallas TPU (not measured here)
PHASES = {"dq": ("block_q_dq", "block_kv_dq", "gated_flash_dq", 3),
          "dkv": ("block_q_dkv", "block_kv_dkv", "gated_flash_dkv", 4)}
SIZES = (128, 256, 512, 1024)
# The kernel pads the length to a multiple of its largest tile: backward tiles above the
# forward's 512 would pad every length to a multiple of 1024.
MAX_BLOCK = 512


@dataclasses.dataclass
class Call:
    """One recorded pallas_call: what `pallas_tpu._call` was given, and its arguments."""

    name: str
    static: object
    grid: tuple[int, ...]
    in_specs: list
    out_specs: list
    out_shape: list
    scratch: list
    kernel: object
    args: tuple = ()


@contextlib.contextmanager
def recording() -> Iterator[list[Call]]:
    """Record the kernel module's pallas_calls instead of running them (results are zeros)."""
    calls: list[Call] = []
    real = pallas_tpu._call

    def fake(kernel, static, grid, in_specs, out_specs, out_shape, scratch, name):
        call = Call(name, static, grid, list(in_specs), _listed(out_specs), _listed(out_shape),
                    scratch, kernel)
        calls.append(call)

        def run(*args):
            call.args = args
            zeros = [None if s is None else jnp.zeros(s.shape, s.dtype) for s in call.out_shape]
            return zeros if isinstance(out_shape, list | tuple) else zeros[0]
        return run

    pallas_tpu._call = fake
    try:
        yield calls
    finally:
        pallas_tpu._call = real


def _listed(x) -> list:
    return list(x) if isinstance(x, list | tuple) else [x]


def backward_calls(seq: int, heads: int, kv_heads: int, head_dim: int, packed: bool,
                   sizes: dict[str, int]) -> dict[str, Call]:
    """The dq and dk/dv calls of one backward pass with these tiles, for a TPU target."""
    b, bf16 = 1, jnp.bfloat16
    q = jnp.zeros((b, seq, heads, head_dim), bf16)
    kv = jnp.zeros((b, seq, kv_heads, head_dim), bf16)
    seg = (jnp.repeat(jnp.arange(4, dtype=jnp.int32), seq // 4)[None] if packed else None)
    stats = jnp.zeros((b, heads, seq), jnp.float32)
    with ops.compiling_for("tpu"), recording() as calls:
        static = pallas_tpu._static(q, kv, None, "sigmoid", seg, True, "softmax", False, sizes)
        pallas_tpu._backward(static, q, kv, kv, seg, None, q, stats, stats)
    return {c.name: c for c in calls}


def _block_bytes(spec, array) -> int:
    shape = [1 if d is None else d for d in spec.block_shape]
    return int(np.prod(shape)) * jnp.dtype(array.dtype).itemsize


def traffic(call: Call) -> int:
    """HBM bytes the call's block copies move: a copy whenever a block index changes."""
    lo, hi, *arrays = call.args
    steps = np.array(list(itertools.product(*map(range, call.grid))), np.int32)
    total = 0
    for spec, array in [*zip(call.in_specs, arrays), *zip(call.out_specs, call.out_shape)]:
        if spec is None:  # an input or output this call leaves out (pallas_tpu's kernels)
            continue
        if spec.index_map is None or spec.block_shape is None:  # SMEM: whole array, once
            continue

        def index(step, spec=spec):
            return jnp.stack(spec.index_map(*(step[a] for a in range(steps.shape[1])), lo, hi))
        idx = np.asarray(jax.vmap(index)(jnp.asarray(steps)))
        copies = 1 + int(np.any(idx[1:] != idx[:-1], axis=1).sum())
        total += copies * _block_bytes(spec, array)
    return total


def visited(call: Call, phase: str) -> tuple[int, int]:
    """(tiles computed, grid steps): the kernels skip blocks outside their [lo, hi) range."""
    lo, hi = (np.asarray(a) for a in call.args[:2])
    b, _, n_outer, n_inner = call.grid
    steps = int(np.prod(call.grid))
    if phase == "dq":  # grid (b, h, q block, kv block); the range is of kv blocks
        spans = (hi - lo).reshape(b, n_outer)
        return int(spans.sum()) * call.grid[1], steps
    nq = n_inner // call.static.problem.group  # grid (b, kv head, kv block, member x q block)
    spans = (hi - lo).reshape(b, n_outer)
    return int(spans.sum()) * call.grid[1] * (n_inner // nq), steps


def compiled_bytes(call: Call, device) -> float:
    """Compile the recorded call alone for `device`; the compiler's bytes accessed."""
    placed = jax.sharding.SingleDeviceSharding(device)
    abstract = [None if a is None else jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=placed)
                for a in call.args]
    fn = pallas_tpu._call(call.kernel, call.static, call.grid, call.in_specs,
                          call.out_specs if len(call.out_specs) > 1 else call.out_specs[0],
                          call.out_shape if len(call.out_shape) > 1 else call.out_shape[0],
                          call.scratch, call.name)
    with ops.compiling_for("tpu"):
        compiled = jax.jit(fn).lower(*abstract).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    if "bytes accessed" in cost:
        return float(cost["bytes accessed"])
    # a lone custom call: one entry per operand ("bytes accessed0{}", ...) and the result
    return float(sum(v for k, v in cost.items() if k.startswith("bytes accessed")))


def sweep(generation: str, seq: int, heads: int, kv_heads: int, head_dim: int,
          packed: bool, max_block: int, step_us: float) -> dict[str, list[dict]]:
    peak, bandwidth, topology = CHIPS[generation]
    device = tpu_bytes.tpu_device(topology)
    table = block_sizes.block_sizes_for(head_dim, kind="tpu")
    rows: dict[str, list[dict]] = {}
    for phase, (q_key, kv_key, name, matmuls) in PHASES.items():
        rows[phase] = []
        for bq, bkv in itertools.product(SIZES, SIZES):
            if max(bq, bkv) > min(seq, max_block):
                continue
            sizes = {**{k: v for k, v in table.items() if k.startswith("block")},
                     q_key: bq, kv_key: bkv}
            call = backward_calls(seq, heads, kv_heads, head_dim, packed, sizes)[name]
            row = dict(block_q=bq, block_kv=bkv, current=(bq, bkv) == (table[q_key],
                                                                        table[kv_key]))
            start = time.process_time()
            try:
                row["compiler_bytes"] = compiled_bytes(call, device)
            except Exception as err:  # refused by Mosaic / XLA: the first line says why
                row["refused"] = str(err).strip().splitlines()[0][:90]
            row["compile_s"] = time.process_time() - start
            tiles, steps = visited(call, phase)
            row.update(bytes=traffic(call), flops=tiles * matmuls * 2 * bq * bkv * head_dim,
                       steps=steps)
            row["estimate_s"] = (max(row["flops"] / peak, row["bytes"] / bandwidth)
                                 + steps * step_us * 1e-6)
            rows[phase].append(row)
            _print_row(generation, phase, row)
    return rows


def _print_row(generation: str, phase: str, row: dict) -> None:
    verdict = row.get("refused") or f"{row['compiler_bytes'] / tpu_bytes.MIB:.0f} MiB"
    mark = " (table)" if row["current"] else ""
    print(f"| {generation} | {phase} | {row['block_q']} x {row['block_kv']}{mark} | {verdict} | "
          f"{row['bytes'] / tpu_bytes.MIB:.0f} MiB | {row['flops'] / 1e9:.1f} | {row['steps']} | "
          f"{row['estimate_s'] * 1e6:.0f} |", flush=True)


def winners(rows: dict[str, list[dict]]) -> dict[str, int]:
    best = {}
    for phase, (q_key, kv_key, _, _) in PHASES.items():
        ok = [r for r in rows[phase] if "refused" not in r]
        top = min(ok, key=lambda r: r["estimate_s"])
        best.update({q_key: top["block_q"], kv_key: top["block_kv"]})
    return best


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("generations", ",".join(CHIPS), f"Comma-separated, of "
                        f"{', '.join(CHIPS)}.", flag_values=flag_values)
    flags.DEFINE_integer("seq", 4096, "Sequence length.", flag_values=flag_values)
    flags.DEFINE_integer("heads", 16, "Query heads.", flag_values=flag_values)
    flags.DEFINE_integer("kv_heads", 8, "Key/value heads.", flag_values=flag_values)
    flags.DEFINE_integer("head_dim", 128, "Head dimension.", flag_values=flag_values)
    flags.DEFINE_bool("packed", False, "Segment ids: four documents of seq/4 per row.",
                      flag_values=flag_values)
    flags.DEFINE_integer("max_block", MAX_BLOCK, f"Largest tile tried, one of {SIZES} (the "
                         "length is padded to a multiple of it).", flag_values=flag_values)
    flags.register_validator("max_block", lambda size: size in SIZES,
                             f"must be one of {', '.join(map(str, SIZES))}",
                             flag_values=flag_values)
    flags.DEFINE_float("step_us", STEP_US, "Overhead of one grid step in the estimate, "
                       "microseconds.", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/tpu_tiles.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    print(f"B1 S{args.seq} H{args.heads} KV{args.kv_heads} D{args.head_dim} bf16, causal"
          f"{', 4 documents per row' if args.packed else ''}; compiled per chip, no TPU; "
          f"estimate = max(FLOPs / peak, bytes / HBM bandwidth) + {args.step_us} us x steps")
    print("| gen | phase | block_q x block_kv | compiler (bytes accessed, or refusal) | "
          "bytes moved (grid) | MXU GFLOP | grid steps | estimate us |")
    print("|---|---|---|---|---|---|---|---|")
    picks = {}
    for generation in args.generations.split(","):
        if generation not in CHIPS:
            raise SystemExit(f"--generations: {generation!r} is not allowed; choose from "
                             f"{', '.join(CHIPS)}")
        with jax.enable_x64(False):
            picks[generation] = winners(sweep(generation, args.seq, args.heads, args.kv_heads,
                                              args.head_dim, args.packed, args.max_block,
                                              args.step_us))
    for generation, best in picks.items():
        print(f"{generation} (head_dim {args.head_dim}): {best}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
