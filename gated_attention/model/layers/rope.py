"""Rotary position embedding (half-split layout, as in Qwen3/Llama) with context-extension scaling
and partial rotary (only the first channels of each head rotated, as in Qwen3-Next).

A RoPE is fixed by its inverse frequencies `inv_freq[i]` (one per pair of channels i and
i + d/2) and an attention factor that multiplies cos and sin. Raising the base and the four
scalings below only change those two things, which is why they live in one small dataclass:
"none" (plain RoPE), "linear" (position interpolation), "ntk" (static NTK-aware base change)
and "yarn" (NTK-by-parts ramp plus attention temperature). The definitions follow HF
transformers' `modeling_rope_utils` and the YaRN paper (arXiv 2309.00071); docs/long_context.md
gives the formulas.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from gated_attention.core.errors import UserError

ROPE_SCALING_TYPES = ("none", "linear", "ntk", "yarn")


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """How RoPE frequencies are stretched beyond the training length (`model.rope_scaling`).

    factor: target length / original length (1.0 = no change).
    original_max_position: the length the model was trained at (YaRN's ramp needs it).
    beta_fast, beta_slow: YaRN's ramp bounds, in rotations over the original length.
    attention_factor: YaRN's cos/sin multiplier; 0.0 means YaRN's default 0.1 ln(factor) + 1.
    """

    type: str = "none"
    factor: float = 1.0
    original_max_position: int = 0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 0.0

    def __post_init__(self) -> None:
        field = "model.rope_scaling"
        if self.type not in ROPE_SCALING_TYPES:
            raise UserError(f"{field}.type={self.type!r} is not allowed; choose one of "
                            f"{', '.join(ROPE_SCALING_TYPES)}")
        if not self.factor >= 1.0:
            raise UserError(f"{field}.factor={self.factor} must be >= 1 (target length / "
                            "original length)")
        if self.original_max_position < 0:
            raise UserError(f"{field}.original_max_position={self.original_max_position} "
                            "must be >= 0")
        if self.type == "yarn" and self.original_max_position <= 0:
            raise UserError(f"{field}.original_max_position must be > 0 for type='yarn' (the "
                            f"length the model was trained at); got {self.original_max_position}")
        if not 0 < self.beta_slow < self.beta_fast:
            raise UserError(f"{field}.beta_fast={self.beta_fast} and beta_slow="
                            f"{self.beta_slow} must satisfy 0 < beta_slow < beta_fast")
        if self.attention_factor < 0:
            raise UserError(f"{field}.attention_factor={self.attention_factor} must be >= 0 "
                            "(0 = YaRN's default 0.1 ln(factor) + 1)")

    def to_dict(self) -> dict[str, float | int | str]:
        return dataclasses.asdict(self)


NO_SCALING = RopeScaling()


def yarn_correction_range(scaling: RopeScaling, head_dim: int, base: float) -> tuple[int, int]:
    """Pair indices (low, high) between which YaRN's ramp goes from extrapolation to interpolation.

    A pair i turns `r` times over the original length L when i = d ln(L / (2 pi r)) / (2 ln base);
    beta_fast rotations give the low bound (floored), beta_slow the high bound (ceiled).
    """
    def pair_for(rotations: float) -> float:
        length = scaling.original_max_position
        return head_dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(pair_for(scaling.beta_fast))
    high = math.ceil(pair_for(scaling.beta_slow))
    return max(low, 0), min(high, head_dim - 1)


def inverse_frequencies(head_dim: int, base: float = 10_000.0,
                        scaling: RopeScaling = NO_SCALING) -> np.ndarray:
    """inv_freq [head_dim / 2] in float64: the angle per position of each channel pair."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float64) / head_dim  # 2i / d
    if scaling.type == "ntk":
        base = base * scaling.factor ** (head_dim / (head_dim - 2))
    inv_freq = base ** -exponents
    if scaling.type == "linear":
        return inv_freq / scaling.factor
    if scaling.type == "yarn":
        low, high = yarn_correction_range(scaling, head_dim, base)
        if low == high:
            high += 0.001  # as upstream: avoid a zero-width ramp
        ramp = np.clip((np.arange(head_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolate = 1.0 - ramp  # 1 for fast pairs (kept), 0 for slow pairs (interpolated)
        return inv_freq / scaling.factor * (1.0 - extrapolate) + inv_freq * extrapolate
    return inv_freq


def attention_factor(scaling: RopeScaling = NO_SCALING) -> float:
    """The multiplier of cos and sin; q.k logits grow by its square (YaRN's 1/t)."""
    if scaling.type != "yarn":
        return 1.0
    if scaling.attention_factor:
        return scaling.attention_factor
    return 0.1 * math.log(scaling.factor) + 1.0


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def rounded_cotangent(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """x unchanged; its cotangent rounded to `dtype` on the way back.

    Between QK-norm and RoPE: the backward then hands the norm's backward the rotated-back
    gradient in the compute dtype (as a norm whose output is stored in that dtype does),
    so the compiler stores no float32 copy of it for the norm's two reductions."""
    return x


def _rounded_cotangent_fwd(x: jax.Array, dtype: jnp.dtype) -> tuple[jax.Array, None]:
    return x, None


def _rounded_cotangent_bwd(dtype: jnp.dtype, _: None, g: jax.Array) -> tuple[jax.Array]:
    return (g.astype(dtype).astype(g.dtype),)


rounded_cotangent.defvjp(_rounded_cotangent_fwd, _rounded_cotangent_bwd)


def apply_rope(x: jax.Array, positions: jax.Array, base: float = 10_000.0,
               scaling: RopeScaling = NO_SCALING, rotary_dim: int | None = None,
               channel_scale: jax.Array | None = None, row_scale: jax.Array | None = None
               ) -> jax.Array:
    """Rotate x [b, s, heads, d] by the angle of each token's position [b, s].

    rotary_dim: rotate only the first rotary_dim channels (half-split within them, frequencies
    computed for rotary_dim as Qwen3-Next's partial rotary does); the rest pass unchanged.
    channel_scale [d] and row_scale [b, s, heads, 1] multiply x first (QK-norm's weight and
    1 / rms, `RMSNorm.normalize_and_rotate`). All in float32 from x's channel slices, rounded
    once: the compiler then fuses the norm into the rotation and stores no float32 copy of q
    or k.
    """
    d = x.shape[-1]
    rotary_dim = d if rotary_dim is None else rotary_dim
    inv_freq = jnp.asarray(inverse_frequencies(rotary_dim, base, scaling), jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [b, s, rotary_dim/2]
    mscale = attention_factor(scaling)
    sin = (jnp.sin(angles) * mscale)[:, :, None, :]
    cos = (jnp.cos(angles) * mscale)[:, :, None, :]

    def channels(start: int, stop: int) -> jax.Array:
        part = x[..., start:stop].astype(jnp.float32)
        if row_scale is None and channel_scale is None:
            return part
        if row_scale is not None:
            part = part * row_scale
        if channel_scale is not None:
            part = part * channel_scale[start:stop].astype(jnp.float32)
        return rounded_cotangent(part, x.dtype)

    half = rotary_dim // 2
    x1, x2 = channels(0, half), channels(half, rotary_dim)
    rotated = [x1 * cos - x2 * sin, x2 * cos + x1 * sin]
    if rotary_dim < d:
        rotated.append(channels(rotary_dim, d))
    return jnp.concatenate(rotated, axis=-1).astype(x.dtype)
