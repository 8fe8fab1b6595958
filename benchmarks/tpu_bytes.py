"""HBM bytes of the TPU attention paths, from the XLA TPU compiler on a CPU host (no TPU).

    python benchmarks/tpu_bytes.py                      # both tables, v5e, B1 S4096
    python benchmarks/tpu_bytes.py --topology=v6e:2x2 --what=kernel

Compiles forward + backward for one chip of a TPU topology, deviceless through libtpu,
inside `ops.compiling_for("tpu")` (so tile sizes and `auto` are the TPU's), and prints the
compiler's `cost_analysis()["bytes accessed"]` and the copy / transpose instructions left in
the optimized HLO. Two settings:

- block: x -> q/k/v (and gate) projections -> attention -> output projection, the gradient
  of a linear loss w.r.t. x and every weight (B1 S4096, d_model 2048, 16 query / 8 kv heads
  of 128, bf16): what a model's layer asks of the kernel, where XLA folds the layout of
  q/k/v into the projection matmuls.
- kernel: the attention call alone on [b, s, h, d] arguments, gradient w.r.t. q/k/v/gate.

These are the compiler's estimates of memory traffic, not timings on a TPU.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
from absl import flags

from gated_attention import ops
from gated_attention.cli import flags as cli_flags

FEATURES = {"ungated": dict(gate=False, segments=False),
            "elementwise gate, segment ids": dict(gate=True, segments=True)}
MIB = 2.0 ** 20


def tpu_device(topology: str):
    """The first compile-only device of a TPU topology (libtpu, no TPU needed)."""
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    return topologies.get_topology_desc(topology_name=topology, platform="tpu").devices[0]


def copies(hlo: str) -> int:
    """copy / transpose instructions of an optimized HLO module (fusions count once)."""
    return len(re.findall(r"= \S+ (?:copy|transpose)\(", hlo))


def compile_cost(fn: Callable, args: dict, device) -> dict:
    """Compile jit(fn)(args) for `device` (a TPU target) and read what the compiler says."""
    placed = jax.sharding.SingleDeviceSharding(device)
    args = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed), args)
    start = time.process_time()
    with ops.compiling_for("tpu"):
        compiled = jax.jit(fn).lower(args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    hlo = compiled.as_text()
    return {"bytes": float(cost["bytes accessed"]), "copies": copies(hlo),
            "compile_s": time.process_time() - start, "hlo": hlo}


def block_problem(impl: str, gate: bool, segments: bool, *, seq: int = 4096,
                  d_model: int = 2048, heads: int = 16, kv_heads: int = 8, head_dim: int = 128,
                  **attention_kwargs) -> tuple[Callable, dict]:
    """(loss gradient function, abstract arguments) of projection -> attention -> projection."""
    bf16, b = jnp.bfloat16, 1
    shape = jax.ShapeDtypeStruct
    args = {"x": shape((b, seq, d_model), bf16),
            "wq": shape((d_model, heads, head_dim), bf16),
            "wk": shape((d_model, kv_heads, head_dim), bf16),
            "wv": shape((d_model, kv_heads, head_dim), bf16),
            "wo": shape((heads, head_dim, d_model), bf16),
            "probe": shape((b, seq, d_model), bf16)}
    if gate:
        args["wg"] = shape((d_model, heads, head_dim), bf16)
    if segments:
        args["segment_ids"] = shape((b, seq), jnp.int32)

    def loss(params: dict, fixed: dict):
        x = params["x"]
        q = jnp.einsum("bsm,mhd->bshd", x, params["wq"])
        k = jnp.einsum("bsm,mnd->bsnd", x, params["wk"])
        v = jnp.einsum("bsm,mnd->bsnd", x, params["wv"])
        g = jnp.einsum("bsm,mhd->bshd", x, params["wg"]) if gate else None
        out = ops.attention(q, k, v, gate=g, segment_ids=fixed.get("segment_ids"), impl=impl,
                            **attention_kwargs)
        y = jnp.einsum("bshd,hdm->bsm", out, params["wo"])
        return jnp.sum(y.astype(jnp.float32) * fixed["probe"].astype(jnp.float32))

    return _grad_of(loss, ("probe", "segment_ids")), args


def kernel_problem(impl: str, gate: bool, segments: bool, *, seq: int = 4096, heads: int = 16,
                   kv_heads: int = 16, head_dim: int = 128,
                   **attention_kwargs) -> tuple[Callable, dict]:
    """(loss gradient function, abstract arguments) of the attention call alone."""
    bf16, b = jnp.bfloat16, 1
    shape = jax.ShapeDtypeStruct
    args = {"q": shape((b, seq, heads, head_dim), bf16),
            "k": shape((b, seq, kv_heads, head_dim), bf16),
            "v": shape((b, seq, kv_heads, head_dim), bf16),
            "probe": shape((b, seq, heads, head_dim), bf16)}
    if gate:
        args["gate"] = shape((b, seq, heads, head_dim), bf16)
    if segments:
        args["segment_ids"] = shape((b, seq), jnp.int32)

    def loss(params: dict, fixed: dict):
        out = ops.attention(params["q"], params["k"], params["v"], gate=params.get("gate"),
                            segment_ids=fixed.get("segment_ids"), impl=impl, **attention_kwargs)
        return jnp.sum(out.astype(jnp.float32) * fixed["probe"].astype(jnp.float32))

    return _grad_of(loss, ("probe", "segment_ids")), args


def _grad_of(loss: Callable, fixed_names: tuple[str, ...]) -> Callable:
    def grads(args: dict):
        params = {n: x for n, x in args.items() if n not in fixed_names}
        fixed = {n: x for n, x in args.items() if n in fixed_names}
        return jax.grad(loss)(params, fixed)
    return grads


PROBLEMS = {"block": block_problem, "kernel": kernel_problem}


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("topology", "v5e:2x2", "TPU topology; its first chip.",
                        flag_values=flag_values)
    flags.DEFINE_enum("what", "both", [*PROBLEMS, "both"], "Which problem to compile.",
                      flag_values=flag_values)
    flags.DEFINE_string("impls", "pallas_tpu,splash", "Comma-separated implementations.",
                        flag_values=flag_values)
    flags.DEFINE_integer("seq", 4096, "Sequence length.", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/tpu_bytes.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    device = tpu_device(args.topology)
    whats = list(PROBLEMS) if args.what == "both" else [args.what]
    print(f"{args.topology} ({device.device_kind}), B1 S{args.seq}, bf16, fwd+bwd; "
          "compiler's bytes accessed, no timing")
    print("| setting | impl | features | HBM bytes | copies / transposes | compile CPU s |")
    print("|---|---|---|---|---|---|")
    for what in whats:
        for impl in args.impls.split(","):
            for label, features in FEATURES.items():
                fn, abstract = PROBLEMS[what](impl, seq=args.seq, **features)
                # jax's splash kernel does not trace with jax_enable_x64 on
                with jax.enable_x64(False):
                    cost = compile_cost(fn, abstract, device)
                print(f"| {what} | {impl} | {label} | {cost['bytes'] / MIB:.0f} MiB | "
                      f"{cost['copies']} | {cost['compile_s']:.0f} |", flush=True)


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
