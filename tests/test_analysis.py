"""Analysis metrics on hand-built cases with known answers (gated_attention/analysis)."""

from __future__ import annotations

import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.analysis import plots, stability, stats
from gated_attention.config import run_config
from gated_attention.model import capture, reductions
from gated_attention.model.transformer import build_model

S = 8  # sequence length of the hand-built cases
HEAD_DIM = 16


def tiny_model(variant: str = "g1_sdpa_headwise"):
    config = run_config.base_config("tiny", variant)
    config.model.update(dict(vocab_size=64, num_layers=2, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=HEAD_DIM, mlp_dim=64, dtype="float32"))
    return build_model(run_config.model_config(config), seed=0)


@pytest.fixture(scope="module")
def shared_model():
    """One headwise-G1 model (gate scores [b, s, h]) for every test; tests work on clones,
    so the compiled statistics function is shared too."""
    return tiny_model()


def set_weights(model, *, sink: bool, value_levels=(0.0005, 0.005, 0.015, 0.5)) -> None:
    """Token 0's embedding is 7 e_0, every other token's is e_1; branches add nothing to the
    residual (o_proj = down_proj = 0), so every layer sees the same input and outputs it.

    sink=True: q and k live in the slowest RoPE pair (dim d/2-1) and only token 0 has a key,
    with QK-norm scales of 10: the logit on key 0 is about 400, on other keys 0, so all
    attention goes to key 0. sink=False: q = 0, so attention is uniform over visible keys.
    The value of token 0 is `value_levels` tiled over head_dim; other values are 0.
    """
    D = model.cfg.d_model
    embed = np.zeros((model.cfg.vocab_size, D))
    embed[0, 0] = 7.0
    embed[1:, 1] = 1.0
    model.embed[...] = jnp.asarray(embed, jnp.float32)
    slow = HEAD_DIM // 2 - 1
    levels = np.resize(np.asarray(value_levels), HEAD_DIM) / math.sqrt(D)  # x_hat_0 = sqrt(D)
    for layer in model.layers:
        attn = layer.attention
        q = np.zeros(attn.q_proj[...].shape)
        if sink:
            q[0, :, slow] = q[1, :, slow] = 1.0
        k = np.zeros(attn.k_proj[...].shape)
        k[0, :, slow] = 1.0
        v = np.zeros(attn.v_proj[...].shape)
        v[0, :, :] = levels
        attn.q_proj[...] = jnp.asarray(q, jnp.float32)
        attn.k_proj[...] = jnp.asarray(k, jnp.float32)
        attn.v_proj[...] = jnp.asarray(v, jnp.float32)
        attn.q_norm.scale[...] = jnp.full((HEAD_DIM,), 10.0, jnp.float32)
        attn.k_norm.scale[...] = jnp.full((HEAD_DIM,), 10.0, jnp.float32)
        attn.o_proj[...] = jnp.zeros_like(attn.o_proj[...])
        layer.ffn.down_proj[...] = jnp.zeros_like(layer.ffn.down_proj[...])
        if attn.gate is not None:
            attn.gate.kernel[...] = jnp.zeros_like(attn.gate.kernel[...])  # scores = 0.5


def prompt_batch(rows: int = 2) -> dict[str, np.ndarray]:
    inputs = np.tile(np.arange(S), (rows, 1))  # token 0 first, then tokens 1..7
    return {"inputs": inputs, "segment_ids": np.ones_like(inputs)}


