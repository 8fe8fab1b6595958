"""The G1 output gate in bfloat16 (ops.apply_output_gate): the product rounded as the official
release rounds it, the gradients as precise as a float32 backward, against float64 numpy."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from gated_attention import ops

pytestmark = pytest.mark.reference("independent")  # float64 numpy

BF16_EPS = float(np.finfo(ml_dtypes.bfloat16).eps)  # 2**-7: one rounding is at most half


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


@pytest.mark.parametrize("granularity", ["elementwise", "headwise"])
def test_bfloat16_gate_matches_float64_values_and_gradients(granularity):
    rng = np.random.default_rng(0)
    shape = (2, 16, 4, 8)
    as_bf16 = lambda x: np.asarray(x, ml_dtypes.bfloat16)  # noqa: E731
    out, grad = as_bf16(rng.normal(size=shape)), as_bf16(rng.normal(size=shape))
    gate = as_bf16(rng.normal(size=shape if granularity == "elementwise" else shape[:3]) * 3)

    value, vjp = jax.vjp(lambda o, g: ops.apply_output_gate(o, g, "sigmoid"),
                         jnp.asarray(out), jnp.asarray(gate))
    d_out, d_gate = vjp(jnp.asarray(grad))
    assert value.dtype == d_out.dtype == d_gate.dtype == jnp.bfloat16

    o64, g64, gate64 = (x.astype(np.float64) for x in (out, grad, gate))
    s64 = sigmoid(gate64)
    s64 = s64 if granularity == "elementwise" else s64[..., None]
    want_d_gate = g64 * o64 * s64 * (1 - s64)
    if granularity == "headwise":
        want_d_gate = want_d_gate.sum(-1)
    # value and d_out: the score and the product each rounded once to bfloat16
    np.testing.assert_allclose(np.float64(value), o64 * s64, rtol=BF16_EPS, atol=0)
    np.testing.assert_allclose(np.float64(d_out), g64 * s64, rtol=BF16_EPS, atol=0)
    # d_gate: computed in float32 from the stored values, rounded once (a bfloat16 product
    # g * out rounded before the activation's derivative adds a second rounding: 0.0067
    # relative here, above this bound)
    np.testing.assert_allclose(np.float64(d_gate), want_d_gate, rtol=BF16_EPS / 2 + 1e-6,
                               atol=1e-30)


def test_float32_gate_is_the_float32_product():
    rng = np.random.default_rng(1)
    out, gate = rng.normal(size=(1, 8, 2, 4)), rng.normal(size=(1, 8, 2, 4))
    got = ops.apply_output_gate(jnp.asarray(out, jnp.float32), jnp.asarray(gate, jnp.float32),
                                "sigmoid")
    assert got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), out * sigmoid(gate), rtol=1e-6, atol=1e-7)
