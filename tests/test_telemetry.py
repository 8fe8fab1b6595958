"""Telemetry (gated_attention/training/telemetry.py) against the XLA reference's attention maps and
numpy, with the model on every attention implementation (the Pallas kernels interpreted on
this CPU, cuDNN compiled for an H200), the pre-flight's compile of it for a TPU slice, and
what a run with train.telemetry_every writes (metrics.jsonl, TensorBoard, record)."""

import contextlib
import dataclasses
import functools
import json
import math
import pathlib
import re
import struct
import subprocess

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu
from jax.sharding import NamedSharding, PartitionSpec

from configs import sinks
from gated_attention.compile import memory, preflight
from gated_attention.config import run_config
from gated_attention.model import capture, reductions
from gated_attention.model.transformer import Transformer
from gated_attention.ops import reference
from gated_attention.parallel import sharding
from gated_attention.training import loop, telemetry

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


def _config(variant="g1_sdpa_elementwise", impl="xla"):
    config = sinks.get_config(f"variant={variant}")
    config.model.num_heads, config.model.num_kv_heads = 4, 2
    config.model.attention_impl = impl
    return config


@functools.cache
def _params(variant: str) -> nnx.State:
    """The variant's initial weights (the same on every attention implementation), made once
    per variant: the model's eager initialisation cost about 5 CPU-s a call, and the file
    called it 14 times."""
    model = Transformer(run_config.model_config(_config(variant)), rngs=nnx.Rngs(params=0))
    _, params = nnx.split(model, nnx.Param)
    # Sharper attention than at init (QK-norm scales x4: logits x16), so first-token weights
    # spread far from uniform.
    return jax.tree_util.tree_map_with_path(
        lambda p, x: x * 4 if any("q_norm" in str(k) or "k_norm" in str(k) for k in p) else x,
        params)


def _model(variant="g1_sdpa_elementwise", impl="xla"):
    config = _config(variant, impl)
    cfg = run_config.model_config(config)
    graphdef, abstract = nnx.split(
        nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0))), nnx.Param)
    params = _params(variant)
    assert jax.tree.structure(abstract) == jax.tree.structure(params)
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


@functools.cache
def _captured(segmented: bool) -> list[dict[str, np.ndarray]]:
    """Per layer: the S x S attention maps, gate scores and residual of the model on impl
    xla (one device, run op by op), the reference of the telemetry tests below; made once
    per batch for all of them."""
    _, graphdef, params = _model()
    batch, _ = _batch(segmented)
    model = nnx.merge(graphdef, params)
    model(batch["inputs"], positions=batch["positions"], segment_ids=batch.get("segment_ids"),
          capture=("attention_probs", "gate_scores", "resid_after_ffn"))
    return [{name: np.asarray(value) for name, value in layer.items()}
            for layer in capture.collect(model)]


@pytest.mark.parametrize("segmented", [False, True])
def test_model_telemetry_matches_the_xla_reference_maps_and_numpy(segmented):
    config, graphdef, params = _model()
    batch, seg = _batch(segmented)
    values = jax.jit(telemetry.make_telemetry_fn(graphdef, config))(params, batch)
    _check_record(telemetry.to_record(jax.device_get(values), "sigmoid"), _captured(segmented),
                  seg, params)


@pytest.mark.slow  # the model traced twice: 5 to 30 s on the shared host
@pytest.mark.reference("independent")  # the numpy statistics of the reference maps
@pytest.mark.parametrize("fields", [dict(grad_accum=2), dict(telemetry_rows=1)])
def test_telemetry_reads_the_first_micro_batch_only(fields):
    """With grad_accum = 2 (or telemetry_rows = 1) the telemetry of the 2-row batch is that of
    its row 0 alone (the train step's first micro-batch: rows 0, k, 2k, ...): the numpy
    reference on the whole batch's maps, restricted to row 0; row 1 (one segment, no padding)
    differs from it, so the whole batch's statistics would not match."""
    config, graphdef, params = _model()
    config.train.update(batch_size=2, **fields)
    batch, seg = _batch(True)
    values = jax.jit(telemetry.make_telemetry_fn(graphdef, config))(params, batch)
    first = [{name: value[:1] for name, value in layer.items()} for layer in _captured(True)]
    _check_record(telemetry.to_record(jax.device_get(values), "sigmoid"), first, seg[:1],
                  params)


