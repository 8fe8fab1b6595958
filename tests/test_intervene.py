"""intervene: changed gates on a trained run, against the unchanged model and the numpy layer;
the saved run is never modified."""

import hashlib

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx
from test_beyond_variants import inputs, numpy_variant, randomise, tiny_cfg
from test_train import mini_config

from gated_attention.analysis import interventions as intervene
from gated_attention.analysis.interventions import Change, apply_change
from gated_attention.model.layers.attention import Attention
from gated_attention.model.transformer import build_model
from gated_attention.model.variants import VARIANTS
from gated_attention.training import loop


def small_model(name="g1_sdpa_headwise"):
    cfg = tiny_cfg(VARIANTS[name]).replace(num_layers=2, vocab_size=64)
    model = build_model(cfg, seed=0)
    rng = np.random.default_rng(0)
    for _, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):  # trained-looking weights
        var.set_value(var.get_value() + jnp.asarray(rng.normal(0, 0.2, var.get_value().shape),
                                                    jnp.float32))
    return model


def test_scale_one_leaves_logits_bitwise_equal():
    model = small_model("g1_bias_init_2")
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 9)), jnp.int32)
    logits = nnx.jit(lambda m, t: m(t)[0])
    want = logits(model, tokens)
    got = logits(apply_change(model, Change("scale", 1.0)), tokens)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    changed = logits(apply_change(model, Change("scale", 0.5)), tokens)
    assert np.abs(np.asarray(changed - want)).max() > 1e-4
    again = logits(model, tokens)  # the original model is untouched
    np.testing.assert_array_equal(np.asarray(again), np.asarray(want))


def layer_with(name, seed=1):
    module = Attention(tiny_cfg(VARIANTS[name]), rngs=nnx.Rngs(params=0))
    return module, randomise(module, seed)


def test_closed_headwise_gate_equals_removing_the_heads_output():
    """A headwise gate forced to 0 on head 2 (scale 0 on its score) = the numpy layer with head
    2's output removed before o_proj; ablating the head gives the same."""
    module, params = layer_with("g1_sdpa_headwise")
    x, positions, segment_ids = inputs()
    args = (jnp.asarray(x, jnp.float32), jnp.asarray(positions),
            jnp.asarray(segment_ids, jnp.int32))
    intervene._force(module.gate, 2, 0.0, 4)
    got = np.asarray(module(*args), np.float64)
    want = ref.attention_layer_beyond(x, params, numpy_variant(module.cfg.variant),
                                      positions=positions, segment_ids=segment_ids,
                                      head_mask=[1, 1, 0, 1])
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5)
    module.gate.forced = None
    from gated_attention.model.layers.gates import Intervention

    module.head_mask = Intervention(jnp.asarray([1.0, 1.0, 0.0, 1.0]))
    np.testing.assert_allclose(np.asarray(module(*args), np.float64), want, rtol=2e-4,
                               atol=2e-5)


def test_forced_open_gate_is_the_ungated_head_and_scale_zero_is_half():
    module, params = layer_with("g1_sdpa_elementwise")
    x, positions, _ = inputs()
    args = (jnp.asarray(x, jnp.float32), jnp.asarray(positions))
    intervene._force(module.gate, None, 1.0, 4)
    fields = numpy_variant(module.cfg.variant)
    no_gate = {k: v for k, v in params.items() if k != "gates"}
    want = ref.attention_layer_beyond(x, no_gate, fields, positions=positions)
    np.testing.assert_allclose(np.asarray(module(*args), np.float64), want, rtol=2e-4,
                               atol=2e-5)
    # scale 0: logits 0, every score sigmoid(0) = 1/2: half the ungated output.
    module.gate.forced = None
    module.gate.kernel.set_value(module.gate.kernel.get_value() * 0.0)
    np.testing.assert_allclose(np.asarray(module(*args), np.float64), want / 2, rtol=2e-4,
                               atol=2e-5)


def test_bad_interventions_name_the_flag():
    with pytest.raises(ValueError, match=r"--ablate='1' must look like LAYER:HEAD"):
        intervene.changes_from_flags([], [], [], ["1"], [])
    with pytest.raises(ValueError, match="no intervention asked"):
        intervene.changes_from_flags([], [], [], [], [])
    cfg = tiny_cfg(VARIANTS["baseline"])
    with pytest.raises(ValueError, match="scale=0.5: variant 'baseline' has no gate"):
        intervene.check_changes(cfg, [Change("scale", 0.5)])
    with pytest.raises(ValueError, match="sink=0: needs normalizer='learned_sink'"):
        intervene.check_changes(cfg, [Change("sink", 0.0)])
    with pytest.raises(ValueError, match="ablate 0:7: head must be in 0..3"):
        intervene.check_changes(cfg, [Change("ablate", layer=0, head=7)])


def file_hashes(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow
def test_intervene_on_a_trained_run_writes_a_new_folder_and_changes_nothing(tmp_path):
    config = mini_config(tmp_path, steps=3, eval_every=0, checkpoint_every=0)
    config.optimizer.warmup_steps = 1
    loop.run(config, tmp_path / "run", progress=False, devices=jax.devices()[:1])
    run = tmp_path / "run"
    before = file_hashes(run)
    changes = intervene.changes_from_flags(["0", "1"], ["0:*"], [], ["0:1"], [])
    result = intervene.intervene(run, changes, batches=1, batch_size=2)
    assert file_hashes(run) == {**before, **{k: v for k, v in file_hashes(run).items()
                                             if k.startswith("interventions/")}}
    rows = {r["intervention"]: r for r in result["rows"]}
    assert rows["scale=1"]["metrics"]["loss"] == rows["unchanged"]["metrics"]["loss"]
    assert rows["scale=0"]["delta"]["loss"] != 0.0
    for name in ("interventions.json", "interventions.md", "interventions.png"):
        assert (run / "interventions" / name).exists()
    assert "| scale=0 |" in (run / "interventions" / "interventions.md").read_text()
    second = intervene.intervene(run, changes[:1], batches=1, batch_size=2)
    assert second["out"].endswith("interventions.1")  # the first result is kept
    assert (run / "interventions" / "interventions.md").read_text().count("| scale") == 2
