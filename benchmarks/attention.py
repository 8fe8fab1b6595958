"""Attention kernels side by side, one table from one run: speed (TFLOP/s) and correctness.

    python benchmarks/attention.py            # B4 S4096 H16 D128, the same with 4 kv heads,
                                              # and B1 S16384: every path of this platform
    python benchmarks/attention.py --small    # any machine: tiny shapes, kernels interpreted
    python benchmarks/attention.py --block_sizes=runs/sweep.json   # our rows with swept blocks
    python benchmarks/attention.py --check [--small]   # float32 values and gradients vs XLA

Rows, the baselines first (so a time cap cuts our rows, not theirs): cuDNN through
jax.nn.dot_product_attention, cuDNN followed by an unfused gate and jax's own Pallas Triton
`mha` on a GPU; jax's splash attention on a TPU; then this project's kernel for the platform
(ungated, gated elementwise, gated headwise, gated with segment ids: four packed documents a
row), then the XLA reference (skipped above S8192: its S x S logits would not fit).
Causal attention; FLOPs count QK^T and PV only (fwd = 4*B*H*S^2*D/2, fwd+bwd = 3.5 x fwd) as
in the peer table, and a packed row counts each document on its own (sum of L_i^2, not S^2:
attention never crosses documents). Each time is the median of --iters calls after --warmup,
through `time_forward` / `time_forward_backward`, which the block-size sweep uses too. The
error column is the max |out - ref| / max |ref| against the XLA reference in float32 on the
same inputs at a small shape (B1 S256 H4 D128; with --small, the benchmark shape itself).
Rows are printed as they finish. The data packages (grain) are not imported: the benchmark
needs only jax.

--block_sizes takes the JSON that benchmarks/sweep_blocks.py writes (its winner for this device
kind and head_dim is used) or an inline JSON dict; our kernel's rows then use those sizes.

--check runs no timings (and on a GPU also checks impl="cudnn_packed" in bfloat16 on the
packed cases): ops.attention(impl="pallas_gpu" on a GPU or CPU, "pallas_tpu" on a
TPU) in float32 against the XLA reference at float32 "highest" matmul precision, for the output
and the gradients of a random linear loss w.r.t. q, k, v and the gate, at a few shapes with
GQA, segment ids, odd lengths and head_dim 64/128/256. It prints max |x - ref| / max |ref| per
array and exits 1 if any error is above CHECK_TOL or a case fails to run. On a GPU the kernel's
float32 matmuls may use TF32, so about 1e-3 is expected there (1e-6 interpreted on a CPU).
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from gated_attention import ops
from gated_attention.cli import flags as cli_flags
from gated_attention.ops import reference, testing
from gated_attention.ops._flash_common import attention_flops
from gated_attention.ops.block_sizes import device_kind_key


class Shape(NamedTuple):
    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int

    def label(self) -> str:
        kv = f" KV{self.kv_heads}" if self.kv_heads != self.heads else ""
        return f"B{self.batch} S{self.seq} H{self.heads}{kv} D{self.head_dim}"


FULL_SHAPES = (Shape(4, 4096, 16, 16, 128), Shape(4, 4096, 16, 4, 128),
               Shape(1, 16384, 16, 16, 128))
SMALL_SHAPES = (Shape(1, 64, 2, 2, 32),)
CHECK_SHAPE = Shape(1, 256, 4, 4, 128)
XLA_MAX_SEQ = 8192  # the reference holds B x H x S x S float32 logits (S16384: 16 GiB a head
#                     group, about 100 GiB with its backward)
PACKED_DOCUMENTS = 4
CPU_COMPILE = testing.FAST_COMPILE


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    fn: Callable  # (q, k, v, gate, segment_ids) -> out
    gate: str | None = None  # which gate the row feeds: None, "elementwise", "headwise"
    segments: bool = False
    available: str = ""  # non-empty: why this row cannot run here
    mha_only: bool = False  # needs as many kv heads as query heads
    max_seq: int | None = None


def _our_impls(platform: str) -> tuple[str, ...]:
    return {"tpu": ("pallas_tpu",), "gpu": ("pallas_gpu",)}.get(platform, ("pallas_gpu",))


def _implementations(platform: str, small: bool,
                     blocks: dict[str, int] | None = None) -> list[Impl]:
    if small and blocks is None:
        blocks = {"block_q": 16, "block_kv": 16}

    def through_ops(impl: str, sizes: dict[str, int] | None):
        def attn(q, k, v, gate, seg):
            return ops.attention(q, k, v, gate=gate, segment_ids=seg, impl=impl,
                                 block_sizes=sizes)
        return attn

    def cudnn(q, k, v, gate, seg):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return ops.apply_output_gate(out, gate, "sigmoid")

    def xla(q, k, v, gate, seg):
        return reference.attention(q, k, v, gate=gate, segment_ids=seg)

    no_gpu = "" if platform == "gpu" else "needs a GPU"
    rows = [  # baselines first: a time cap cuts the project's rows, not the yardsticks
        Impl("cuDNN (jax.nn.dot_product_attention)", cudnn, available=no_gpu),
        Impl("cuDNN + unfused elementwise gate", cudnn, gate="elementwise", available=no_gpu),
    ]
    mha, why = _jax_triton_mha(platform, small)
    rows.append(Impl("jax Pallas Triton mha", mha, available=why, mha_only=True))
    # cuDNN over packed sequences (jax's private entry point): auto's candidate for packed
    # batches once it measures ahead of pallas_gpu's packed row below
    packed = through_ops("cudnn_packed", None)
    rows += [Impl("cuDNN packed (cudnn_packed), segment ids", packed, segments=True,
                  available=no_gpu),
             Impl("cuDNN packed + elementwise gate, segment ids", packed, gate="elementwise",
                  segments=True, available=no_gpu)]
    if platform == "tpu":
        splash = through_ops("splash", None)
        rows += [Impl("splash (jax), ungated", splash),
                 Impl("splash + elementwise gate", splash, gate="elementwise"),
                 Impl("splash + elementwise gate, segment ids", splash, gate="elementwise",
                      segments=True)]
    for ours in _our_impls(platform):
        kernel = through_ops(ours, blocks)
        rows += [
            Impl(f"{ours} (this project), ungated", kernel),
            Impl(f"{ours}, gated elementwise (fused)", kernel, gate="elementwise"),
            Impl(f"{ours}, gated headwise (fused)", kernel, gate="headwise"),
            Impl(f"{ours}, gated elementwise + segment ids", kernel, gate="elementwise",
                 segments=True),
        ]
    rows.append(Impl("XLA reference (jit)", xla, max_seq=XLA_MAX_SEQ))
    return rows


def _jax_triton_mha(platform: str, small: bool):
    """jax.experimental.pallas.ops.gpu.attention.mha (deprecated upstream; may be gone)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from jax.experimental.pallas.ops.gpu import attention as jax_attention
    except ImportError as err:
        return None, f"not importable: {err}"
    if platform not in ("gpu", "cpu"):
        return None, "Triton: GPU only"
    interpret = platform == "cpu"
    sizes = (jax_attention.BlockSizes(16, 16, 16, 16, 16, 16) if small
             else jax_attention.BlockSizes.get_default())

    def mha(q, k, v, gate, seg):
        return jax_attention.mha(q, k, v, seg, sm_scale=q.shape[-1] ** -0.5, causal=True,
                                 block_sizes=sizes, interpret=interpret)

    return mha, ""


