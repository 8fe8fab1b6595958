"""Scanned decoder blocks (model.scan_layers): same function as the per-layer model, layouts
convert both ways, per-layer analysis still works, and the paper archs scan by default."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import archs, run_config
from gated_attention.model import capture
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.transformer import (
    Transformer,
    build_model,
    stack_layer_params,
    unstack_layer_params,
)
from gated_attention.model.variants import VARIANTS


def small_cfg(variant="g1_sdpa_elementwise", **changes):
    fields = dict(vocab_size=64, num_layers=3, d_model=32, num_heads=4, num_kv_heads=2,
                  head_dim=8, mlp_dim=48, variant=VARIANTS[variant], dtype="float32")
    return ModelConfig(**{**fields, **changes})




def scanned_twin(cfg, seed=0):
    """A per-layer model and a scanned model holding the same weights."""
    flat = build_model(cfg, seed)
    graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(cfg.replace(scan_layers=True),
                                                            rngs=nnx.Rngs(0))))[0]
    stacked = stack_layer_params(nnx.state(flat, nnx.Param), cfg)
    return flat, nnx.merge(graphdef, stacked)


@pytest.mark.parametrize("variant, changes", [
    ("g1_sdpa_elementwise", {}),
    ("g1_sdpa_headwise", {"num_experts": 4, "experts_per_token": 2, "expert_mlp_dim": 16,
                          "tied_embeddings": False, "remat": "full"}),
])
def test_scanned_model_computes_what_the_per_layer_model_computes(variant, changes):
    cfg = small_cfg(variant, num_layers=2, **changes)
    flat, scanned = scanned_twin(cfg)
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, cfg.vocab_size)
    segments = jnp.array([[1] * 7 + [2] * 5, [1] * 12])

    @nnx.jit
    def loss_and_grad(model):
        def loss(model):
            logits, aux = model(tokens, segment_ids=segments)
            return jnp.mean(logits ** 2) + sum(jnp.sum(v) for v in aux.values()), (logits, aux)

        return nnx.value_and_grad(loss, has_aux=True)(model)

    (_, (logits_flat, aux_flat)), g_flat = loss_and_grad(flat)
    (_, (logits_scan, aux_scan)), g_scan = loss_and_grad(scanned)
    np.testing.assert_allclose(logits_scan, logits_flat, rtol=1e-5, atol=1e-6)
    assert set(aux_scan) == set(aux_flat)
    for name in aux_flat:
        np.testing.assert_allclose(aux_scan[name], aux_flat[name], rtol=1e-5)
    # Gradients of the scanned weights are the per-layer gradients, stacked.
    restacked = stack_layer_params(nnx.state(g_flat, nnx.Param), cfg)
    for a, b in zip(jax.tree.leaves(nnx.state(g_scan, nnx.Param)), jax.tree.leaves(restacked)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_stack_and_unstack_are_inverse_and_keep_logical_axes():
    cfg = small_cfg()
    flat = nnx.state(build_model(cfg, 3), nnx.Param)
    stacked = stack_layer_params(flat, cfg)
    q = stacked["layers"]["attention"]["q_proj"]
    assert q.get_value().shape == (3, 32, 4, 8)
    assert q.get_metadata()["out_sharding"][0] == "layers"
    np.testing.assert_array_equal(q.get_value()[2],
                                  flat["layers"][2]["attention"]["q_proj"].get_value())
    back = unstack_layer_params(stacked, cfg)
    assert jax.tree.structure(back) == jax.tree.structure(flat)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(flat)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="layers \\[0, 1\\] given, the model has 3"):
        del flat["layers"][2]
        stack_layer_params(flat, cfg)


def test_capture_on_a_scanned_model_gives_each_layers_tensors():
    cfg = small_cfg()
    flat, scanned = scanned_twin(cfg)
    tokens = jax.random.randint(jax.random.key(2), (2, 10), 0, cfg.vocab_size)
    names = ("gate_scores", "resid_after_ffn", "first_token_attention")

    @nnx.jit
    def run(model):
        model(tokens, capture=names)
        return capture.collect(model)

    expected, got = run(flat), run(scanned)
    assert len(got) == cfg.num_layers == len(expected)
    for layer_got, layer_expected in zip(got, expected):
        assert set(layer_got) == set(names)
        for name in names:
            np.testing.assert_allclose(layer_got[name], layer_expected[name], rtol=1e-5,
                                       atol=1e-6)


def test_paper_archs_scan_by_default_and_small_ones_do_not():
    for arch in archs.ARCHS:
        cfg = run_config.model_config(run_config.base_config(arch, "baseline"))
        assert cfg.scan_layers == (arch in ("dense_1p7b_28l", "dense_1p7b_48l", "moe_15a2b"))


def test_analysis_statistics_of_a_scanned_model_are_the_per_layer_models():
    """analyze's statistics (sinks, gate scores, activations, maps) read a scanned model per
    layer exactly as they read the per-layer model holding the same weights."""
    from gated_attention.analysis import stats

    cfg = small_cfg("g1_sdpa_headwise", num_layers=2)
    flat, scanned = scanned_twin(cfg)
    rng = np.random.default_rng(0)
    batches = [{"inputs": rng.integers(0, 64, (2, 8)), "targets": rng.integers(0, 64, (2, 8))}]
    expected, got = stats.model_statistics(flat, batches), stats.model_statistics(scanned, batches)
    assert got.keys() == expected.keys()
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(expected)):
        if isinstance(a, str | bool):
            assert a == b
        else:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(stats.attention_maps(scanned, np.arange(8), layers=[1]),
                               stats.attention_maps(flat, np.arange(8), layers=[1]), atol=1e-6)


def test_the_scanned_program_does_not_grow_with_depth():
    """What XLA has to compile: the scanned model's program holds one block's matmuls at any
    depth; the per-layer model's grows with every layer."""

    def matmuls(cfg):
        graphdef, state = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
        tokens = jax.ShapeDtypeStruct((1, 8), jnp.int32)
        lowered = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t)[0]).lower(state, tokens)
        return lowered.as_text().count("stablehlo.dot_general")

    scanned = [matmuls(small_cfg(num_layers=n, scan_layers=True)) for n in (2, 6)]
    per_layer = [matmuls(small_cfg(num_layers=n)) for n in (2, 6)]
    assert scanned[0] == scanned[1]
    one_block = per_layer[0] - scanned[0]  # two blocks unrolled vs one in the scan body
    assert one_block > 0 and per_layer[1] - per_layer[0] == 4 * one_block
