"""MoE layer speed against a dense FFN of the same FLOPs, on every backend present, in one run.

    python benchmarks/moe.py             # CPU: small shape; GPU/TPU: also the 15A2B layer
    python benchmarks/moe.py --small     # small shape only, everywhere

Rows per device and shape:
- MoE blocked (the dropless layer: router, sort, experts' rows padded to whole blocks,
  batched matmuls, unsort);
- MoE ragged_dot (the same with `jax.lax.ragged_dot`; XLA:CPU/GPU lower it densely, E times
  the FLOPs and memory, so it runs only where E is small, or on TPU);
- MoE dense reference (every expert on every token; only where E is small);
- dense SwiGLU of width k*F: exactly the MoE's expert matmul FLOPs per token, as one
  ordinary FFN. Its tokens/s is the target a grouped-matmul MoE can approach.
FLOPs per token count the three expert matmuls only (2 * 3 * D * F * k forward, 3x that
forward+backward); router and sort are the MoE's overhead. Each time is the median of --iters
calls after --warmup.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from absl import flags
from flax import nnx

from gated_attention.cli import flags as cli_flags
from gated_attention.config.run_config import base_config, model_config
from gated_attention.model.layers.mlp import SwiGLU
from gated_attention.model.layers.moe import MoEFeedForward


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    tokens: int
    d_model: int
    expert_dim: int
    experts: int
    top_k: int
    dtype: str


SMALL = Shape("small", tokens=2048, d_model=256, expert_dim=128, experts=16, top_k=4,
              dtype="float32")
PAPER = Shape("15A2B layer", tokens=16384, d_model=2048, expert_dim=768, experts=128,
              top_k=8, dtype="bfloat16")
DENSE_REFERENCE_MAX_EXPERTS = 32


def moe_layer(shape: Shape, impl: str) -> MoEFeedForward:
    cfg = model_config(base_config("tiny_moe")).replace(
        d_model=shape.d_model, expert_mlp_dim=shape.expert_dim, num_experts=shape.experts,
        experts_per_token=shape.top_k, dtype=shape.dtype, moe_impl=impl)
    return nnx.jit(lambda: MoEFeedForward(cfg, rngs=nnx.Rngs(params=0)))()


def dense_layer(shape: Shape) -> SwiGLU:
    width = shape.top_k * shape.expert_dim
    return nnx.jit(lambda: SwiGLU(shape.d_model, width, rngs=nnx.Rngs(params=0),
                                  dtype=jnp.dtype(shape.dtype)))()


def timed(fn: Callable, args: tuple, warmup: int, iters: int) -> float:
    for _ in range(warmup):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(module: nnx.Module, x: jax.Array, warmup: int, iters: int) -> tuple[float, float]:
    """(forward seconds, forward+backward seconds) of a module on x [1, T, D]."""
    graphdef, state = nnx.split(module)

    def forward(state, x):
        out = nnx.merge(graphdef, state)(x)
        return out[0] if isinstance(out, tuple) else out

    def loss(state, x):
        return jnp.sum(forward(state, x).astype(jnp.float32) ** 2)

    fwd = jax.jit(forward)
    fwd_bwd = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return timed(fwd, (state, x), warmup, iters), timed(fwd_bwd, (state, x), warmup, iters)


def run_device(device: jax.Device, shapes: list[Shape], warmup: int, iters: int) -> list[str]:
    rows = []
    with jax.default_device(device):
        for shape in shapes:
            x = jax.random.normal(jax.random.key(0), (1, shape.tokens, shape.d_model),
                                  jnp.dtype(shape.dtype))
            flops = 2 * 3 * shape.d_model * shape.expert_dim * shape.top_k * shape.tokens
            layers = [("MoE blocked (dropless)", moe_layer(shape, "blocked"))]
            if shape.experts <= DENSE_REFERENCE_MAX_EXPERTS or device.platform == "tpu":
                layers.append(("MoE ragged_dot (dropless)", moe_layer(shape, "ragged")))
            if shape.experts <= DENSE_REFERENCE_MAX_EXPERTS:
                layers.append(("MoE dense reference", moe_layer(shape, "dense")))
            layers.append((f"dense SwiGLU width k*F={shape.top_k * shape.expert_dim}",
                           dense_layer(shape)))
            results = [(name, *measure(layer, x, warmup, iters)) for name, layer in layers]
            dense_fwd_bwd = results[-1][2]
            for name, fwd, fwd_bwd in results:
                rows.append(
                    f"| {device.platform} | {shape.name}: T{shape.tokens} D{shape.d_model} "
                    f"F{shape.expert_dim} E{shape.experts} k{shape.top_k} {shape.dtype} | {name} "
                    f"| {shape.tokens / fwd:,.0f} | {shape.tokens / fwd_bwd:,.0f} "
                    f"| {flops / fwd / 1e9:.1f} | {3 * flops / fwd_bwd / 1e9:.1f} "
                    f"| {dense_fwd_bwd / fwd_bwd:.2f} |")
    return rows


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_bool("small", False, "Small shape only.", flag_values=flag_values)
    flags.DEFINE_integer("warmup", 2, "Warm-up calls.", flag_values=flag_values)
    flags.DEFINE_integer("iters", 5, "Timed calls (median reported).", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/moe.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    devices = {d.platform: d for d in reversed(jax.devices("cpu"))}
    try:
        accelerators = jax.devices()
    except RuntimeError:
        accelerators = []
    devices.update({d.platform: d for d in accelerators if d.platform != "cpu"})
    print(f"# {datetime.date.today()}, jax {jax.__version__}, devices: "
          f"{', '.join(f'{d.platform} ({d.device_kind})' for d in devices.values())}; "
          f"median of {args.iters} after {args.warmup} warm-up")
    print("| device | shape | layer | fwd tokens/s | fwd+bwd tokens/s | fwd GFLOP/s "
          "| fwd+bwd GFLOP/s | fwd+bwd speed vs dense |")
    print("|---|---|---|---|---|---|---|---|")
    for platform, device in devices.items():
        shapes = [SMALL] if args.small or platform == "cpu" else [SMALL, PAPER]
        for row in run_device(device, shapes, args.warmup, args.iters):
            print(row, flush=True)


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