def packed_segment_ids(batch: int, seq: int, documents: int = PACKED_DOCUMENTS) -> np.ndarray:
    """[batch, seq] ids of `documents` equal-length packed documents per row."""
    return testing.packed_segment_ids(batch, seq, documents)


def causal_flops(shape: Shape, segment_ids: np.ndarray | None = None) -> float:
    """Forward FLOPs of QK^T and PV; with segment ids, each document's own causal square."""
    b, s, h, _, d = shape
    if segment_ids is None:
        return attention_flops(b, s, h, d, causal=True)
    total = 0.0
    for row in np.asarray(segment_ids):
        _, lengths = np.unique(row, return_counts=True)
        total += sum(attention_flops(1, int(n), h, d, causal=True) for n in lengths)
    return total


def _inputs(shape: Shape, impl: Impl, seed: int = 0):
    b, s, h, n, d = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(keys[0], (b, s, h, d), jnp.bfloat16)
    k, v = (jax.random.normal(key, (b, s, n, d), jnp.bfloat16) for key in keys[1:3])
    gate = None
    if impl.gate == "elementwise":
        gate = jax.random.normal(keys[3], (b, s, h, d), jnp.bfloat16)
    elif impl.gate == "headwise":
        gate = jax.random.normal(keys[3], (b, s, h), jnp.bfloat16)
    seg = jnp.asarray(packed_segment_ids(b, s)) if impl.segments else None
    return q, k, v, gate, seg