def test_forced_sink_gives_first_token_attention_one_and_known_activations(shared_model):
    model = nnx.clone(shared_model)
    set_weights(model, sink=True)
    out = stats.model_statistics(model, [prompt_batch()])
    assert out["first_token_attention"] == pytest.approx(1.0, abs=1e-6)
    np.testing.assert_allclose(out["first_token_attention_per_head"], 1.0, atol=1e-6)
    assert out["sink_rate"] == 1.0
    assert out["exclude_first_query"] is True
    # Branch outputs are zero; the residual stream is the embedding, max |7|.
    assert out["massive_activation"] == pytest.approx(7.0)
    assert out["max_activation_per_layer"]["attn_output"] == [0.0, 0.0]
    assert out["max_activation_per_layer"]["resid_after_attn"] == pytest.approx([7.0, 7.0])
    # Zero gate kernel: sigmoid(0) = 0.5 everywhere.
    assert out["gate_score_mean"] == pytest.approx(0.5)
    for layer in out["gate_score_per_layer"]:
        assert layer == pytest.approx({"mean": 0.5, "std": 0.0, "min": 0.5, "max": 0.5})
    # Every query copies token 0's value (0.0005, 0.005, 0.015, 0.5 tiled); the gate halves it.
    before, after = out["sparsity"][0]["before"], out["sparsity"][0]["after"]
    assert before["mean_abs"] == pytest.approx(0.130125, rel=1e-5)
    assert after["mean_abs"] == pytest.approx(0.130125 / 2, rel=1e-5)
    assert before["frac_below_0.01"] == pytest.approx(0.5)
    assert before["frac_below_0.001"] == pytest.approx(0.25)
    assert after["frac_below_0.01"] == pytest.approx(0.75)
    assert after["frac_below_0.001"] == pytest.approx(0.25)
    assert sum(out["gate_histogram"]["all"]) == pytest.approx(1.0)
    json.dumps(out)  # plain Python all the way down


def test_uniform_attention_pools_over_queries_and_respects_segments(shared_model):
    """q = 0 gives uniform causal attention: query i puts 1/(i+1) on key 0.

    Batch 1 is two unpacked rows; batch 2 is one packed row [1 1 1 1 2 2 2 0] whose first
    segment has queries 1..3 (the rest cannot see key 0, and 0 is padding). The metric is the
    mean over all counted queries of both batches, not the mean of the two batch means.
    """
    model = nnx.clone(shared_model)
    set_weights(model, sink=False)
    packed = prompt_batch(2)
    packed["segment_ids"] = np.array([[1, 1, 1, 1, 2, 2, 2, 0], [0] * S])  # row 2: padding
    out = stats.model_statistics(model, [prompt_batch(2), packed], sink_threshold=0.2)
    unpacked = [1 / (i + 1) for i in range(1, S)] * 2
    first_segment = [1 / (i + 1) for i in range(1, 4)]
    expected = np.mean(unpacked + first_segment)
    assert out["first_token_queries"] == len(unpacked) + len(first_segment)
    assert out["first_token_attention"] == pytest.approx(expected, rel=1e-6)
    assert out["sink_rate"] == 1.0  # every head is above 0.2 ...
    # ... and with query 0 included (weight 1 on itself) the mean rises accordingly.
    out0 = stats.model_statistics(model, [prompt_batch(2)], exclude_first_query=False)
    assert out0["first_token_attention"] == pytest.approx(
        np.mean([1 / (i + 1) for i in range(S)]), rel=1e-6)
    assert out0["sink_rate"] == 1.0  # H_8 / 8 = 0.34 > 0.3 with query 0 ...
    assert out0["exclude_first_query"] is False
    # ... but (H_8 - 1) / 7 = 0.245 < 0.3 without it.
    assert stats.model_statistics(model, [prompt_batch(2)])["sink_rate"] == 0.0
    maps = stats.attention_maps(model, np.arange(S), layers=[1])
    expected_map = np.tril(np.ones((S, S))) / np.arange(1, S + 1)[:, None]
    np.testing.assert_allclose(maps[0], expected_map, atol=1e-6)


