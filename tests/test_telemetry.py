"""Telemetry (gated_attention/telemetry.py) against the XLA reference's attention maps and
numpy, and what a run with train.telemetry_every writes (metrics.jsonl, TensorBoard, record)."""

import json
import pathlib
import struct
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import sinks
from gated_attention import capture, config_lib, telemetry, train
from gated_attention.analysis import reductions
from gated_attention.model import Transformer
from gated_attention.ops import reference

# Row 0: two segments and padding (segment id 0); row 1: one segment.
SEGMENTS = np.array([[1] * 9 + [2] * 8 + [0] * 3, [3] * 20], np.int32)


def _starts_numpy(segment_ids):
    starts = np.zeros_like(segment_ids)
    for b, row in enumerate(segment_ids):
        for i in range(len(row)):
            starts[b, i] = i if i == 0 or row[i] != row[i - 1] else starts[b, i - 1]
    return starts


def _reference_first_token(probs, segment_ids):
    """probs [b, h, q, k] (the reference's S x S map) -> weight on the segment's first key."""
    starts = _starts_numpy(segment_ids)
    return np.take_along_axis(np.asarray(probs), starts[:, None, :, None], axis=3)[..., 0]


@pytest.mark.parametrize("normalizer", ["softmax", "softmax_off_by_one", "learned_sink",
                                        "softpick"])
@pytest.mark.parametrize("segmented", [False, True])
@pytest.mark.parametrize("window", [0, 6])
def test_blockwise_first_token_weight_matches_the_reference_map(normalizer, segmented, window):
    rng = np.random.default_rng(0)
    b, s, h, n, d = 2, 20, 4, 2, 8
    q = jnp.asarray(3 * rng.normal(size=(b, s, h, d)), jnp.float32)
    k = jnp.asarray(3 * rng.normal(size=(b, s, n, d)), jnp.float32)
    sink = jnp.asarray(rng.normal(size=(h,)), jnp.float32)
    seg = jnp.asarray(SEGMENTS) if segmented else None
    kwargs = dict(segment_ids=seg, causal=True, normalizer=normalizer,
                  sink_logits=sink if normalizer == "learned_sink" else None, window=window)
    # block 8 over 20 positions: three query and key blocks, the last one padded
    ours = telemetry.first_token_weights(q, k, block=8, **kwargs)
    probs = reference.attention_weights(q, k, **kwargs)
    expected = _reference_first_token(probs, SEGMENTS if segmented else np.ones((b, s), int))
    np.testing.assert_allclose(np.asarray(ours), expected, rtol=2e-5, atol=1e-6)


def _model(variant="g1_sdpa_elementwise", impl="xla"):
    config = sinks.get_config(f"variant={variant}")
    config.model.num_heads, config.model.num_kv_heads = 4, 2
    config.model.attention_impl = impl
    cfg = config_lib.model_config(config)
    model = Transformer(cfg, rngs=nnx.Rngs(params=0))
    graphdef, params = nnx.split(model, nnx.Param)
    # Sharper attention than at init (QK-norm scales x4: logits x16), so first-token weights
    # spread far from uniform.
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x * 4 if any("q_norm" in str(k) or "k_norm" in str(k) for k in p) else x,
        params)
    return config, graphdef, params


def _batch(segmented):
    rng = np.random.default_rng(1)
    inputs = rng.integers(1, 65, size=SEGMENTS.shape).astype(np.int32)
    seg = SEGMENTS if segmented else np.ones_like(SEGMENTS)
    starts = _starts_numpy(seg)
    positions = (np.arange(seg.shape[1])[None] - starts).astype(np.int32)
    batch = {"inputs": jnp.asarray(inputs), "positions": jnp.asarray(positions)}
    if segmented:
        batch["segment_ids"] = jnp.asarray(seg)
    return batch, seg


@pytest.mark.parametrize("segmented", [False, True])
def test_model_telemetry_matches_the_xla_reference_maps_and_numpy(segmented):
    config, graphdef, params = _model()
    batch, seg = _batch(segmented)
    values = jax.jit(telemetry.make_telemetry_fn(graphdef, config))(params, batch)
    record = telemetry.to_record(jax.device_get(values), "sigmoid")
    model = nnx.merge(graphdef, params)
    model(batch["inputs"], positions=batch["positions"], segment_ids=batch.get("segment_ids"),
          capture=("attention_probs", "gate_scores", "resid_after_ffn"))
    layers = capture.collect(model)
    starts = _starts_numpy(seg)
    queries = (seg != 0) & (starts != np.arange(seg.shape[1])[None])
    tokens = seg != 0
    for i, layer in enumerate(layers):
        first = _reference_first_token(layer["attention_probs"], seg)  # [b, h, s]
        per_head = (first * queries[:, None]).sum(axis=(0, 2)) / queries.sum()
        np.testing.assert_allclose(record["f_attn_per_head"][i], per_head, rtol=1e-5)
        scores = np.asarray(layer["gate_scores"])[tokens]
        counts, _ = np.histogram(scores, bins=reductions.HISTOGRAM_BINS, range=(0.0, 1.0))
        np.testing.assert_array_equal(record["gate_hist_per_layer"][i], counts)
        assert record["gate_mean_per_layer"][i] == pytest.approx(scores.mean(), rel=1e-5)
        m_act = np.abs(np.asarray(layer["resid_after_ffn"])[tokens]).max()
        assert record["m_act_per_layer"][i] == pytest.approx(m_act, rel=1e-6)
        kernel = np.asarray(params["layers"][i]["attention"]["gate"]["kernel"][...])
        assert record["gate_norm_per_layer"][i] == pytest.approx(np.linalg.norm(kernel), 1e-5)
        np.testing.assert_allclose(record["gate_norm_per_head"][i],
                                   np.sqrt((kernel ** 2).sum(axis=(0, 2))), rtol=1e-5)
    heads = np.concatenate([np.asarray(h) for h in record["f_attn_per_head"]])
    assert record["sink_rate"] == pytest.approx(np.mean(heads > 0.3))
    assert heads.std() > 0.05  # heads differ: not a uniform model