def _compile(fn, *args):
    options = CPU_COMPILE if jax.default_backend() == "cpu" else None
    return jax.jit(fn).lower(*args).compile(compiler_options=options)


def _median_seconds(compiled, args, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _fwd_bwd(fn):
    """Forward + backward of attn(q, k, v, gate, seg): gradients of sum(out) w.r.t. q, k, v
    (and the gate)."""
    def loss(q, k, v, gate, seg):
        def scalar(q, k, v, gate):
            return jnp.sum(fn(q, k, v, gate, seg).astype(jnp.float32))
        argnums = (0, 1, 2) if gate is None else (0, 1, 2, 3)
        return jax.grad(scalar, argnums=argnums)(q, k, v, gate)
    return loss


def time_forward(fn, args, warmup: int, iters: int):
    """(compiled forward, median seconds): the harness of the table and of the sweep."""
    compiled = _compile(fn, *args)
    return compiled, _median_seconds(compiled, args, warmup, iters)


def time_forward_backward(fn, args, warmup: int, iters: int):
    """(compiled forward + backward, median seconds), as `time_forward`."""
    compiled = _compile(_fwd_bwd(fn), *args)
    return compiled, _median_seconds(compiled, args, warmup, iters)


def _rel_error(out: jax.Array, args) -> float:
    q, k, v, gate, seg = args
    f32 = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
    ref = reference.attention(f32(q), f32(k), f32(v), gate=f32(gate), segment_ids=seg)
    return float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))


def _why_not(impl: Impl, shape: Shape) -> str:
    if impl.available:
        return impl.available
    if impl.mha_only and shape.kv_heads != shape.heads:
        return "no GQA"
    if impl.max_seq is not None and shape.seq > impl.max_seq:
        return f"skipped above S{impl.max_seq} (S x S logits)"
    return ""


def iter_rows(small: bool, warmup: int, iters: int,
              blocks: dict[str, int] | None = None) -> Iterator[dict]:
    """One row per (implementation, shape), yielded as soon as it is measured."""
    platform = jax.default_backend()
    shapes = SMALL_SHAPES if small else FULL_SHAPES
    for impl in _implementations(platform, small, blocks):
        err = "n/a"
        if not _why_not(impl, CHECK_SHAPE) and not small:  # --small: on its own shape
            args = _inputs(CHECK_SHAPE, impl, seed=1)
            try:
                err = f"{_rel_error(_compile(impl.fn, *args)(*args), args):.1e}"
            except Exception as exc:  # noqa: BLE001 - the timings below may still run
                err = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
        for shape in shapes:
            row = dict(impl=impl.name, shape=shape.label(), error=err, fwd="-", fwd_bwd="-",
                       fwd_ms="-", fwd_bwd_ms="-")
            why = _why_not(impl, shape)
            if why:
                row.update(fwd=why)
                yield row
                continue
            args = _inputs(shape, impl)
            flops = causal_flops(shape, None if args[4] is None else np.asarray(args[4]))
            for key, timer, mult in (("fwd", time_forward, 1.0),
                                     ("fwd_bwd", time_forward_backward, 3.5)):
                try:
                    compiled, seconds = timer(impl.fn, args, warmup, iters)
                except Exception as exc:  # noqa: BLE001 - one failing row must not hide the rest
                    row[key] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                    continue
                if key == "fwd" and small:
                    row["error"] = f"{_rel_error(compiled(*args), args):.1e}"
                row[f"{key}_ms"] = f"{seconds * 1e3:.2f}"
                row[key] = f"{mult * flops / seconds / 1e12:.3g}"
            yield row