@pytest.mark.reference("error_message")
def test_telemetry_rows_that_do_not_split_the_batch_are_refused():
    config, _, _ = _model()
    config.train.update(batch_size=8, telemetry_rows=3)
    with pytest.raises(run_config.ConfigError, match=r"train.telemetry_rows=3 must divide "
                       r"train.batch_size=8 and be divisible by the mesh's 2 batch shards"):
        telemetry.telemetry_rows(config, batch_shards=2)
    config.train.telemetry_rows = -1
    with pytest.raises(run_config.ConfigError, match=r"train.telemetry_rows=-1 must be an "
                       r"integer >= 0 \(0 = one micro-batch"):
        telemetry.telemetry_rows(config)


def _check_record(record, layers, seg, params):
    """The telemetry record against numpy statistics of the reference maps `layers` (per
    layer: attention_probs, gate_scores, resid_after_ffn of the rows of `seg`)."""
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
    seen = np.arange(seg.shape[1])[None] - starts + 1  # keys each query sees in its segment
    assert record["f_attn_uniform"] == pytest.approx((1 / seen)[queries].mean(), rel=1e-6)


def test_the_uniform_level_follows_the_segments():
    # Row 0: segment 1 at 0-2, segment 2 at 3-4, padding at 5; row 1: one segment of 6.
    # Queries (not a segment's first token, not padding) see 2, 3 | 2 | 2, 3, 4, 5, 6 keys.
    seg = jnp.array([[1, 1, 1, 2, 2, 0], [1, 1, 1, 1, 1, 1]])
    expected = (1 / 2 + 1 / 3 + 1 / 2 + 1 / 2 + 1 / 3 + 1 / 4 + 1 / 5 + 1 / 6) / 8
    assert float(telemetry.uniform_first_token_weight(seg, (2, 6))) == pytest.approx(expected)
    # No segment ids: every row one segment, the sink report's whole-row level
    from gated_attention.analysis import sink_report

    got = float(telemetry.uniform_first_token_weight(None, (3, 64)))
    assert got == pytest.approx(sink_report.uniform_first_token(64), rel=1e-6)


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


@functools.cache
def _xla_reference(segmented: bool) -> dict[str, np.ndarray]:
    """Per layer: F-Attn per head from the XLA reference's S x S maps (probs, the model on
    impl xla, one device), M-Act and the gate mean, with numpy: what every kernel's telemetry
    must give."""
    _, seg = _batch(segmented)
    starts = _starts_numpy(seg)
    queries = (seg != 0) & (starts != np.arange(seg.shape[1])[None])
    tokens = seg != 0
    out: dict[str, list] = {"f_attn": [], "m_act": [], "gate_mean": []}
    for layer in _captured(segmented):
        first = _reference_first_token(layer["attention_probs"], seg)  # [b, h, s]
        out["f_attn"].append((first * queries[:, None]).sum(axis=(0, 2)) / queries.sum())
        out["m_act"].append(np.abs(np.asarray(layer["resid_after_ffn"])[tokens]).max())
        out["gate_mean"].append(np.asarray(layer["gate_scores"])[tokens].mean())
    return {k: np.asarray(v) for k, v in out.items()}


def _telemetry_as_training_runs_it(impl: str, segmented: bool) -> tuple[dict, str]:
    """The record of one telemetry call with the model on `impl`, jitted as loop.run jits it
    (the batch split over a data=2 mesh of this host's CPU devices, so each device's kernel
    gets one row under shard_map, as on a pod), and the traced program's jaxpr.

    One row per kernel call also keeps splash runnable here: jax 0.10's TPU interpreter
    cannot run splash vmapped over a batch of more than one row (its grid gains the batch
    dimension, its dimension semantics do not); Mosaic compiles it for a TPU."""
    config, graphdef, params = _model(impl=impl)
    batch, _ = _batch(segmented)
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:2])
    rules = sharding.rules_from_config(config.mesh)
    jitted = jax.jit(telemetry.make_telemetry_fn(graphdef, config),
                     in_shardings=(NamedSharding(mesh, PartitionSpec()),
                                   sharding.batch_sharding(mesh, rules)))
    # Mosaic kernels inside the documented TPU interpret mode, as their own tests run them.
    mosaic = pltpu.force_tpu_interpret_mode() if impl in ("pallas_tpu", "splash") else \
        contextlib.nullcontext()
    with mosaic, jax.set_mesh(mesh), sharding.logical_rules(rules):
        traced = jitted.trace(params, batch)
        values = traced.lower().compile()(params, batch)
    return telemetry.to_record(jax.device_get(values), "sigmoid"), str(traced.jaxpr)


