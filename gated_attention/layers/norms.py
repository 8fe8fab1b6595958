"""RMSNorm, plain (`x_hat * w`, w=1) or zero-centred (`x_hat * (1 + w)`, w=0, as Qwen3-Next)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.layers.params import param


def rms_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / rms(x) over the last axis, in float32; the parameter-free core of RMSNorm."""
    x32 = x.astype(jnp.float32)
    return x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-6, zero_centred: bool = False,
                 axis_name: str = "embed"):
        self.eps = eps
        self.zero_centred = zero_centred
        self.scale = param(rngs, (dim,), (axis_name,), init="zeros" if zero_centred else "ones")

    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.scale[...]
        if self.zero_centred:
            scale = 1.0 + scale
        return (rms_normalize(x, self.eps) * scale).astype(x.dtype)