def run(small: bool, warmup: int, iters: int, blocks: dict[str, int] | None = None,
        ) -> list[dict]:
    return list(iter_rows(small, warmup, iters, blocks))


TABLE_HEADER = ("| implementation | shape | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s "
                "| max rel err vs XLA |\n|" + "---|" * 7)


def format_row(r: dict) -> str:
    return (f"| {r['impl']} | {r['shape']} | {r['fwd_ms']} | {r['fwd']} | "
            f"{r['fwd_bwd_ms']} | {r['fwd_bwd']} | {r['error']} |")


def format_table(rows: list[dict]) -> str:
    return "\n".join([TABLE_HEADER, *(format_row(r) for r in rows)])


def load_block_sizes(spec: str | None, head_dim: int) -> dict[str, int] | None:
    """--block_sizes: a sweep JSON (its winner for this device kind and head_dim) or a dict.

    A sweep file without a winner for this device falls back to the tuned table (None).
    """
    if not spec:
        return None
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        if not path.exists():
            print(f"# --block_sizes: {spec} does not exist; using the block-size table")
            return None
        data = json.loads(path.read_text())
    else:
        data = json.loads(spec)
    if "winners" in data:  # the sweep's output
        kind = device_kind_key()
        data = data["winners"].get(kind, {}).get(str(head_dim))
        if not data:
            print(f"# --block_sizes: {spec} has no winner for {kind} head_dim {head_dim}; "
                  "using the block-size table")
            return None
    return {k: int(v) for k, v in data.items()}


# ----------------------------------------------------------------------------- --check

CHECK_TOL = 1e-2  # float32 kernels; TF32 matmuls on a GPU give about 1e-3
SAFE_BLOCKS = dict(block_q=32, block_kv=32, block_q_dq=32, block_kv_dq=32, block_q_dkv=32,
                   block_kv_dkv=32, num_warps=4, num_stages=1)


@dataclasses.dataclass(frozen=True)
class CheckCase:
    name: str
    batch: int
    seq: int
    heads: int
    kv_heads: int
    head_dim: int
    gate: str | None  # None, "elementwise", "headwise"
    segments: bool


CHECK_CASES = (
    CheckCase("GQA 4, elementwise gate, segment ids, odd length", 2, 1000, 8, 2, 128,
              "elementwise", True),
    CheckCase("1.7B model heads (16 q / 8 kv), elementwise gate", 1, 4096, 16, 8, 128,
              "elementwise", False),
    CheckCase("GQA 4, headwise gate, segment ids, d64", 1, 300, 4, 1, 64, "headwise", True),
    CheckCase("no GQA, elementwise gate, d256", 1, 256, 2, 2, 256, "elementwise", False),
)
SMALL_CHECK_CASES = (
    CheckCase("GQA 2, elementwise gate, segment ids", 1, 40, 4, 2, 32, "elementwise", True),
    CheckCase("GQA 2, headwise gate", 1, 33, 2, 1, 64, "headwise", False),
)


