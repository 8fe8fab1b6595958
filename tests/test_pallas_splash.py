"""impl="splash" (jax's splash attention + the gate after it): values and gradients against the
float64 reference in TPU interpret mode, and real Mosaic compiles for TPU targets.

Interpret mode is slow (about 5 s a case on one core), so each case covers several features:
normaliser (sink kinds) x gate kind x activation x segments x causal x GQA x padding x dtype.
"""

import flash_cases
import jax
import jax.numpy as jnp
import pytest
from flash_cases import Case
from jax.experimental.pallas import tpu as pltpu

from gated_attention import ops
from gated_attention.ops import splash

CASES = [
    # Learned sink (and its gradient), elementwise sigmoid gate, packed segments, GQA 2,
    # length 37 padded to 128.
    Case("learned_sink", "elementwise", "sigmoid", seq=37, heads=4, kv_heads=2),
    # Off-by-one (a zero sink), headwise silu gate, bidirectional with no segment ids (the
    # padding gets a segment of its own), GQA 4, bfloat16.
    Case("softmax_off_by_one", "headwise", "silu", segments=False, causal=False, seq=33,
         heads=4, kv_heads=1, dtype="bfloat16"),
]


def _kernel(q, k, v, **kwargs):
    with pltpu.force_tpu_interpret_mode():
        return ops.attention(q, k, v, impl="splash", interpret=True, **kwargs)


def _fused_backward_kernel(q, k, v, **kwargs):
    return _kernel(q, k, v, splash_fused_backward=True, **kwargs)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_matches_float64_reference(case: Case):
    """The default backward: dq in its own kernel."""
    flash_cases.check_case(_kernel, case)


def test_fused_backward_matches_float64_reference():
    """splash_fused_backward=True: dq, dk and dv from one kernel (the sink's gradient too)."""
    flash_cases.check_case(_fused_backward_kernel, CASES[0])


# Between them: every normaliser splash serves, every gate kind, segments or not, causal or
# not, GQA 1 / 2 / 4, on each TPU generation. About 2 s each on one core.
TPU_COMPILES = [
    ("v5e:2x2", dict(normalizer="softmax", gate="elementwise", segments=True, kv_heads=2)),
    ("v5p:2x2x1", dict(normalizer="learned_sink", gate="headwise", activation="silu",
                       segments=False, kv_heads=1)),
    ("v6e:2x2", dict(normalizer="softmax_off_by_one", gate=None, causal=False, kv_heads=4,
                     seq=640)),
]


@pytest.mark.needs("libtpu")
@pytest.mark.parametrize("topology, features", TPU_COMPILES,
                         ids=[f"{t}-{f['normalizer']}" for t, f in TPU_COMPILES])
def test_compiles_for_tpu_generations(topology: str, features: dict):
    text = flash_cases.tpu_compiled_text(topology, impl="splash", **features)
    assert "tpu_custom_call" in text
    assert "splash" in text
    assert "gated_flash" not in text  # the project's own kernel is not what ran


@pytest.mark.needs("libtpu")
def test_backward_kernels_compiled_for_tpu_are_the_ones_asked_for():
    """The default backward compiles a dq kernel and a dk/dv kernel; the fused one a single
    kernel for all three (no dq kernel)."""
    split = flash_cases.tpu_compiled_text("v5p:2x2x1", impl="splash")
    fused = flash_cases.tpu_compiled_text("v5p:2x2x1", impl="splash",
                                          splash_fused_backward=True)
    assert "splash_mha_dq" in split and "splash_mha_dkv" in split
    assert "splash_mha_dq" not in fused and "splash_mha_dkv" in fused


def test_splash_fused_backward_must_be_a_bool():
    q = jnp.zeros((1, 128, 2, 128), jnp.float32)
    with pytest.raises(ValueError, match="splash_fused_backward must be True or False, not 'yes'"):
        ops.attention(q, q, q, impl="splash", splash_fused_backward="yes")


def test_refuses_what_splash_cannot_do():
    q = jnp.zeros((1, 16, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="impl='splash' supports normalizer in"):
        splash.attention(q, q, q, normalizer="softpick")
    k = jnp.zeros((1, 32, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        splash.attention(q, k, k)
    with jax.enable_x64(True), pytest.raises(ValueError, match="jax_enable_x64"):
        splash.attention(q, q, q)


def test_tile_divides_the_padded_length():
    assert [splash.tile(n) for n in (128, 256, 384, 512, 640, 4096)] == \
        [128, 256, 128, 512, 128, 512]
    assert splash.tile(4096, preferred=256) == 256
