"""The shared expert of Qwen3-Next / Qwen3.5-MoE layers: `sigmoid(x w_g) * SwiGLU(x)`, added to
the routed experts' output. Every token uses it, so it is a dense SwiGLU (not tagged "expert")
behind a one-logit sigmoid gate per token.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.layers.mlp import SwiGLU
from gated_attention.model.layers.params import cast, param


class SharedExpert(nnx.Module):
    def __init__(self, d_model: int, mlp_dim: int, *, rngs: nnx.Rngs,
                 dtype: jnp.dtype = jnp.float32):
        self.dtype = dtype
        self.ffn = SwiGLU(d_model, mlp_dim, rngs=rngs, dtype=dtype)
        self.gate = param(rngs, (d_model,), ("embed",))

    def __call__(self, x: jax.Array) -> jax.Array:
        logit = jnp.einsum("bsD,D->bs", x.astype(self.dtype), cast(self.gate, self.dtype))
        return self.ffn(x) * jax.nn.sigmoid(logit.astype(jnp.float32))[..., None].astype(x.dtype)
