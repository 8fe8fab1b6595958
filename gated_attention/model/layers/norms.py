"""RMSNorm, plain (`x_hat * w`, w=1) or zero-centred (`x_hat * (1 + w)`, w=0, as Qwen3-Next)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.layers.params import param
from gated_attention.model.layers.rope import apply_rope


def inverse_rms(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """1 / rms(x) over the last axis (kept, size 1), in float32."""
    x32 = x.astype(jnp.float32)
    return jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)


def rms_normalize(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """x / rms(x) over the last axis, in float32; the parameter-free core of RMSNorm."""
    return x.astype(jnp.float32) * inverse_rms(x, eps)


class RMSNorm(nnx.Module):
    def __init__(self, dim: int, *, rngs: nnx.Rngs, eps: float = 1e-6, zero_centred: bool = False,
                 axis_name: str = "embed"):
        self.eps = eps
        self.zero_centred = zero_centred
        self.scale = param(rngs, (dim,), (axis_name,), init="zeros" if zero_centred else "ones")

    def weight(self) -> jax.Array:
        """The per-channel multiplier (1 + scale when zero-centred)."""
        return 1.0 + self.scale[...] if self.zero_centred else self.scale[...]

    def __call__(self, x: jax.Array) -> jax.Array:
        return (rms_normalize(x, self.eps) * self.weight()).astype(x.dtype)

    def normalize_and_rotate(self, x: jax.Array, positions: jax.Array, **rope: object
                             ) -> jax.Array:
        """`apply_rope(self(x), positions, **rope)` in float32 with one rounding to x's dtype
        (QK-norm then RoPE): no float32 copy of x between the two in the compiled step."""
        return apply_rope(x, positions, channel_scale=self.weight(),
                          row_scale=inverse_rms(x, self.eps), **rope)
