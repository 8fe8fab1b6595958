"""What checking an attention kernel needs, kept beside the kernels: random inputs, packed
segment ids, the gradient probe and relative errors.

The kernel tests (tests/flash_cases.py) and the benchmark's `--check` (benchmarks/attention.py)
both use it, as jax keeps its Pallas ops' test helpers and MaxText its kernel checks next to
the kernels: one definition of "the error of a kernel" for the suite and for a GPU or TPU.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from gated_attention.ops import cpu_compile

# Interpret-mode kernels are big XLA programs, compiled to run once: cheap compiles
# (gated_attention/ops/cpu_compile.py) change no numerics the checks' tolerances could see.
FAST_COMPILE = cpu_compile.options()
DIFFERENTIABLE = ("q", "k", "v", "gate", "sink")  # the inputs a check takes gradients of


def random_segment_ids(rng: np.random.Generator, batch: int, seq: int) -> np.ndarray:
    """[batch, seq] sorted ids, 2-4 packed documents of random lengths per row."""
    rows = []
    for _ in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq), size=rng.integers(1, 4), replace=False))
        rows.append(np.searchsorted(cuts, np.arange(seq), side="right"))
    return np.stack(rows).astype(np.int32)


def packed_segment_ids(batch: int, seq: int, documents: int) -> np.ndarray:
    """[batch, seq] ids of `documents` equal-length packed documents per row."""
    return np.broadcast_to(np.arange(seq, dtype=np.int32) // -(-seq // documents), (batch, seq))


def random_inputs(rng: np.random.Generator, *, batch: int, seq: int, heads: int,
                  kv_heads: int, head_dim: int, gate: str | None, segments: bool,
                  dtype: Any, sink: bool = False, probe_dtype: Any = jnp.float32
                  ) -> dict[str, jax.Array | None]:
    """q, k, v, gate, sink logits, segment ids and the probe (the linear loss's weights),
    drawn in that order from `rng`; absent ones are None and draw nothing.

    `gate` is None, "elementwise" ([b, s, h, d]) or "headwise" ([b, s, h]).
    """
    def normal(*shape: int, as_dtype: Any = dtype) -> jax.Array:
        return jnp.asarray(rng.standard_normal(shape), as_dtype)

    gate_shape = {"elementwise": (batch, seq, heads, head_dim), "headwise": (batch, seq, heads),
                  None: None}[gate]
    q = normal(batch, seq, heads, head_dim)
    k, v = normal(batch, seq, kv_heads, head_dim), normal(batch, seq, kv_heads, head_dim)
    return dict(
        q=q, k=k, v=v, gate=None if gate_shape is None else normal(*gate_shape),
        sink=normal(heads, as_dtype=jnp.float32) if sink else None,
        segment_ids=jnp.asarray(random_segment_ids(rng, batch, seq)) if segments else None,
        probe=normal(batch, seq, heads, head_dim, as_dtype=probe_dtype),
    )


def probe_vjp(forward: Callable[[dict], jax.Array], diff: Mapping[str, jax.Array],
              probe: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(out in the probe's dtype, gradients of sum(out * probe) w.r.t. `diff`): one vjp with
    a random cotangent checks every gradient path at once, where sum(out) would not."""
    out, vjp = jax.vjp(lambda d: forward(d).astype(probe.dtype), dict(diff))
    return out, vjp(probe)[0]


def relative_error(x: jax.Array, ref: jax.Array) -> float:
    """max |x - ref| / max |ref|, in float64; non-finite values fail."""
    x, ref = np.asarray(x, np.float64), np.asarray(ref, np.float64)
    assert np.all(np.isfinite(x)), "non-finite values"
    return float(np.max(np.abs(x - ref)) / max(np.max(np.abs(ref)), 1e-30))


def relative_errors(got: tuple[jax.Array, Mapping[str, jax.Array]],
                    want: tuple[jax.Array, Mapping[str, jax.Array]]) -> dict[str, float]:
    """relative_error of the output ("out") and of each gradient ("dq", "dk", ...)."""
    (out, grads), (ref_out, ref_grads) = got, want
    errors = {"out": relative_error(out, ref_out)}
    errors.update({f"d{name}": relative_error(grads[name], ref_grads[name]) for name in grads})
    return errors
