"""Rotary position embedding (half-split layout, as in Qwen3/Llama), configurable base."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotate x [b, s, heads, d] by the angle of each token's position [b, s]."""
    d = x.shape[-1]
    inv_freq = base ** (-jnp.arange(0, d // 2, dtype=jnp.float32) * 2.0 / d)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, s, d/2]
    sin = jnp.sin(angles)[:, :, None, :]
    cos = jnp.cos(angles)[:, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x.dtype)
