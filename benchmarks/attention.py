"""Attention kernels side by side, one table from one run: speed (TFLOP/s) and correctness.

    python benchmarks/attention.py            # GPU: B4 S4096 and B1 S16384, H16 D128, bf16
    python benchmarks/attention.py --small    # any machine: tiny shapes, kernels interpreted

Rows: this project's Pallas kernel (ungated, gated elementwise, gated headwise, gated with
segment ids), cuDNN through jax.nn.dot_product_attention, cuDNN followed by an unfused gate,
jax's own Pallas Triton `mha`, and the XLA reference. Causal attention; FLOPs count QK^T and
PV only (fwd = 4*B*H*S^2*D/2, fwd+bwd = 3.5 x fwd) as in the anchors' peer table. Each time is
the median of --iters calls after --warmup. The error column is the max |out - ref| / max |ref|
against the XLA reference in float32 on the same inputs at a small shape
(B1 S256 H4 D128; with --small, the benchmark shape itself).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
import warnings
from collections.abc import Callable

import jax
import jax.numpy as jnp

from gated_attention import ops
from gated_attention.ops import reference
from gated_attention.ops._flash_common import attention_flops

FULL_SHAPES = ((4, 4096, 16, 128), (1, 16384, 16, 128))
SMALL_SHAPES = ((1, 64, 2, 64),)
CHECK_SHAPE = (1, 256, 4, 128)
CPU_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)


@dataclasses.dataclass(frozen=True)
class Impl:
    name: str
    fn: Callable  # (q, k, v, gate, segment_ids) -> out
    gate: str | None = None  # which gate the row feeds: None, "elementwise", "headwise"
    segments: bool = False
    available: str = ""  # non-empty: why this row cannot run here


def _implementations(platform: str, small: bool) -> list[Impl]:
    ours = "pallas_tpu" if platform == "tpu" else "pallas_gpu"
    blocks = {"block_q": 16, "block_kv": 16} if small else None

    def kernel(q, k, v, gate, seg):
        return ops.attention(q, k, v, gate=gate, segment_ids=seg, impl=ours,
                             block_sizes=blocks)

    def cudnn(q, k, v, gate, seg):
        out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
        return ops.apply_output_gate(out, gate, "sigmoid")

    def xla(q, k, v, gate, seg):
        return reference.attention(q, k, v, gate=gate, segment_ids=seg)

    no_gpu = "" if platform == "gpu" else "needs a GPU"
    rows = [
        Impl(f"{ours} (this project), ungated", kernel),
        Impl(f"{ours}, gated elementwise (fused)", kernel, gate="elementwise"),
        Impl(f"{ours}, gated headwise (fused)", kernel, gate="headwise"),
        Impl(f"{ours}, gated elementwise + segment ids", kernel, gate="elementwise",
             segments=True),
        Impl("cuDNN (jax.nn.dot_product_attention)", cudnn, available=no_gpu),
        Impl("cuDNN + unfused elementwise gate", cudnn, gate="elementwise", available=no_gpu),
    ]
    mha, why = _jax_triton_mha(platform, small)
    rows.append(Impl("jax Pallas Triton mha", mha, available=why))
    rows.append(Impl("XLA reference (jit)", xla))
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


def _inputs(shape, impl: Impl, seed: int = 0):
    b, s, h, d = shape
    keys = jax.random.split(jax.random.PRNGKey(seed), 4)
    q, k, v = (jax.random.normal(key, shape, jnp.bfloat16) for key in keys[:3])
    gate = None
    if impl.gate == "elementwise":
        gate = jax.random.normal(keys[3], shape, jnp.bfloat16)
    elif impl.gate == "headwise":
        gate = jax.random.normal(keys[3], (b, s, h), jnp.bfloat16)
    seg = None
    if impl.segments:  # four packed documents per row
        seg = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32) // -(-s // 4), (b, s))
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
    def loss(q, k, v, gate, seg):
        def scalar(q, k, v, gate):
            return jnp.sum(fn(q, k, v, gate, seg).astype(jnp.float32))
        argnums = (0, 1, 2) if gate is None else (0, 1, 2, 3)
        return jax.grad(scalar, argnums=argnums)(q, k, v, gate)
    return loss


def _rel_error(out: jax.Array, args) -> float:
    q, k, v, gate, seg = args
    f32 = lambda x: None if x is None else x.astype(jnp.float32)  # noqa: E731
    ref = reference.attention(f32(q), f32(k), f32(v), gate=f32(gate), segment_ids=seg)
    return float(jnp.max(jnp.abs(out.astype(jnp.float32) - ref)) / jnp.max(jnp.abs(ref)))


def run(small: bool, warmup: int, iters: int) -> list[dict]:
    platform = jax.default_backend()
    shapes = SMALL_SHAPES if small else FULL_SHAPES
    rows = []
    for impl in _implementations(platform, small):
        err = "n/a"
        if not impl.available and not small:  # --small measures the error on its own shape
            args = _inputs(CHECK_SHAPE, impl, seed=1)
            err = f"{_rel_error(_compile(impl.fn, *args)(*args), args):.1e}"
        for shape in shapes:
            row = dict(impl=impl.name, shape="B{} S{} H{} D{}".format(*shape), error=err,
                       fwd="-", fwd_bwd="-", fwd_ms="-", fwd_bwd_ms="-")
            if impl.available:
                row.update(fwd=impl.available)
                rows.append(row)
                continue
            args = _inputs(shape, impl)
            flops = attention_flops(shape[0], shape[1], shape[2], shape[3], causal=True)
            for key, fn, mult in (("fwd", impl.fn, 1.0), ("fwd_bwd", _fwd_bwd(impl.fn), 3.5)):
                try:
                    compiled = _compile(fn, *args)
                    seconds = _median_seconds(compiled, args, warmup, iters)
                except Exception as exc:  # noqa: BLE001 - one failing row must not hide the rest
                    row[key] = f"failed: {type(exc).__name__}: {str(exc)[:80]}"
                    continue
                if key == "fwd" and small:
                    row["error"] = f"{_rel_error(compiled(*args), args):.1e}"
                row[f"{key}_ms"] = f"{seconds * 1e3:.2f}"
                row[key] = f"{mult * flops / seconds / 1e12:.3g}"
            rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    header = ("| implementation | shape | fwd ms | fwd TFLOP/s | fwd+bwd ms | fwd+bwd TFLOP/s "
              "| max rel err vs XLA |")
    lines = [header, "|" + "---|" * 7]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['shape']} | {r['fwd_ms']} | {r['fwd']} | "
                     f"{r['fwd_bwd_ms']} | {r['fwd_bwd']} | {r['error']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true",
                        help="tiny shapes, kernels in interpret mode (runs on a CPU)")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--iters", type=int, default=None)
    args = parser.parse_args()
    warmup = args.warmup if args.warmup is not None else (1 if args.small else 3)
    iters = args.iters if args.iters is not None else (2 if args.small else 20)
    device = jax.devices()[0]
    print(f"# device: {device.device_kind} ({jax.default_backend()}), jax {jax.__version__}, "
          f"bfloat16, causal, median of {iters} after {warmup} warm-up")
    if args.small:
        print("# --small: tiny shapes, kernels interpreted on CPU; timings are not speeds")
    print(format_table(run(args.small, warmup, iters)))


if __name__ == "__main__":
    main()
