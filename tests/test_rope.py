"""RoPE base change and scaling (linear, NTK-aware, YaRN) against hand-computed values."""

import math

import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from gated_attention.config import run_config
from gated_attention.model.layers.rope import (
    RopeScaling,
    apply_rope,
    attention_factor,
    inverse_frequencies,
    yarn_correction_range,
)


def rope_with(x, positions, inv_freq, mscale=1.0):
    """Independent numpy RoPE from explicit inverse frequencies, times the attention factor."""
    d = x.shape[-1]
    out = np.empty_like(x)
    for i in range(d // 2):
        theta = positions * inv_freq[i]
        c, s = np.cos(theta)[:, :, None], np.sin(theta)[:, :, None]
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = (a * c - b * s) * mscale
        out[..., i + d // 2] = (b * c + a * s) * mscale
    return out


def _inputs(d=16, s=12):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, s, 3, d))
    positions = np.stack([np.arange(s), np.arange(100, 100 + s)]).astype(np.float64)
    return x, positions


def test_linear_and_ntk_frequencies_by_hand():
    # d=4: exponents 2i/d are 0 and 1/2.
    np.testing.assert_allclose(inverse_frequencies(4, 100.0, RopeScaling("linear", 2.0)),
                               [0.5, 0.05], rtol=1e-12)
    # NTK-aware: base * factor^(d/(d-2)) = 1e4 * 4^2 = 160000, whose square root is 400.
    np.testing.assert_allclose(inverse_frequencies(4, 1e4, RopeScaling("ntk", 4.0)),
                               [1.0, 1 / 400], rtol=1e-12)


def test_yarn_frequencies_and_temperature_by_hand():
    # d=16, base 1e4, trained at 2048, factor 4, betas 32/1:
    # pair(32 rot) = 16 ln(2048 / (64 pi)) / (2 ln 1e4) = 2.016 -> floor 2;
    # pair(1 rot)  = 16 ln(2048 / (2 pi)) / (2 ln 1e4) = 5.026 -> ceil 6.
    yarn = RopeScaling("yarn", 4.0, original_max_position=2048)
    assert yarn_correction_range(yarn, 16, 1e4) == (2, 6)
    # ramp over pairs 0..7 = clip((i - 2) / 4) = [0, 0, 0, .25, .5, .75, 1, 1];
    # inv_freq = base^(-i/8) * ((1 - ramp) + ramp / 4).
    plain = [10 ** (-i / 2) for i in range(8)]
    keep = [1, 1, 1, 0.8125, 0.625, 0.4375, 0.25, 0.25]
    np.testing.assert_allclose(inverse_frequencies(16, 1e4, yarn),
                               [p * k for p, k in zip(plain, keep)], rtol=1e-12)
    assert attention_factor(yarn) == pytest.approx(1.1386294361, abs=1e-9)  # 0.1 ln 4 + 1
    explicit = RopeScaling("yarn", 4.0, original_max_position=2048, attention_factor=1.5)
    assert attention_factor(explicit) == 1.5
    assert attention_factor(RopeScaling("linear", 4.0)) == 1.0


def test_yarn_rotation_carries_the_temperature_on_both_q_and_k():
    x, positions = _inputs()
    yarn = RopeScaling("yarn", 4.0, original_max_position=2048)
    got = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(positions), 1e4, yarn))
    want = rope_with(x, positions, inverse_frequencies(16, 1e4, yarn), 0.1 * math.log(4) + 1)
    np.testing.assert_allclose(got, want, atol=2e-4)
    # q.k logits at equal positions grow by the factor squared (rotation preserves dot products).
    plain = np.asarray(apply_rope(jnp.asarray(x), jnp.asarray(positions), 1e4))
    ratio = np.einsum("bshd,bshd->bsh", got, got) / np.einsum("bshd,bshd->bsh", plain, plain)
    np.testing.assert_allclose(ratio, (0.1 * math.log(4) + 1) ** 2, rtol=1e-4)


def test_base_change_equals_plain_rope_with_the_new_base():
    x, positions = _inputs()
    got = apply_rope(jnp.asarray(x), jnp.asarray(positions), base=1e6)
    np.testing.assert_allclose(np.asarray(got), ref.rope(x, positions, base=1e6), atol=2e-4)


@pytest.mark.parametrize("scaling", [
    RopeScaling("none"), RopeScaling("linear", 1.0), RopeScaling("ntk", 1.0),
    RopeScaling("yarn", 1.0, original_max_position=64),
])
def test_factor_one_is_the_identity(scaling):
    x, positions = _inputs()
    np.testing.assert_allclose(inverse_frequencies(16, 1e4, scaling),
                               [1e4 ** (-2 * i / 16) for i in range(8)], rtol=1e-12)
    assert attention_factor(scaling) == 1.0
    got = apply_rope(jnp.asarray(x), jnp.asarray(positions), 1e4, scaling)
    np.testing.assert_allclose(np.asarray(got), ref.rope(x, positions, base=1e4), atol=2e-4)


def test_config_builds_the_scaling_and_rejects_bad_fields():
    config = run_config.base_config("tiny", "baseline")
    assert run_config.model_config(config).rope_scaling == RopeScaling()
    config.model.rope_base = 1e6
    config.model.rope_scaling.update(dict(type="yarn", factor=8.0, original_max_position=256))
    cfg = run_config.model_config(config)
    assert cfg.rope_base == 1e6
    assert cfg.rope_scaling == RopeScaling("yarn", 8.0, original_max_position=256)
    for changes, message in [
        (dict(type="dynamic"), "model.rope_scaling.type='dynamic' is not allowed"),
        (dict(original_max_position=0), "original_max_position must be > 0"),
        (dict(factor=0.5), "model.rope_scaling.factor=0.5 must be >= 1"),
        (dict(beta_slow=40.0), "beta_slow"),
        (dict(attention_factor=-1.0), "attention_factor"),
    ]:
        bad = run_config.base_config("tiny", "baseline")
        bad.model.rope_scaling.update(dict(type="yarn", factor=8.0, original_max_position=256))
        bad.model.rope_scaling.update(changes)
        with pytest.raises(run_config.ConfigError, match=message.replace("(", r"\(")):
            run_config.model_config(bad)
