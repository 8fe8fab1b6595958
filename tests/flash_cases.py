"""Shared checks for the Pallas attention kernels: values and gradients against float64 XLA.

Each case computes the output and the gradients of a random linear loss w.r.t. q, k, v, gate
and sink_logits in one compiled call (interpret-mode kernels compile slowly on CPU, so one
compile per case), and compares them with ops/reference.py run on float64 copies of the same
inputs. Errors are max|kernel - reference| / max|reference| per array.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from gated_attention.data.packing import random_segment_ids
from gated_attention.ops import reference

# Interpret-mode kernels are big XLA programs: skipping the expensive LLVM passes halves the
# compile time and changes no numerics that the tolerances below could see.
FAST_COMPILE = dict(xla_backend_optimization_level=0, xla_llvm_disable_expensive_passes=True)


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
    rng = np.random.default_rng(seed)
    b, s, h, n, d = case.batch, case.seq, case.heads, case.kv_heads, case.head_dim
    dtype = jnp.dtype(case.dtype)
    normal = lambda *shape: jnp.asarray(rng.standard_normal(shape), dtype)  # noqa: E731
    gate_shape = {"elementwise": (b, s, h, d), "headwise": (b, s, h), None: None}[case.gate]
    return dict(
        q=normal(b, s, h, d), k=normal(b, s, n, d), v=normal(b, s, n, d),
        gate=None if gate_shape is None else normal(*gate_shape),
        sink=(jnp.asarray(rng.standard_normal(h), jnp.float32)
              if case.normalizer == "learned_sink" else None),
        segment_ids=jnp.asarray(random_segment_ids(rng, b, s)) if case.segments else None,
        probe=jnp.asarray(rng.standard_normal((b, s, h, d)), jnp.float64),
    )


def _value_and_grads(attention_fn, case: Case, inputs: dict, kwargs: dict):
    names = [n for n in ("q", "k", "v", "gate", "sink") if inputs[n] is not None]

    def loss(diff: dict):
        args = {**{n: inputs[n] for n in ("q", "k", "v", "gate", "sink")}, **diff}
        out = attention_fn(args["q"], args["k"], args["v"], gate=args["gate"],
                           sink_logits=args["sink"], segment_ids=inputs["segment_ids"],
                           gate_activation=case.activation, causal=case.causal,
                           normalizer=case.normalizer, **kwargs)
        return jnp.sum(out.astype(jnp.float64) * inputs["probe"]), out

    diff = {n: inputs[n] for n in names}
    if not case.grads:
        return loss(diff)[1], {}
    (_, out), grads = jax.value_and_grad(loss, has_aux=True)(diff)
    return out, grads


def errors(attention_fn, case: Case, seed: int = 0, **kwargs) -> dict[str, float]:
    """Relative max errors of the output and every gradient vs the float64 reference."""
    inputs = make_inputs(case, seed)
    compiled = jax.jit(lambda x: _value_and_grads(attention_fn, case, x, kwargs)).lower(
        inputs).compile(compiler_options=FAST_COMPILE)
    out, grads = compiled(inputs)
    as64 = {n: (v if v is None or n in ("segment_ids", "probe") else v.astype(jnp.float64))
            for n, v in inputs.items()}
    ref_out, ref_grads = _value_and_grads(reference.attention, case, as64, {})
    result = {"out": _rel(out, ref_out)}
    result.update({f"d{n}": _rel(grads[n], ref_grads[n]) for n in grads})
    return result


def _rel(x: jax.Array, ref: jax.Array) -> float:
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values"
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))