def test_random_model_matches_direct_numpy_computation(shared_model):
    """Headwise G1 gate ([b, s, h] scores) at random init, two batches, against numpy on the
    same model's captured tensors (pooled by hand)."""
    model = nnx.clone(shared_model)
    rng = np.random.default_rng(0)
    batches = [{"inputs": rng.integers(0, 64, (2, S)), "targets": rng.integers(0, 64, (2, S))}
               for _ in range(2)]
    out = stats.model_statistics(model, batches)

    @nnx.jit
    def forward(model, inputs):
        logits, _ = model(inputs, capture=stats.STAT_CAPTURES)
        return logits, capture.collect(model)

    caps, nll = [], []
    for b in batches:
        logits, layers = forward(model, jnp.asarray(b["inputs"]))
        caps.append(layers)
        logp = np.asarray(logits, np.float64) - np.log(
            np.exp(np.asarray(logits, np.float64)).sum(-1, keepdims=True))
        nll.append(-np.take_along_axis(logp, b["targets"][..., None], -1))
    for layer in range(2):
        fta = np.concatenate([np.asarray(c[layer]["first_token_attention"]) for c in caps])
        np.testing.assert_allclose(out["first_token_attention_per_head"][layer],
                                   fta[:, :, 1:].mean(axis=(0, 2)), rtol=1e-5)
        g = np.concatenate([np.asarray(c[layer]["gate_scores"], np.float64) for c in caps])
        assert out["gate_score_per_layer"][layer] == pytest.approx(
            {"mean": g.mean(), "std": g.std(), "min": g.min(), "max": g.max()}, rel=1e-5)
        resid = np.concatenate([np.asarray(c[layer]["resid_after_ffn"]) for c in caps])
        assert out["max_activation_per_layer"]["resid_after_ffn"][layer] == pytest.approx(
            np.abs(resid).max(), rel=1e-6)
        y = np.abs(np.concatenate([np.asarray(c[layer]["sdpa_after_gate"]) for c in caps]))
        assert out["sparsity"][layer]["after"]["frac_below_0.01"] == pytest.approx(
            (y < 1e-2).mean())
    assert out["loss"] == pytest.approx(np.concatenate(nll).mean(), rel=1e-5)
    assert out["perplexity"] == pytest.approx(math.exp(out["loss"]))


def test_gate_moments_merge_across_batches_like_one_pool():
    rng = np.random.default_rng(1)
    acc, pool = None, []
    for s in (5, 9):  # two batches of different lengths; padding in the second
        g = rng.uniform(size=(2, s, 3, 4)).astype(np.float32)
        seg = np.ones((2, s), np.int32)
        if s == 9:
            seg[1, 6:] = 0
        reduce = jax.jit(lambda g, seg, s=s: reductions.reduce_layer(
            {"gate_scores": g}, seg, (2, s), exclude_first_query=True, histogram_range=(0.0, 1.0)))
        red = reduce(jnp.asarray(g), jnp.asarray(seg))
        acc = reductions.merge(acc, [red])
        pool.append(g[seg != 0].ravel())
    pool = np.concatenate(pool).astype(np.float64)
    g = acc[0]["gate"]
    assert g["count"] == pool.size
    assert g["mean"] == pytest.approx(pool.mean(), rel=1e-6)
    assert math.sqrt(g["m2"] / g["count"]) == pytest.approx(pool.std(), rel=1e-5)
    hist, _ = np.histogram(pool, bins=reductions.HISTOGRAM_BINS, range=(0.0, 1.0))
    np.testing.assert_allclose(acc[0]["gate_hist"], hist, atol=1e-3)


def test_bad_input_is_named(shared_model):
    model = shared_model
    with pytest.raises(KeyError, match="inputs"):
        stats.model_statistics(model, [{"tokens": np.zeros((1, S), int)}])
    with pytest.raises(ValueError, match="sink_threshold"):
        stats.model_statistics(model, [prompt_batch()], sink_threshold=1.5)
    with pytest.raises(ValueError, match="layers"):
        stats.attention_maps(model, np.arange(S), layers=[5])