def make_inputs(batch: int, seq: int, heads: int, kv_heads: int, head_dim: int,
                gate: str | None, segments: bool, dtype, seed: int = 0) -> dict:
    """q, k, v, gate, segment ids and a float32 probe (the linear loss's weights)."""
    return testing.random_inputs(np.random.default_rng(seed), batch=batch, seq=seq,
                                 heads=heads, kv_heads=kv_heads, head_dim=head_dim, gate=gate,
                                 segments=segments, dtype=dtype)


def outputs_and_grads(attn: Callable, inputs: dict) -> Callable:
    """A function of the inputs dict: (out in float32, grads of sum(out * probe) w.r.t. q, k,
    v and the gate if any). attn(q, k, v, gate, segment_ids) -> out."""
    names = ("q", "k", "v") if inputs["gate"] is None else ("q", "k", "v", "gate")

    def fn(inputs):
        def forward(diff):
            x = {**inputs, **diff}
            return attn(x["q"], x["k"], x["v"], x["gate"], x["segment_ids"])
        return testing.probe_vjp(forward, {n: inputs[n] for n in names}, inputs["probe"])

    return fn


def reference_outputs_and_grads(inputs: dict):
    """outputs_and_grads of the XLA reference on float32 copies, at full matmul precision."""
    f32 = {n: (x.astype(jnp.float32) if n != "segment_ids" and x is not None else x)
           for n, x in inputs.items()}

    def ref(q, k, v, gate, seg):
        return reference.attention(q, k, v, gate=gate, segment_ids=seg)

    with jax.default_matmul_precision("highest"):
        return jax.jit(outputs_and_grads(ref, f32))(f32)


rel_errors = testing.relative_errors  # max |got - want| / max |want| per output and gradient


def check(small: bool, blocks: dict[str, int] | None = None) -> bool:
    """Print the errors of our kernel's output and gradients per case; True if all pass."""
    platform = jax.default_backend()
    impl = "pallas_tpu" if platform == "tpu" else "pallas_gpu"
    print(f"# --check: {impl} float32 vs the XLA reference (float32, highest precision); "
          f"block sizes: {blocks or 'the table'}; tolerance {CHECK_TOL:g}")
    print("| case | shape | out | dq | dk | dv | dgate | verdict |\n|" + "---|" * 8,
          flush=True)

    def kernel_with(sizes):
        def kernel(q, k, v, gate, seg):
            return ops.attention(q, k, v, gate=gate, segment_ids=seg, impl=impl,
                                 block_sizes=sizes)
        return kernel

    all_ok = True
    for case in SMALL_CHECK_CASES if small else CHECK_CASES:
        shape = (f"B{case.batch} S{case.seq} H{case.heads}/{case.kv_heads} D{case.head_dim}"
                 f"{' seg' if case.segments else ''}")
        inputs = make_inputs(case.batch, case.seq, case.heads, case.kv_heads, case.head_dim,
                             case.gate, case.segments, jnp.float32, seed=2)
        # A case that fails to run with the given sizes (float32 tiles take twice the shared
        # memory of bf16 ones) is tried again with small tiles, so its numbers still come out.
        for sizes, note in ((blocks, ""), (SAFE_BLOCKS, " (retry with SAFE_BLOCKS)")):
            try:
                got = _compile(outputs_and_grads(kernel_with(sizes), inputs), inputs)(inputs)
                errs = rel_errors(got, reference_outputs_and_grads(inputs))
            except Exception as exc:  # noqa: BLE001 - report it and go on
                all_ok = False
                print(f"| {case.name}{note} | {shape} | failed: {type(exc).__name__}: "
                      f"{str(exc)[:300]} |", flush=True)
                continue
            ok = all(e <= CHECK_TOL for e in errs.values())
            all_ok &= ok
            cols = " | ".join(f"{errs[n]:.1e}" if n in errs else "-"
                              for n in ("out", "dq", "dk", "dv", "dgate"))
            print(f"| {case.name}{note} | {shape} | {cols} | {'ok' if ok else 'TOO LARGE'} |",
                  flush=True)
            break
    all_ok &= check_packed_cudnn(small, platform)
    print(f"# check: {'all cases within' if all_ok else 'FAILED:'} tolerance {CHECK_TOL:g}")
    return all_ok