@pytest.mark.slow  # the Pallas kernels in interpret mode: about 2 to 7 s a case on one core
@pytest.mark.parametrize("segmented", [False, True])
@pytest.mark.parametrize("impl", ["chunked", "pallas_tpu", "splash", "pallas_gpu"])
def test_telemetry_on_every_kernel_matches_the_xla_reference_maps(impl, segmented):
    """Telemetry takes F-Attn from q and k (after QK-norm and RoPE) with its own blockwise
    logsumexp in plain XLA, whatever kernel the model attends with: on every implementation
    it equals the first-token column of the XLA reference's maps. The kernel still runs in the
    telemetry's forward (its output is the next layer's input and M-Act's residual), so layer
    1 and M-Act differ from the reference by the kernel's float32 rounding only."""
    record, jaxpr = _telemetry_as_training_runs_it(impl, segmented)
    assert ("pallas_call" in jaxpr) == (impl != "chunked")  # the kernel is in the program
    expected = _xla_reference(segmented)
    for i, per_head in enumerate(expected["f_attn"]):
        np.testing.assert_allclose(record["f_attn_per_head"][i], per_head, rtol=1e-5,
                                   atol=1e-6, err_msg=f"layer {i}")
    np.testing.assert_allclose(record["m_act_per_layer"], expected["m_act"], rtol=1e-5)
    np.testing.assert_allclose(record["gate_mean_per_layer"], expected["gate_mean"], rtol=1e-5)
    heads = np.concatenate(expected["f_attn"])
    assert record["sink_rate"] == pytest.approx(np.mean(heads > telemetry.SINK_THRESHOLD))
    assert heads.std() > 0.05  # heads differ: not a uniform model


@pytest.mark.slow  # two deviceless XLA:GPU compiles, about 6 s each
@pytest.mark.needs("jax_plugins.xla_cuda12")
@pytest.mark.reference("smoke")
@pytest.mark.parametrize("impl", ["cudnn", "cudnn_packed"])
def test_telemetry_compiles_for_an_h200_with_cudnn(impl):
    """No GPU here, and the F-Attn it reports comes from plain XLA on any kernel (above): what
    cuDNN could break is the telemetry's program itself. Compiled deviceless for an H200 as
    the pre-flight compiles it (the training shardings): one cuDNN forward per layer, no
    backward, and a statistic per layer and head. impl="cudnn" takes no segment ids, so its
    batch is unpacked rows; cudnn_packed takes the training batch (packed rows)."""
    config = _config(impl=impl)
    config.model.dtype = "bfloat16"  # cuDNN's flash attention is 16-bit only
    config.train.batch_size = 2
    mesh = preflight.gpu_mesh(preflight.parse_target("h200-1"), config.mesh)
    batch = None
    if impl == "cudnn":
        rules = sharding.rules_from_config(config.mesh)
        packed = preflight.abstract_batch(config, mesh, rules)
        batch = {k: packed[k] for k in ("inputs", "positions")}
    step = preflight.compile_telemetry(config, mesh, platform="gpu", batch=batch)
    calls = re.findall(r'custom_call_target="([^"]+)"', step.hlo_text)
    assert calls.count("__cudnn$fmhaSoftmax") == config.model.num_layers, calls
    assert not any("Backward" in c for c in calls)
    f_attn = step.compiled.out_info["f_attn_per_head"]
    assert [x.shape for x in f_attn] == [(config.model.num_heads,)] * config.model.num_layers


def _preflight_config():
    """tests/test_preflight.py's tiny config (2 scanned layers, the Pallas TPU kernel),
    without remat and eval: the cheapest train step beside the telemetry."""
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.num_layers = 2
    config.model.scan_layers = True
    config.model.attention_impl = "pallas_tpu"
    config.train.batch_size = 8
    config.train.eval_every = 0
    return config


