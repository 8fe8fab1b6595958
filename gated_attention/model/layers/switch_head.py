"""Switch-Head projections (Csordas et al., 2023), the paper's Table 6 baseline.

Each kv head's value (or key) projection is a mixture of E expert projections. A router
(linear map of X, then sigmoid) scores the experts per token and head, the top-k are kept
and the projection is the score-weighted sum of the selected experts' outputs. With E = 1,
top-1 this is exactly a headwise sigmoid gate on the value projection (G2 headwise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.layers.params import cast, param


class SwitchHeadProjection(nnx.Module):
    def __init__(self, d_model: int, kv_heads: int, head_dim: int, num_experts: int, top_k: int,
                 *, rngs: nnx.Rngs, dtype: jnp.dtype = jnp.float32):
        self.top_k = top_k
        self.num_experts = num_experts
        self.dtype = dtype
        self.experts = param(rngs, (num_experts, d_model, kv_heads, head_dim),
                             ("switch_expert", "embed", "kv_heads", "head_dim"))
        self.router = param(rngs, (d_model, kv_heads, num_experts),
                            ("embed", "kv_heads", "switch_expert"))

    def router_scores(self, x: jax.Array) -> jax.Array:
        """Sigmoid expert scores [b, s, kv_heads, E], zero outside each head's top-k."""
        logits = jnp.einsum("bsD,DkE->bskE", x.astype(self.dtype), cast(self.router, self.dtype))
        scores = jax.nn.sigmoid(logits.astype(jnp.float32))
        if self.top_k < self.num_experts:
            kth = jax.lax.top_k(scores, self.top_k)[0][..., -1:]
            scores = jnp.where(scores >= kth, scores, 0.0)
        return scores

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        per_expert = jnp.einsum("bsD,EDkd->bskEd", x, cast(self.experts, self.dtype))
        scores = self.router_scores(x).astype(self.dtype)
        return jnp.einsum("bskEd,bskE->bskd", per_expert, scores)
