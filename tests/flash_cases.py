"""Shared checks for the Pallas attention kernels: values and gradients against float64 XLA.

Each case computes the output and the gradients of a random linear loss w.r.t. q, k, v, gate
and sink_logits in one compiled call (interpret-mode kernels compile slowly on CPU, so one
compile per case), and compares them with ops/reference.py run on float64 copies of the same
inputs. Errors are max|kernel - reference| / max|reference| per array. Inputs, the gradient
probe and the errors come from gated_attention/ops/testing.py, as the benchmark's check's do.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from types import ModuleType

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention import ops
from gated_attention.ops import reference, testing
from gated_attention.ops.block_sizes import block_sizes_for
from gated_attention.parallel import distributed, sharding

FAST_COMPILE = testing.FAST_COMPILE  # interpret-mode kernels compile at half the cost


@dataclasses.dataclass(frozen=True)
class Case:
    normalizer: str
    gate: str | None  # None, "elementwise", "headwise"
    activation: str = "sigmoid"
    segments: bool = True
    causal: bool = True
    batch: int = 1
    seq: int = 37
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 64
    dtype: str = "float32"
    block_q: int = 16
    block_kv: int = 16
    grads: bool = True

    @property
    def tol(self) -> float:
        return 1e-5 if self.dtype == "float32" else 1e-2

    def __str__(self) -> str:
        return (f"{self.normalizer}-{self.gate}-{self.activation}-seg{int(self.segments)}"
                f"-causal{int(self.causal)}-s{self.seq}-h{self.heads}/{self.kv_heads}"
                f"-d{self.head_dim}-{self.dtype}")


def make_inputs(case: Case, seed: int = 0) -> dict:
    return testing.random_inputs(
        np.random.default_rng(seed), batch=case.batch, seq=case.seq, heads=case.heads,
        kv_heads=case.kv_heads, head_dim=case.head_dim, gate=case.gate, segments=case.segments,
        dtype=jnp.dtype(case.dtype), sink=case.normalizer == "learned_sink",
        probe_dtype=jnp.float64)


def _value_and_grads(attention_fn, case: Case, inputs: dict, kwargs: dict):
    def forward(diff: dict):
        args = {**{n: inputs[n] for n in testing.DIFFERENTIABLE}, **diff}
        return attention_fn(args["q"], args["k"], args["v"], gate=args["gate"],
                            sink_logits=args["sink"], segment_ids=inputs["segment_ids"],
                            gate_activation=case.activation, causal=case.causal,
                            normalizer=case.normalizer, **kwargs)

    diff = {n: inputs[n] for n in testing.DIFFERENTIABLE if inputs[n] is not None}
    if not case.grads:
        return forward(diff), {}
    return testing.probe_vjp(forward, diff, inputs["probe"])


def errors(attention_fn, case: Case, seed: int = 0, x64: bool = False,
           **kwargs) -> dict[str, float]:
    """Relative max errors of the output and every gradient vs the float64 reference.

    The kernel traces and runs in jax's default 32-bit mode, as users run it (x64=True: with
    jax_enable_x64 on instead); the reference always runs in float64.
    """
    with jax.enable_x64(True):
        inputs = make_inputs(case, seed)
    with jax.enable_x64(x64):
        kernel_inputs = inputs if x64 else jax.tree.map(
            lambda x: x if x is None or x.dtype != jnp.float64 else x.astype(jnp.float32),
            inputs)
        compiled = jax.jit(lambda x: _value_and_grads(attention_fn, case, x, kwargs)).lower(
            kernel_inputs).compile(compiler_options=FAST_COMPILE)
        got = compiled(kernel_inputs)
    with jax.enable_x64(True):
        as64 = {n: (v if v is None or n in ("segment_ids", "probe") else v.astype(jnp.float64))
                for n, v in inputs.items()}
        # Jitted: op by op the reference cost 3.4-5.4 CPU-s a case, jitted 0.9-1.2 (the
        # values equal to 4e-16).
        want = jax.jit(lambda x: _value_and_grads(reference.attention, case, x, {}))(as64)
        assert want[0].dtype == jnp.float64
    return testing.relative_errors(got, want)


# ----------------------------------------------------------------------------- one per backend


def check_case(attention_fn, case: Case, x64: bool = False) -> None:
    """Output and gradients within the case's tolerance of the float64 reference."""
    errs = errors(attention_fn, case, x64=x64,
                  block_sizes=dict(block_q=case.block_q, block_kv=case.block_kv))
    assert set(errs) >= {"out", "dq", "dk", "dv"} or not case.grads
    bad = {name: err for name, err in errs.items() if not err <= case.tol}
    assert not bad, f"errors above {case.tol}: {bad}"


