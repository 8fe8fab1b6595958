"""The gate of the paper, `Y' = Y (op) act(X W)`, for every position G1-G5 and every axis.

One module interprets every gate field of `AttentionVariant`:
- granularity: elementwise scores [.., heads, d] or headwise scores [.., heads];
- sharing: head_specific, or head_shared (the elementwise logits averaged over heads, so the
  parameter count stays that of the head-specific gate);
- gate_input: "hidden" (X W, X = the block's normalised input) or "constant" (a learned theta,
  zero-initialised, input-independent);
- combine: multiply (`Y * act`) or add (`Y + act`); activation from ops.gating.
Beyond the paper (docs/beyond.md):
- gate_input_dims / gate_input_fraction: the gate reads the first k dimensions of X;
- gate_rank r: W = A B with A [k, r] (normal) and B [r, out] (the gate's init);
- gate_init zeros, gate_scale (2 with sigmoid: 2·sigmoid(0) = 1, the identity at init),
  gate_bias with gate_bias_init: `scale * act(X W + bias)`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.layers.params import cast, param
from gated_attention.model.variants import AttentionVariant
from gated_attention.ops.gating import gate_activation


class Intervention(nnx.Variable):
    """A value set on a trained model to change its computation (never trained or saved)."""


class Gate(nnx.Module):
    """Gate for a tensor Y of shape [b, s, heads, d] (G1-G4) or [b, s, D] (G5, heads=None)."""

    def __init__(self, variant: AttentionVariant, d_model: int, *, heads: int | None,
                 head_dim: int | None, heads_axis: str = "heads", rngs: nnx.Rngs,
                 dtype: jnp.dtype = jnp.float32):
        self.variant = variant
        self.dtype = dtype
        self.per_head = heads is not None
        self.heads = heads or 0
        if self.per_head:
            if variant.granularity == "elementwise":
                shape, names = (heads, head_dim), (heads_axis, "head_dim")
            else:
                shape, names = (heads,), (heads_axis,)
        else:
            shape, names = (d_model,), ("embed_out",)
        self.input_width = (d_model if variant.gate_input == "constant"
                            else variant.gate_input_width(d_model))
        if variant.gate_input == "constant":
            self.theta = param(rngs, shape, names, init="zeros")
        elif variant.gate_rank:
            self.kernel_a = param(rngs, (self.input_width, variant.gate_rank), ("embed", None))
            self.kernel_b = param(rngs, (variant.gate_rank, *shape), (None, *names),
                                  init=variant.gate_init)
        else:
            self.kernel = param(rngs, (self.input_width, *shape), ("embed", *names),
                                init=variant.gate_init)
        # Intervention [heads] (or [D] for G5): scores forced to this value where not NaN.
        self.forced = nnx.data(None)
        if variant.gate_bias:
            self.bias = param(rngs, shape, names, init="zeros")
            self.bias.set_value(self.bias.get_value() + variant.gate_bias_init)

    def plain_kernel(self, d_model: int) -> nnx.Param | None:
        """The kernel W [D, heads, d] when the logits are exactly `X W` (elementwise,
        head-specific, the whole of X, no rank, no bias), else None: such a gate's
        projection can run beside q_proj's (layers/paired_projection.py)."""
        variant = self.variant
        plain = (self.per_head and variant.granularity == "elementwise"
                 and variant.gate_input == "hidden" and not variant.gate_rank
                 and not variant.gate_bias and variant.sharing == "head_specific"
                 and self.input_width == d_model)
        return self.kernel if plain else None

    def logits(self, x: jax.Array) -> jax.Array:
        """Pre-activation scores: [b, s, heads, d] / [b, s, heads] / [b, s, D]."""
        if self.variant.gate_input == "constant":
            theta = self.theta[...].astype(jnp.float32)
            return jnp.broadcast_to(theta, (*x.shape[:2], *theta.shape))
        x = x[..., : self.input_width].astype(self.dtype)
        if self.variant.gate_rank:
            x = jnp.einsum("bsk,kr->bsr", x, cast(self.kernel_a, self.dtype))
            kernel = cast(self.kernel_b, self.dtype)
        else:
            kernel = cast(self.kernel, self.dtype)
        if not self.per_head:
            logits = jnp.einsum("bsD,DE->bsE", x, kernel)
        elif kernel.ndim == 3:
            logits = jnp.einsum("bsD,Dhd->bshd", x, kernel)
        else:
            logits = jnp.einsum("bsD,Dh->bsh", x, kernel)
        if self.variant.gate_bias:
            logits = logits + cast(self.bias, logits.dtype)
        if self.per_head and kernel.ndim == 3 and self.variant.sharing == "head_shared":
            shared = jnp.mean(logits.astype(jnp.float32), axis=2, keepdims=True)
            logits = jnp.broadcast_to(shared, logits.shape).astype(logits.dtype)
        return logits

    def scores(self, x: jax.Array) -> jax.Array:
        """gate_scale * act(X W) in float32: what analysis calls the gate score."""
        scores = gate_activation(self.variant.activation)(self.logits(x).astype(jnp.float32))
        if self.variant.gate_scale != 1.0:
            scores = scores * self.variant.gate_scale
        if self.forced is not None:
            forced = self.forced[...].astype(jnp.float32)
            forced = forced.reshape(forced.shape + (1,) * (scores.ndim - 2 - forced.ndim))
            scores = jnp.where(jnp.isnan(forced), scores, forced)
        return scores

    def __call__(self, y: jax.Array, x: jax.Array) -> jax.Array:
        """Apply the gate computed from x to y."""
        scores = self.scores(x)
        if self.per_head and scores.ndim == y.ndim - 1:
            scores = scores[..., None]
        y32 = y.astype(jnp.float32)
        out = y32 * scores if self.variant.combine == "multiply" else y32 + scores
        return out.astype(y.dtype)
