"""q_proj and the G1 gate's projection: two matmuls forward, one matmul each way backward.

The official release and Qwen3-Next store the two side by side and run one matmul. Compiled
for a TPU (benchmarks/RESULTS.md, the 1.7B step), the packed forward costs more than it saves:
every reader of q (QK-norm, RoPE) and of the gate is charged the whole packed product. The
backward is where one matmul pays: autodiff of two projections writes the gate's share of
the input gradient as an array of its own and reads the input twice for the weight
gradients, while one product of the concatenated cotangents [dq | d gate] with the
concatenated weights does both at once (the compiler fuses the concatenation into the
matmuls' reads, so it is never stored). The weights are concatenated whole (gathered) so the
backward re-uses the forward's gathered copies instead of gathering a packed one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gated_attention.parallel import sharding

GATHERED = (None, "heads", "head_dim")  # a [embed, heads, head_dim] weight, embed unsplit


@jax.custom_vjp
def paired_projection(x: jax.Array, w_q: jax.Array, w_gate: jax.Array,
                      ) -> tuple[jax.Array, jax.Array]:
    """(x W_q, x W_gate): x [b, s, D]; w_q [D, h, d]; w_gate [D, h, e] -> [b, s, h, d|e]."""
    return (jnp.einsum("bsD,Dhd->bshd", x, w_q), jnp.einsum("bsD,Dhe->bshe", x, w_gate))


def _forward(x: jax.Array, w_q: jax.Array, w_gate: jax.Array):
    return paired_projection(x, w_q, w_gate), (x, w_q, w_gate)


def _backward(residuals, cotangents):
    x, w_q, w_gate = residuals
    dq, dgate = cotangents
    d = w_q.shape[-1]
    dy = jnp.concatenate([dq.astype(x.dtype), dgate.astype(x.dtype)], axis=-1)
    w = jnp.concatenate([sharding.constrain(w_q, GATHERED),
                         sharding.constrain(w_gate, GATHERED)], axis=-1)
    dx = jnp.einsum("bshc,Dhc->bsD", dy, w)
    dw = jnp.einsum("bsD,bshc->Dhc", x, dy)
    return dx, dw[..., :d].astype(w_q.dtype), dw[..., d:].astype(w_gate.dtype)


paired_projection.defvjp(_forward, _backward)
