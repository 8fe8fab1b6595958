"""q_proj and the G1 gate's projection run as a pair (layers/paired_projection.py): values and
gradients against float64 numpy (the pair's formulas by hand, and the whole G1 attention layer
by central differences of the numpy layer)."""

import jax
import jax.numpy as jnp
import layer_params
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx

from gated_attention.model.layers.attention import Attention
from gated_attention.model.layers.paired_projection import paired_projection
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.variants import VARIANTS

pytestmark = pytest.mark.reference("independent")  # float64 numpy


def test_pair_matches_float64_values_and_gradients():
    rng = np.random.default_rng(0)
    x, w_q, w_g = rng.normal(size=(2, 5, 12)), rng.normal(size=(12, 3, 4)), \
        rng.normal(size=(12, 3, 4))
    dq, dg = rng.normal(size=(2, 5, 3, 4)), rng.normal(size=(2, 5, 3, 4))
    f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
    (q, g), vjp = jax.vjp(paired_projection, f32(x), f32(w_q), f32(w_g))
    dx, dw_q, dw_g = vjp((f32(dq), f32(dg)))

    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(q, np.einsum("bsD,Dhd->bshd", x, w_q), **tol)
    np.testing.assert_allclose(g, np.einsum("bsD,Dhd->bshd", x, w_g), **tol)
    want_dx = np.einsum("bshd,Dhd->bsD", dq, w_q) + np.einsum("bshd,Dhd->bsD", dg, w_g)
    np.testing.assert_allclose(dx, want_dx, **tol)
    np.testing.assert_allclose(dw_q, np.einsum("bsD,bshd->Dhd", x, dq), **tol)
    np.testing.assert_allclose(dw_g, np.einsum("bsD,bshd->Dhd", x, dg), **tol)


def test_g1_layer_gradients_match_float64_central_differences():
    """The layer's gradient along random directions of x, q_proj and the gate's kernel (the
    three the pair's backward forms) against the float64 numpy layer's central differences."""
    variant = VARIANTS["g1_sdpa_elementwise"]
    cfg = ModelConfig(vocab_size=32, num_layers=1, d_model=16, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=32, variant=variant)
    module = layer_params.build(Attention, cfg)
    params = {path[0]: value for path, value in layer_params.randomise(module, 1).items()}
    assert module.gate.plain_kernel(cfg.d_model) is not None  # the paired path is the one run
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 7, 16))
    positions = np.tile(np.arange(7), (2, 1))
    probe = rng.normal(size=(2, 7, 16))

    def numpy_loss(x_, q_proj, gate):
        out = ref.attention_layer(x_, {**params, "q_proj": q_proj, "gate": gate},
                                  variant.to_dict(), positions=positions)
        return float(np.sum(out * probe))

    def jax_loss(layer, x_):
        return jnp.sum(layer(x_, jnp.asarray(positions)) * jnp.asarray(probe, jnp.float32))

    d_layer, d_x = nnx.grad(jax_loss, argnums=(0, 1))(module, jnp.asarray(x, jnp.float32))
    grads = [d_x, d_layer["q_proj"][...], d_layer["gate"]["kernel"][...]]
    point = [x, params["q_proj"], params["gate"]]
    eps = 1e-5
    for seed in range(3):
        directions = [np.random.default_rng(10 + seed).normal(size=a.shape) for a in point]
        want = (numpy_loss(*(a + eps * u for a, u in zip(point, directions)))
                - numpy_loss(*(a - eps * u for a, u in zip(point, directions)))) / (2 * eps)
        got = sum(float(np.sum(np.asarray(g, np.float64) * u))
                  for g, u in zip(grads, directions))
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-4)