@pytest.mark.slow  # a train step and a telemetry compiled by libtpu: about 20 s
@pytest.mark.needs("libtpu")
@pytest.mark.reference("independent")
def test_preflight_compiles_the_telemetry_beside_the_train_step(tmp_path, monkeypatch):
    """A run with telemetry_every > 0 calls the telemetry function at step telemetry_every:
    the pre-flight compiles it for the slice with the training shardings and judges its
    memory like a step's (with the train state resident), so it cannot first fail there."""
    config = _preflight_config()
    assert preflight.steps_main_runs(config) == ("train", "telemetry")
    compiled = {}  # each program compiled once; the verdicts below reuse them
    real_step, real_telemetry = preflight.compile_step, preflight.compile_telemetry

    def compile_step(config, mesh, name, **kwargs):
        return compiled.get(name) or compiled.setdefault(
            name, real_step(config, mesh, name, **kwargs))

    def compile_telemetry(config, mesh, **kwargs):
        return compiled.get("telemetry") or compiled.setdefault(
            "telemetry", real_telemetry(config, mesh, **kwargs))

    monkeypatch.setattr(preflight, "compile_step", compile_step)
    monkeypatch.setattr(preflight, "compile_telemetry", compile_telemetry)
    tpu = preflight.parse_target("v5litepod-4")
    info = preflight.preflight(config, tpu, dump_hlo=tmp_path / "hlo")
    assert list(info["steps"]) == ["train", "telemetry"] and info["fits"]
    tele, step = info["steps"]["telemetry"], info["steps"]["train"]
    # Arguments: the float32 weights (replicated over data=4) and this device's quarter of
    # the batch arrays the telemetry reads (inputs, positions, segment ids: int32 [2, 256]);
    # jit drops the two it does not read.
    params = memory.parameter_bytes(run_config.model_config(config), info["mesh"])
    assert params == 4 * 2 * (128 * 128 * 4 + 128 * 384 * 3 + 2 * 128 + 2 * 32) + 4 * (
        1024 * 128 + 128)  # q,k,v(GQA 2 of 4 heads),o,gate = 4 of D x 128; 3 FFN; 4 norms
    assert math.isclose(tele["memory"]["arguments"], params + 3 * 2 * 256 * 4, rel_tol=0.01)
    # Its total counts the AdamW moments that stay resident beside it: over 3 x the weights.
    assert tele["memory"]["total"] >= 3 * params and tele["headroom"] == (
        16 * 2**30 - tele["memory"]["total"])
    # The forward only: the Pallas kernel once in the one scanned block, compiled by Mosaic
    # (no interpreter), against forward, dq and dk/dv in the train step (no remat).
    assert (tele["mosaic_kernels"], step["mosaic_kernels"]) == (1, 3)
    hlo = (tmp_path / "hlo" / "telemetry_step.hlo.txt").read_text()
    assert "tpu_custom_call" in hlo and "callback" not in hlo.lower()
    assert 0 < tele["flops_per_device"] < step["flops_per_device"]
    text = preflight.format_report(info)
    assert re.search(r"^per device +train step +telemetry$", text, re.M), text
    assert "note: telemetry runs once every 100 steps" in text
    assert text.endswith("=> fits on v5litepod-4")
    # Judged like a step: on a chip too small for it, or refused by the compiler, the
    # pre-flight says the run does not fit.
    small = dataclasses.replace(tpu, generation=dataclasses.replace(
        tpu.generation, hbm_bytes=tele["memory"]["total"] - 1))
    refused = preflight.preflight(config, small)
    assert not refused["fits"] and not refused["steps"]["telemetry"]["fits"]

    def out_of_memory(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory in memory "
                                         "space hbm ...")

    monkeypatch.setattr(preflight, "compile_telemetry", out_of_memory)
    oom = preflight.preflight(config, tpu)
    assert oom["steps"]["train"]["fits"] and not oom["fits"]
    assert "telemetry: refused by the compiler: RESOURCE_EXHAUSTED" in \
        preflight.format_report(oom)
    config.train.telemetry_every = 0  # off: not compiled
    assert preflight.steps_main_runs(config) == ("train",)


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
    loop.run(config, workdir, progress=False, devices=jax.devices()[:1])
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
    from gated_attention.analysis import telemetry_report

    uniform = telemetry_report.uniform_first_token(64)
    # mean of 1/(i+1) for i = 1..63, by hand: (H_64 - 1) / 63
    assert uniform == pytest.approx((sum(1 / n for n in range(1, 65)) - 1) / 63)
    points = [{"step": 0, "f_attn_per_layer": [uniform, uniform]},
              {"step": 100, "f_attn_per_layer": [2.9 * uniform, uniform]},
              {"step": 200, "f_attn_per_layer": [3.1 * uniform, uniform]}]
    assert telemetry_report.emergence(points, uniform) == [200, None]
    # points without their own level fall back to the whole row's; with it, their mean
    assert telemetry_report.uniform_level(points, 64) == uniform
    assert telemetry_report.uniform_level([{"f_attn_uniform": 0.1}, {"f_attn_uniform": 0.2}],
                                          64) == pytest.approx(0.15)
    run = tmp_path / "baseline"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "telemetry", **p}) + "\n"
                                               for p in points))
    lines = telemetry_report.report_lines(tmp_path, ["baseline"], 64, 1000, "sinks")
    assert "| baseline | 0 | 200 | 200,000 | 0.184 |" in lines
    assert (tmp_path / "sink_emergence.png").exists()
