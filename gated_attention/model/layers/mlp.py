"""SwiGLU feed-forward: down(silu(x W_gate) * (x W_up)), no biases."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.layers.params import cast, param


class SwiGLU(nnx.Module):
    def __init__(self, d_model: int, mlp_dim: int, *, rngs: nnx.Rngs,
                 dtype: jnp.dtype = jnp.float32):
        self.dtype = dtype
        self.gate_proj = param(rngs, (d_model, mlp_dim), ("embed", "mlp"))
        self.up_proj = param(rngs, (d_model, mlp_dim), ("embed", "mlp"))
        self.down_proj = param(rngs, (mlp_dim, d_model), ("mlp", "embed"))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        gate = jnp.einsum("bsD,DF->bsF", x, cast(self.gate_proj, self.dtype))
        up = jnp.einsum("bsD,DF->bsF", x, cast(self.up_proj, self.dtype))
        return jnp.einsum("bsF,FD->bsD", jax.nn.silu(gate) * up, cast(self.down_proj, self.dtype))