PACKED_TOL = 2e-2  # bfloat16 inputs (cuDNN's flash attention takes 16-bit only)


def check_packed_cudnn(small: bool, platform: str) -> bool:
    """cudnn_packed (jax's private packed cuDNN) in bfloat16 against the float32 reference,
    on the packed cases; on a machine without a GPU, one line saying so."""
    cases = [c for c in (SMALL_CHECK_CASES if small else CHECK_CASES) if c.segments]
    if platform != "gpu":
        print("# --check cudnn_packed: needs a GPU (not checked here)")
        return True
    print(f"# --check cudnn_packed: bfloat16 vs the XLA reference; tolerance {PACKED_TOL:g}")

    def kernel(q, k, v, gate, seg):
        return ops.attention(q, k, v, gate=gate, segment_ids=seg, impl="cudnn_packed")

    all_ok = True
    for case in cases:
        shape = f"B{case.batch} S{case.seq} H{case.heads}/{case.kv_heads} D{case.head_dim} seg"
        inputs = make_inputs(case.batch, case.seq, case.heads, case.kv_heads, case.head_dim,
                             case.gate, True, jnp.bfloat16, seed=2)
        try:
            got = _compile(outputs_and_grads(kernel, inputs), inputs)(inputs)
            errs = rel_errors(got, reference_outputs_and_grads(inputs))
        except Exception as exc:  # noqa: BLE001 - report it and go on
            print(f"| cudnn_packed: {case.name} | {shape} | failed: {type(exc).__name__}: "
                  f"{str(exc)[:300]} |", flush=True)
            all_ok = False
            continue
        ok = all(e <= PACKED_TOL for e in errs.values())
        all_ok &= ok
        cols = " | ".join(f"{errs[n]:.1e}" if n in errs else "-"
                          for n in ("out", "dq", "dk", "dv", "dgate"))
        print(f"| cudnn_packed: {case.name} | {shape} | {cols} | "
              f"{'ok' if ok else 'TOO LARGE'} |", flush=True)
    return all_ok


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_bool("small", False, "Tiny shapes, kernels in interpret mode (runs on a CPU).",
                      flag_values=flag_values)
    flags.DEFINE_integer("warmup", None, "Warm-up calls (default: 1 with --small, else 3).",
                         flag_values=flag_values)
    flags.DEFINE_integer("iters", None, "Timed calls (default: 2 with --small, else 10).",
                         flag_values=flag_values)
    flags.DEFINE_string("block_sizes", None, "Sweep JSON (benchmarks/sweep_blocks.py --out) or "
                        "an inline JSON dict: block sizes for this project's kernel rows.",
                        flag_values=flag_values)
    flags.DEFINE_bool("check", False, "No timings: float32 values and gradients vs the XLA "
                      "reference.", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/attention.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    device = jax.devices()[0]
    head_dim = (SMALL_SHAPES if args.small else FULL_SHAPES)[0].head_dim
    blocks = load_block_sizes(args.block_sizes, head_dim)
    if args.check:
        print(f"# device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}")
        sys.exit(0 if check(args.small, blocks) else 1)
    warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)
    iters = args.iters if args.iters is not None else (2 if args.small else 10)
    print(f"# device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
          f"bfloat16, causal, median of {iters} after {warmup} warm-up")
    if args.small:
        print("# --small: tiny shapes, kernels interpreted on CPU; timings are not speeds")
    if blocks:
        print(f"# this project's kernel rows use block sizes {blocks}")
    print(TABLE_HEADER, flush=True)
    for row in iter_rows(args.small, warmup, iters, blocks):
        print(format_row(row), flush=True)


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