def test_spike_rule_and_divergence_on_hand_built_series():
    series = [(i, 3.0) for i in range(200)]
    series[150] = (150, 4.6)   # > 1.5 x 3.0: a spike
    series[160] = (160, 4.4)   # below 1.5 x EMA: not a spike
    series[50] = (50, 9.0)     # inside the warm-up: ignored
    rep = stability.stability_report(series, warmup_steps=100)
    assert rep["spike_steps"] == [150]
    assert not rep["diverged"]
    blown = [(i, 3.0) for i in range(120)] + [(120, float("nan"))]
    assert stability.stability_report(blown)["divergence_step"] == 120
    rising = [(i, 3.0 if i < 150 else 9.0) for i in range(200)]
    rep = stability.stability_report(rising, warmup_steps=100)
    # Debiased EMA from 3 towards 9: above 4.5 once 1 - 0.9^n of the gap exceeds 1/4 (n = 3).
    assert rep["diverged"] and rep["divergence_step"] == 152
    # Debiased EMA: constant series stays constant; first point is the point itself.
    assert stability.ema_smooth([2.0, 2.0, 2.0]) == pytest.approx([2.0, 2.0, 2.0])
    assert stability.ema_smooth([1.0, 3.0]) == pytest.approx([1.0, (0.09 + 0.3) / 0.19])


def test_read_metrics_and_plots(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 2, "loss": 2.5}\n\n{"step": 1, "loss": 3.0, "lr": 0.1}\n'
                    '{"step": 3, "eval_loss": 2.0}\n')
    records = stability.read_metrics(path)
    assert stability.loss_series(records) == [(1, 3.0), (2, 2.5)]
    assert stability.loss_series(records, "eval_loss") == [(3, 2.0)]
    (tmp_path / "bad.jsonl").write_text("{oops\n")
    with pytest.raises(ValueError, match="bad.jsonl:1"):
        stability.read_metrics(tmp_path / "bad.jsonl")
    outs = [
        plots.plot_loss_curves({"a": [(1, 3.0), (2, 2.5)]}, tmp_path / "loss.png"),
        plots.plot_per_layer({"a": [1.0, 2.0]}, tmp_path / "f.png", "F-Attn", "t"),
        plots.plot_gate_histograms({"a": {"edges": [0, 0.5, 1], "all": [0.2, 0.8]}, "b": None},
                                   tmp_path / "h.png"),
        plots.plot_attention_map({"a": np.eye(3)[None]}, tmp_path / "m.png", layers=[0]),
    ]
    for out in outs:
        with open(out, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="layers"):
        plots.plot_attention_map({"a": np.eye(3)[None]}, tmp_path / "x.png", layers=[0, 1])


def test_analyze_keeps_an_earlier_steps_analysis(tmp_path):
    from gated_attention.analysis import run_analysis as analyze

    out = tmp_path / "analysis"
    out.mkdir()
    (out / "analysis.json").write_text(json.dumps({"step": 10}))
    analyze.keep_earlier(out, 10)  # same step: regenerated in place
    assert (out / "analysis.json").exists()
    analyze.keep_earlier(out, 20)
    assert not out.exists()
    assert json.loads((tmp_path / "analysis.step10" / "analysis.json").read_text()) == {
        "step": 10}
    with pytest.raises(FileNotFoundError, match="config.json"):
        analyze.analyze(tmp_path)



@pytest.mark.reference("golden")
def test_attention_maps_draw_every_layer_of_a_small_model_and_say_which_of_a_deep_one():
    """A 4-layer model's maps showed layers 0, 2, 3 and never said why 1 was missing."""
    from gated_attention.analysis import run_analysis as analyze

    assert analyze.default_layers(1) == [0] and analyze.default_layers(4) == [0, 1, 2, 3]
    assert analyze.default_layers(12) == [0, 6, 11]
    assert analyze.layers_caption([0, 1, 2, 3], 4) == "all 4 layers"
    assert analyze.layers_caption([0, 6, 11], 12) == (
        "layers 0, 6, 11 of 12 (first, middle and last; --layers draws others)")
    assert analyze.layers_caption([2, 5], 12) == "layers 2, 5 of 12 (chosen with --layers)"