@pytest.mark.slow
def test_first_token_weight_does_not_depend_on_the_attention_implementation():
    batch, _ = _batch(True)
    got = {}
    for impl in ("xla", "chunked"):
        config, graphdef, params = _model("baseline", impl)
        values = jax.jit(telemetry.make_telemetry_fn(graphdef, config))(params, batch)
        got[impl] = np.concatenate([np.asarray(h) for h in values["f_attn_per_head"]])
    # layer 1 sees layer 0's output, which the two compute with other roundings
    np.testing.assert_allclose(got["chunked"], got["xla"], rtol=1e-5)


def _events(folder: pathlib.Path):
    """Every Event in a TensorBoard folder (TFRecord framing read by hand)."""
    from tensorboardX.proto import event_pb2

    out = []
    for path in sorted(folder.glob("events.out.tfevents.*")):
        data = path.read_bytes()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset:offset + 8])
            out.append(event_pb2.Event.FromString(data[offset + 12:offset + 12 + length]))
            offset += 12 + length + 4
    return out


@pytest.mark.slow
def test_a_run_writes_telemetry_and_its_record(tmp_path):
    config = sinks.get_config("variant=g1_sdpa_elementwise")
    config.update_from_flattened_dict({
        "train.steps": 5, "train.batch_size": 4, "data.seq_len": 16, "train.eval_every": 5,
        "train.eval_batches": 1, "train.log_every": 2, "train.checkpoint_every": 5,
        "optimizer.warmup_steps": 1, "train.telemetry_every": 2, "train.async_checkpoint": False})
    workdir = tmp_path / "run"
    train.run(config, workdir, progress=False, devices=jax.devices()[:1])
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    points = [r for r in records if r["kind"] == "telemetry"]
    assert [p["step"] for p in points] == [2, 4]  # every 2 updates, none at step 0
    assert len(points[0]["f_attn_per_layer"]) == 2 and len(points[0]["gate_hist_per_layer"]) == 2
    record = json.loads((workdir / "record.json").read_text())
    saved = json.loads((workdir / "config.json").read_text())
    assert record["config"]["model"] == saved["model"] and record["config"]["seed"] == 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                          cwd=pathlib.Path(__file__).parent)
    if head.returncode == 0:
        assert record["code"]["commit"] == head.stdout.strip()
        assert isinstance(record["code"]["dirty"], bool)
    assert record["hardware"]["platform"] == "cpu" and record["hardware"]["devices"] == 1
    assert record["hardware"]["mesh"]["data"] == 1
    assert record["steps"] == 5 and record["tokens_seen"] == 5 * 4 * 16
    assert record["model_flops"] == pytest.approx(record["model_flops_per_token"] * 320)
    trains = [r for r in records if r["kind"] == "train"]
    evals = [r for r in records if r["kind"] == "eval"]
    assert record["final"]["train"]["loss"] == pytest.approx(trains[-1]["loss"])
    assert record["final"]["eval"]["loss"] == pytest.approx(evals[-1]["loss"])
    assert record["telemetry"] == points[-1]
    assert record["wall_seconds"] > 0
    tags = {v.tag for e in _events(workdir / "tb") for v in e.summary.value}
    assert {"telemetry/f_attn", "telemetry/sink_rate", "telemetry/f_attn/layer1",
            "telemetry/gate_mean/layer0", "telemetry/gate_scores/layer0"} <= tags


def test_emergence_step_is_the_first_point_at_three_times_uniform(tmp_path):
    from gated_attention import telemetry_report

    uniform = telemetry_report.uniform_first_token(64)
    # mean of 1/(i+1) for i = 1..63, by hand: (H_64 - 1) / 63
    assert uniform == pytest.approx((sum(1 / n for n in range(1, 65)) - 1) / 63)
    points = [{"step": 0, "f_attn_per_layer": [uniform, uniform]},
              {"step": 100, "f_attn_per_layer": [2.9 * uniform, uniform]},
              {"step": 200, "f_attn_per_layer": [3.1 * uniform, uniform]}]
    assert telemetry_report.emergence(points, uniform) == [200, None]
    run = tmp_path / "baseline"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "telemetry", **p}) + "\n"
                                               for p in points))
    lines = telemetry_report.report_lines(tmp_path, ["baseline"], 64, 1000, "sinks")
    assert "| baseline | 0 | 200 | 200,000 | 0.184 |" in lines
    assert (tmp_path / "sink_emergence.png").exists()