def lowered_text(kernel_module: ModuleType, kind: str, platform: str, seq: int,
                 head_dim: int) -> str:
    """StableHLO of forward + backward (every feature on) for `platform`, with `kind`'s tiles.

    No device is needed: this checks the Triton / Mosaic lowering of all three kernels.
    """
    b, h, n = 1, 4, 2
    bf16 = jnp.bfloat16
    q = jax.ShapeDtypeStruct((b, seq, h, head_dim), bf16)
    kv = jax.ShapeDtypeStruct((b, seq, n, head_dim), bf16)
    gate = jax.ShapeDtypeStruct((b, seq, h, head_dim), bf16)
    seg = jax.ShapeDtypeStruct((b, seq), jnp.int32)
    sink = jax.ShapeDtypeStruct((h,), jnp.float32)

    def loss(q, k, v, gate, seg, sink):
        static = kernel_module._static(q, k, gate, "sigmoid", seg, True, "learned_sink", False,
                                       None)
        sizes = block_sizes_for(head_dim, None, kind=kind)
        static = dataclasses.replace(static, interpret=False, sizes=tuple(sorted(sizes.items())))
        out = kernel_module._flash(static, q, k, v, seg, gate, sink)
        return jnp.sum(out.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 5)))
    text = grads.trace(q, kv, kv, gate, seg, sink).lower(lowering_platforms=(platform,)).as_text()
    # the GPU backward adds dq atomically inside the dk/dv kernel unless told to split it
    split = not getattr(kernel_module, "DQ_BY_ATOMICS", False)
    for kernel in ("gated_flash_fwd", "gated_flash_dkv") + (("gated_flash_dq",) * split):
        assert kernel in text
    assert ("gated_flash_dq" in text) == split
    return text


def check_refusals(attention_fn: Callable) -> None:
    """Bad block sizes and unequal query / key lengths are refused with a clear message."""
    q = jnp.zeros((1, 16, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="block_sizes\\['block_q'\\]"):
        attention_fn(q, q, q, block_sizes=dict(block_q=24))
    with pytest.raises(ValueError, match="unknown key 'block_x'"):
        attention_fn(q, q, q, block_sizes=dict(block_x=16))
    k = jnp.zeros((1, 32, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        attention_fn(q, k, k)


# ----------------------------------------------------------------------------- TPU targets


@functools.cache
def tpu_topology(name: str):
    """A deviceless TPU topology (libtpu), e.g. "v5e:2x2": real Mosaic compiles on a CPU.

    Several processes on one machine may load libtpu for compiling only; without this switch
    the second one fails on libtpu's lock file.
    """
    from jax.experimental import topologies

    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    topology = topologies.get_topology_desc(topology_name=name, platform="tpu")
    distributed.clear_libtpu_placeholders()  # later tests' subprocesses are no pod workers
    return topology


def tpu_compiled_text(topology: str, *, impl: str = "pallas_tpu", normalizer: str = "softmax",
                      gate: str | None = "elementwise", activation: str = "sigmoid",
                      segments: bool = True, heads: int = 4, kv_heads: int = 2,
                      seq: int = 1024, head_dim: int = 128, grads: bool = True,
                      **attention_kwargs) -> str:
    """Optimized HLO of `ops.attention` (forward, or forward + backward) compiled for a TPU.

    Batch one sequence per chip, split over the mesh's data axis, as a training step has it;
    tile sizes and interpret mode resolve for the TPU target (compiling_for), not the host.
    """
    devices = tpu_topology(topology).devices
    mesh = sharding.create_mesh(dict(data=len(devices), fsdp=1, tensor=1, expert=1),
                                devices=devices)
    batch = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data"))
    whole = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    b, bf16 = len(devices), jnp.bfloat16
    gate_shape = {"elementwise": (b, seq, heads, head_dim), "headwise": (b, seq, heads)}
    args = dict(
        q=jax.ShapeDtypeStruct((b, seq, heads, head_dim), bf16, sharding=batch),
        k=jax.ShapeDtypeStruct((b, seq, kv_heads, head_dim), bf16, sharding=batch),
        v=jax.ShapeDtypeStruct((b, seq, kv_heads, head_dim), bf16, sharding=batch),
        gate=(jax.ShapeDtypeStruct(gate_shape[gate], bf16, sharding=batch) if gate else None),
        segment_ids=(jax.ShapeDtypeStruct((b, seq), jnp.int32, sharding=batch)
                     if segments else None),
        sink_logits=(jax.ShapeDtypeStruct((heads,), jnp.float32, sharding=whole)
                     if normalizer == "learned_sink" else None),
    )

    def loss(args):
        out = ops.attention(args["q"], args["k"], args["v"], gate=args["gate"],
                            segment_ids=args["segment_ids"], sink_logits=args["sink_logits"],
                            gate_activation=activation, normalizer=normalizer, impl=impl,
                            **attention_kwargs)
        return jnp.sum(out.astype(jnp.float32))

    differentiable = {n: x for n, x in args.items() if n != "segment_ids"}

    def step(args):
        if not grads:
            return loss(args)
        return jax.grad(lambda d: loss({**args, **d}))(
            {n: args[n] for n in differentiable if args[n] is not None})

    with ops.compiling_for("tpu"), jax.set_mesh(mesh):
        compiled = jax.jit(step).lower(args).compile()
    return compiled.as_text()
