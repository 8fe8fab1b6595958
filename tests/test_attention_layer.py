"""Every gate position and axis of the attention layer against the numpy formulas."""

import jax.numpy as jnp
import layer_params
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx

from gated_attention.model.layers.attention import Attention
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.variants import BEYOND_PAPER, VARIANTS

# The axes beyond the paper have their own numpy cases (tests/test_beyond_variants.py).
ATTENTION_VARIANTS = [name for name, v in VARIANTS.items()
                      if v.switch_target == "none" and not v.extra_experts
                      and name not in BEYOND_PAPER]


def tiny_cfg(variant, **kw):
    return ModelConfig(vocab_size=32, num_layers=1, d_model=16, num_heads=4, num_kv_heads=2,
                       head_dim=8, mlp_dim=32, variant=variant, **kw)


def randomise(module: nnx.Module, seed: int) -> dict[str, np.ndarray]:
    """Random parameters (layer_params.randomise) keyed by their module's name."""
    return {path[0]: value for path, value in layer_params.randomise(module, seed).items()}


@pytest.mark.parametrize("name", ATTENTION_VARIANTS)
def test_attention_layer_matches_numpy_formula(name):
    variant = VARIANTS[name]
    module = layer_params.build(Attention, tiny_cfg(variant))  # every parameter randomised
    params = randomise(module, seed=1)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 7, 16))
    positions = np.tile(np.arange(7), (2, 1))
    segment_ids = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1]])
    positions[0, 3:] = np.arange(4)
    got = module(jnp.asarray(x, jnp.float32), jnp.asarray(positions),
                 jnp.asarray(segment_ids, jnp.int32))
    want = ref.attention_layer(x, params, variant.to_dict(), positions=positions,
                               segment_ids=segment_ids)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-4, atol=2e-5)


def test_head_shared_gate_is_mean_of_head_logits():
    """Head-shared: one score vector per token, the head-mean of the elementwise logits."""
    module = layer_params.build(Attention, tiny_cfg(VARIANTS["g1_sdpa_head_shared"]))
    params = randomise(module, seed=3)
    x = np.random.default_rng(4).normal(size=(1, 5, 16))
    scores = np.asarray(module.gate.scores(jnp.asarray(x, jnp.float32)))
    logits = np.einsum("bsD,Dhd->bshd", x, params["gate"])
    want = ref.sigmoid(logits.mean(axis=2))  # [b, s, d], the same for every head
    for h in range(4):
        np.testing.assert_allclose(scores[:, :, h], want, rtol=1e-5, atol=1e-6)


def test_gate_parameter_shapes_follow_score_shapes():
    """Score shapes: G1 n x q x d_k, G2/G3 n x k x d_k, G5 n x D, headwise n x q."""
    shapes = {}
    for name in ("g1_sdpa_elementwise", "g2_value_elementwise", "g3_key_elementwise",
                 "g4_query_elementwise", "g5_dense_output", "g1_sdpa_headwise",
                 "g2_value_headwise", "g1_input_independent"):
        module = Attention(tiny_cfg(VARIANTS[name]), rngs=nnx.Rngs(params=0))
        gate = module.gate
        shapes[name] = (gate.theta if hasattr(gate, "theta") else gate.kernel).get_value().shape
    assert shapes == {
        "g1_sdpa_elementwise": (16, 4, 8), "g2_value_elementwise": (16, 2, 8),
        "g3_key_elementwise": (16, 2, 8), "g4_query_elementwise": (16, 4, 8),
        "g5_dense_output": (16, 16), "g1_sdpa_headwise": (16, 4),
        "g2_value_headwise": (16, 2), "g1_input_independent": (4, 8),
    }


def test_input_independent_gate_starts_at_half():
    """theta is zero-initialised, so sigmoid(theta) = 0.5 before training."""
    module = Attention(tiny_cfg(VARIANTS["g1_input_independent"]), rngs=nnx.Rngs(params=0))
    scores = module.gate.scores(jnp.ones((1, 3, 16), jnp.float32))
    np.testing.assert_array_equal(np.asarray(scores), 0.5)


def test_switch_v_1top1_equals_g2_headwise_with_the_same_weights():
    """Table 6: switch v with one expert, top-1, is a headwise sigmoid gate on the values."""
    switch = Attention(tiny_cfg(VARIANTS["switch_v_1top1"]), rngs=nnx.Rngs(params=0))
    gated = Attention(tiny_cfg(VARIANTS["g2_value_headwise"]), rngs=nnx.Rngs(params=0))
    rng = np.random.default_rng(5)
    for name in ("q_proj", "k_proj", "o_proj"):
        value = jnp.asarray(rng.normal(0, 0.3, getattr(gated, name).get_value().shape),
                            jnp.float32)
        getattr(gated, name).set_value(value)
        getattr(switch, name).set_value(value)
    v_weights = jnp.asarray(rng.normal(0, 0.3, (16, 2, 8)), jnp.float32)
    router = jnp.asarray(rng.normal(0, 0.3, (16, 2)), jnp.float32)
    gated.v_proj.set_value(v_weights)
    gated.gate.kernel.set_value(router)
    switch.v_proj.experts.set_value(v_weights[None])
    switch.v_proj.router.set_value(router[..., None])
    # The shapes of the formula cases above (2 x 7 tokens): their op-by-op compiles serve
    # these calls too.
    x = jnp.asarray(rng.normal(size=(2, 7, 16)), jnp.float32)
    positions = jnp.tile(jnp.arange(7), (2, 1))
    np.testing.assert_allclose(switch(x, positions), gated(x, positions), rtol=1e-5, atol=1e-6)


def test_switch_head_keeps_only_top_k_experts():
    module = Attention(tiny_cfg(VARIANTS["switch_v_8top2"]), rngs=nnx.Rngs(params=0))
    x = jnp.asarray(np.random.default_rng(6).normal(size=(1, 4, 16)), jnp.float32)
    scores = np.asarray(module.v_proj.router_scores(x))
    assert scores.shape == (1, 4, 2, 8)
    assert np.all((scores > 0).sum(axis=-1) == 2)
    logits = np.einsum("bsD,DkE->bskE", np.asarray(x), np.asarray(module.v_proj.router[...]))
    top2 = np.sort(ref.sigmoid(logits), axis=-1)[..., -2:]
    np.testing.assert_allclose(np.sort(scores, axis=-1)[..., -2:], top2, rtol=1e-5)
