"""The whole decoder: every registry name runs, causality, packing, gate parameter counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config.run_config import base_config, model_config
from gated_attention.inspect import count_params
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.transformer import build_model
from gated_attention.model.variants import VARIANTS
from gated_attention.training.losses import cross_entropy


def small_cfg(name: str) -> ModelConfig:
    arch = "tiny_moe" if VARIANTS[name].extra_experts else "tiny"
    config = base_config(arch, name)
    config.model.update(num_layers=1, d_model=32, head_dim=8, mlp_dim=64, vocab_size=64,
                        expert_mlp_dim=16)
    return model_config(config)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_every_variant_runs_forward_and_backward_and_is_causal(name):
    model = build_model(small_cfg(name), seed=0)
    # One row of 12, the packed row's shape below: op by op, the forward's compiles for this
    # shape serve that test too.
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 64, (1, 12)), jnp.int32)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def loss_fn(p, toks):
        logits, aux = nnx.merge(graphdef, p, rest)(toks)
        loss, _ = cross_entropy(logits[:, :-1], toks[:, 1:], jnp.ones_like(toks[:, 1:]))
        aux_loss = sum(aux.get(k, 0.0) for k in ("moe_load_balance_loss", "moe_z_loss"))
        return loss + aux_loss, logits

    (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, tokens)
    assert np.isfinite(float(loss))
    flat = [np.asarray(g) for g in jax.tree.leaves(grads)]
    assert all(np.all(np.isfinite(g)) for g in flat)
    assert sum(float(np.abs(g).sum()) for g in flat) > 0
    changed = tokens.at[:, 7:].set((tokens[:, 7:] + 1) % 64)
    _, logits2 = loss_fn(params, changed)
    np.testing.assert_array_equal(np.asarray(logits[:, :7]), np.asarray(logits2[:, :7]))
    assert np.abs(np.asarray(logits[:, 7:] - logits2[:, 7:])).max() > 0


@pytest.mark.parametrize("name", ["g1_sdpa_elementwise", "g2_value_headwise", "learned_sink"])
def test_packed_sequences_match_separate_sequences(name):
    model = build_model(small_cfg(name), seed=1)
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 64, 5), rng.integers(0, 64, 7)
    packed = jnp.asarray(np.concatenate([a, b])[None], jnp.int32)
    segments = jnp.asarray([[1] * 5 + [2] * 7], jnp.int32)
    positions = jnp.asarray([list(range(5)) + list(range(7))], jnp.int32)
    logits, _ = model(packed, positions=positions, segment_ids=segments)
    alone_a, _ = model(jnp.asarray(a[None], jnp.int32))
    alone_b, _ = model(jnp.asarray(b[None], jnp.int32))
    np.testing.assert_allclose(logits[:, :5], alone_a, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits[:, 5:], alone_b, rtol=1e-5, atol=1e-5)


# Closed forms from docs/method.md: +Param = D x (score width) x layers.
D, L, H, KV, DK = 128, 4, 4, 2, 32  # the tiny arch


@pytest.mark.parametrize("name, added", [
    ("g1_sdpa_elementwise", D * H * DK * L),
    ("g2_value_elementwise", D * KV * DK * L),
    ("g3_key_elementwise", D * KV * DK * L),
    ("g4_query_elementwise", D * H * DK * L),
    ("g5_dense_output", D * D * L),
    ("g1_sdpa_headwise", D * H * L),
    ("g2_value_headwise", D * KV * L),
    ("g1_sdpa_head_shared", D * H * DK * L),
    ("g2_value_head_shared", D * KV * DK * L),
    ("g1_sdpa_additive_silu", D * H * DK * L),
    ("g1_input_independent", H * DK * L),
    ("g1_sdpa_rmsnorm", 0),
    ("g1_sdpa_silu_paramfree", 0),
    ("learned_sink", H * L),
    ("baseline_sandwich_norm", 2 * D * L),
    ("kv_heads_8", 2 * D * KV * DK * L + 0),
    ("q_heads_48", 2 * D * (H // 2) * DK * L),
])
def test_parameters_added_match_closed_form(name, added):
    base = model_config(base_config("tiny", "baseline"))
    cfg = model_config(base_config("tiny", name))
    assert count_params(cfg) - count_params(base) == added


# Table 1's +Param column (millions) for the 15A2B attention shapes: D 2048, q 32, k 4, d 128.
@pytest.mark.parametrize("name, paper_millions", [
    ("g1_sdpa_elementwise", 201), ("g2_value_elementwise", 25), ("g3_key_elementwise", 25),
    ("g4_query_elementwise", 201), ("g5_dense_output", 100), ("g1_sdpa_headwise", 1.6),
    ("g2_value_headwise", 0.2), ("g1_sdpa_head_shared", 201), ("g2_value_head_shared", 25),
    ("g1_sdpa_additive_silu", 201), ("kv_heads_8", 50), ("q_heads_48", 201),
])
def test_gate_parameters_reproduce_table1_column(name, paper_millions):
    def dense_twin(variant):
        config = base_config("moe_15a2b", variant)
        # One layer: gate parameters are per layer, so scale by the 24 layers afterwards.
        config.model.update(num_experts=0, experts_per_token=0, mlp_dim=768, num_layers=1)
        return model_config(config)

    added = 24 * (count_params(dense_twin(name)) - count_params(dense_twin("baseline")))
    assert added / 1e6 == pytest.approx(paper_millions, rel=0.03)
