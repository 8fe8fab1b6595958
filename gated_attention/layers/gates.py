"""The gate of the paper, `Y' = Y (op) act(X W)`, for every position G1-G5 and every axis.

One module interprets every gate field of `AttentionVariant`:
- granularity: elementwise scores [.., heads, d] or headwise scores [.., heads];
- sharing: head_specific, or head_shared (the elementwise logits averaged over heads, so the
  parameter count stays that of the head-specific gate);
- gate_input: "hidden" (X W, X = the block's normalised input) or "constant" (a learned theta,
  zero-initialised, input-independent);
- combine: multiply (`Y * act`) or add (`Y + act`); activation from ops.gating.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.layers.params import cast, param
from gated_attention.ops.gating import gate_activation
from gated_attention.variants import AttentionVariant


class Gate(nnx.Module):
    """Gate for a tensor Y of shape [b, s, heads, d] (G1-G4) or [b, s, D] (G5, heads=None)."""

    def __init__(self, variant: AttentionVariant, d_model: int, *, heads: int | None,
                 head_dim: int | None, heads_axis: str = "heads", rngs: nnx.Rngs,
                 dtype: jnp.dtype = jnp.float32):
        self.variant = variant
        self.dtype = dtype
        self.per_head = heads is not None
        if self.per_head:
            if variant.granularity == "elementwise":
                shape, names = (heads, head_dim), (heads_axis, "head_dim")
            else:
                shape, names = (heads,), (heads_axis,)
        else:
            shape, names = (d_model,), ("embed_out",)
        if variant.gate_input == "constant":
            self.theta = param(rngs, shape, names, init="zeros")
        else:
            self.kernel = param(rngs, (d_model, *shape), ("embed", *names))

    def logits(self, x: jax.Array) -> jax.Array:
        """Pre-activation scores: [b, s, heads, d] / [b, s, heads] / [b, s, D]."""
        if self.variant.gate_input == "constant":
            theta = self.theta[...].astype(jnp.float32)
            return jnp.broadcast_to(theta, (*x.shape[:2], *theta.shape))
        kernel = cast(self.kernel, self.dtype)
        x = x.astype(self.dtype)
        if not self.per_head:
            return jnp.einsum("bsD,DE->bsE", x, kernel)
        if kernel.ndim == 3:
            logits = jnp.einsum("bsD,Dhd->bshd", x, kernel)
            if self.variant.sharing == "head_shared":
                shared = jnp.mean(logits.astype(jnp.float32), axis=2, keepdims=True)
                logits = jnp.broadcast_to(shared, logits.shape).astype(logits.dtype)
            return logits
        return jnp.einsum("bsD,Dh->bsh", x, kernel)

    def scores(self, x: jax.Array) -> jax.Array:
        """act(X W) in float32: what analysis calls the gate score."""
        return gate_activation(self.variant.activation)(self.logits(x).astype(jnp.float32))

    def __call__(self, y: jax.Array, x: jax.Array) -> jax.Array:
        """Apply the gate computed from x to y."""
        scores = self.scores(x)
        if self.per_head and scores.ndim == y.ndim - 1:
            scores = scores[..., None]
        y32 = y.astype(jnp.float32)
        out = y32 * scores if self.variant.combine == "multiply" else y32 + scores
        return out.astype(y.dtype)
