"""Switch-Head k/v projections (Table 6) and the sandwich-norm block (Table 2) against the
float64 numpy formulas of tests/numpy_reference.py: values, and input gradients against
central differences of the same formulas. The layers run in float32, as users run them."""

import jax
import jax.numpy as jnp
import layer_params
import numpy as np
import numpy_reference as ref
import pytest

from gated_attention.model.layers.attention import Attention
from gated_attention.model.layers.block import DecoderBlock
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.variants import VARIANTS

pytestmark = pytest.mark.reference("independent")

B, S, D = 1, 5, 16


def tiny_cfg(name: str) -> ModelConfig:
    return ModelConfig(vocab_size=32, num_layers=1, d_model=D, num_heads=4, num_kv_heads=2,
                       head_dim=8, mlp_dim=24, variant=VARIANTS[name])


def inputs(seed: int):
    x = np.random.default_rng(seed).normal(size=(B, S, D))
    positions = np.tile(np.arange(S), (B, 1))
    return x, positions


def value_and_input_grad(module, x, positions, probe):
    """Output and d<out, probe>/dx of the float32 module."""
    def scalar(x32):
        out = module(x32, jnp.asarray(positions))
        out = out[0] if isinstance(out, tuple) else out
        return jnp.sum(out * probe), out

    (_, out), grad = jax.value_and_grad(scalar, has_aux=True)(jnp.asarray(x, jnp.float32))
    return np.asarray(out, np.float64), np.asarray(grad, np.float64)


def switch_params(flat: dict[tuple, np.ndarray]) -> dict:
    params = {}
    for path, value in flat.items():
        if path[0] in ("k_proj", "v_proj") and len(path) == 2:  # a Switch-Head projection
            params.setdefault(path[0], {})[path[1]] = value
        else:
            params[path[0]] = value
    return params


@pytest.mark.parametrize("name, experts", [("switch_kv_8top8", 8), ("switch_kv_4top4", 4),
                                           ("switch_v_8top2", 8)])
def test_switch_head_attention_matches_numpy(name, experts):
    variant = VARIANTS[name]
    module = layer_params.build(Attention, tiny_cfg(name))  # every parameter randomised
    params = switch_params(layer_params.randomise(module, seed=1))
    assert params["v_proj"]["experts"].shape == (experts, D, 2, 8)
    x, positions = inputs(seed=2)
    probe = np.random.default_rng(3).normal(size=(B, S, D))
    got, got_grad = value_and_input_grad(module, x, positions, jnp.asarray(probe, jnp.float32))

    def want_fn(x64):
        return ref.switch_attention_layer(x64, params, top_k=variant.switch_top_k,
                                          switch_target=variant.switch_target,
                                          positions=positions)

    want = want_fn(x)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    if variant.switch_top_k == variant.switch_experts:  # smooth: central differences apply
        want_grad = ref.numerical_gradient(lambda z: float(np.sum(want_fn(z) * probe)), x)
        np.testing.assert_allclose(got_grad, want_grad, rtol=2e-3, atol=2e-4)
    # Negative control: plain (non-switch) k with the first expert's weights differs, so the
    # comparison above sees the mixture of experts on k (kv) or only on v.
    plain = dict(params, k_proj=params["v_proj"]["experts"][0])
    if variant.switch_target == "kv":
        assert np.abs(ref.switch_attention_layer(
            x, plain, top_k=variant.switch_top_k, switch_target="v",
            positions=positions) - got).max() > 1e-2


def block_params(flat: dict[tuple, np.ndarray]) -> dict:
    params = {"attention": {}}
    for path, value in flat.items():
        if path[0] == "attention":
            params["attention"][path[1]] = value
        elif path[0] == "ffn":
            params.setdefault("ffn_parts", {})[path[1]] = value
        else:
            params[path[0]] = value  # attn_norm, ffn_norm, post_*_norm: (name, "scale")
    parts = params.pop("ffn_parts")
    params["ffn"] = (parts["gate_proj"], parts["up_proj"], parts["down_proj"])
    return params


def test_sandwich_norm_block_matches_numpy():
    variant = VARIANTS["baseline_sandwich_norm"]
    module = layer_params.build(DecoderBlock, tiny_cfg("baseline_sandwich_norm"))
    params = block_params(layer_params.randomise(module, seed=4))
    assert {"post_attn_norm", "post_ffn_norm"} <= set(params)
    x, positions = inputs(seed=5)
    x = 3.0 * x  # a residual stream larger than one, so normalising the branches matters
    probe = np.random.default_rng(6).normal(size=(B, S, D))
    got, got_grad = value_and_input_grad(module, x, positions, jnp.asarray(probe, jnp.float32))

    def want_fn(z, sandwich_norm=True):
        return ref.decoder_block(z, params, variant.to_dict(), positions=positions,
                                 sandwich_norm=sandwich_norm)

    np.testing.assert_allclose(got, want_fn(x), rtol=2e-4, atol=2e-4)
    want_grad = ref.numerical_gradient(lambda z: float(np.sum(want_fn(z) * probe)), x)
    np.testing.assert_allclose(got_grad, want_grad, rtol=2e-3, atol=2e-3)
    # Negative control: the same weights without the two post-branch norms differ.
    assert np.abs(want_fn(x, sandwich_norm=False) - got).max() > 1e-1
