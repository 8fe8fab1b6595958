"""Training end to end on CPU: resume is bit-identical, loss falls, workdirs are protected,
and a workdir (and data) in a bucket works like a local one."""

import json
import os
from pydoc_data.topics import topics

import jax
import numpy as np
import pytest

from gated_attention.config import run_config
from gated_attention.data import corpus
from gated_attention.training import checkpoint, loop, workdir
from gated_attention.training import step as step_lib
from gated_attention.training.metrics_writer import SpikeDetector, read_jsonl


def mini_config(tmp_path, **train_overrides):
    """A 1-layer byte-level model on a few pages of the language reference."""
    corpus_file = tmp_path / "corpus.jsonl"
    if not corpus_file.exists():
        pages = [t for _, t in sorted(topics.items())[:60]]
        corpus_file.write_text("".join(json.dumps({"text": t}) + "\n" for t in pages))
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(vocab_size=260, num_layers=1, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=16, mlp_dim=64))
    config.data.update(dict(source="files", paths=str(corpus_file), tokenizer="byte",
                            seq_len=32, cache_dir=str(tmp_path / "cache"), eval_fraction=0.2))
    config.train.update(dict(steps=30, batch_size=8, eval_every=10, eval_batches=2,
                             log_every=1, checkpoint_every=10, async_checkpoint=True))
    config.train.update(train_overrides)
    config.optimizer.update(dict(warmup_steps=5, peak_lr=1e-2))
    return config


def run(config, run_dir, **kwargs):
    """One CPU device: 8 fake ones would only add collectives to a 1-layer model."""
    return loop.run(config, run_dir, progress=False, devices=jax.devices()[:1], **kwargs)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """An uninterrupted 30-step run (the compiled steps are cached for the other runs)."""
    root = tmp_path_factory.mktemp("train")
    jax.config.update("jax_compilation_cache_dir", str(root / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    config = mini_config(root)
    summary = run(config, root / "straight")
    return root, config, summary


def _params(run_dir):
    from flax import nnx

    model, _ = loop.load_params(run_dir)
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_resumed_run_matches_uninterrupted_run_bit_for_bit(straight):
    root, config, _ = straight
    # "Kill" a second run after step 15 (its last checkpoint is step 10), then start again.
    run(config, root / "resumed", stop_after=15)
    assert max(r["step"] for r in read_jsonl(root / "resumed" / "metrics.jsonl")) == 15
    run(config, root / "resumed")
    for a, b in zip(_params(root / "straight"), _params(root / "resumed"), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    before = read_jsonl(root / "straight" / "metrics.jsonl")
    after = read_jsonl(root / "resumed" / "metrics.jsonl")
    key = lambda r: (r["kind"], r["step"])  # noqa: E731
    assert [key(r) for r in after] == [key(r) for r in before]
    assert [r["loss"] for r in after] == [r["loss"] for r in before]
    assert [r.get("grad_norm") for r in after] == [r.get("grad_norm") for r in before]


def test_loss_decreases_within_a_few_dozen_steps(straight):
    root, _, summary = straight
    losses = [r["loss"] for r in read_jsonl(root / "straight" / "metrics.jsonl")
              if r["kind"] == "train"]
    uniform = np.log(260)  # an untrained model is near the uniform distribution's loss
    assert abs(losses[0] - uniform) < 0.3
    # Reference: the unigram (byte frequency) entropy of the corpus.
    text = "".join(json.loads(line)["text"] for line in
                   (root / "corpus.jsonl").read_text().splitlines()).encode()
    freq = np.bincount(np.frombuffer(text, np.uint8), minlength=256) / len(text)
    unigram = -np.sum(freq[freq > 0] * np.log(freq[freq > 0]))
    assert np.mean(losses[-5:]) < unigram + 0.3 < uniform - 1.0
    assert summary["eval"]["loss"] < uniform - 1.5


def test_workdir_refuses_a_different_config_and_backs_up_on_overwrite(tmp_path):
    config = mini_config(tmp_path)
    run_dir = tmp_path / "run"
    assert workdir.prepare(run_dir, config) == "new"
    (run_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    assert workdir.prepare(run_dir, config) == "resume"
    other = mini_config(tmp_path)
    other.optimizer.peak_lr = 2e-2
    with pytest.raises(workdir.WorkdirError, match=r"optimizer.peak_lr: 0.01 -> 0.02"):
        workdir.prepare(run_dir, other)
    assert workdir.prepare(run_dir, other, overwrite=True) == "new"
    backups = list(tmp_path.glob("run.backup-*"))
    assert len(backups) == 1
    assert (backups[0] / "metrics.jsonl").read_text() == '{"step": 1}\n'
    assert json.loads((backups[0] / "config.json").read_text())["optimizer"]["peak_lr"] == 1e-2
    assert json.loads((run_dir / "config.json").read_text())["optimizer"]["peak_lr"] == 2e-2
    (tmp_path / "stranger").mkdir()
    (tmp_path / "stranger" / "notes.txt").write_text("mine")
    with pytest.raises(workdir.WorkdirError, match="not a run of ours"):
        workdir.prepare(tmp_path / "stranger", config)


def test_workdir_is_checked_by_every_process_before_the_primary_writes(tmp_path):
    """A second host must judge the workdir as it was, not the primary's half-written one."""
    config = mini_config(tmp_path)
    run_dir = tmp_path / "run"
    reached = []

    def barrier(name):  # meanwhile, on host 0: the config and the first data files appear
        reached.append(name)
        if name == "workdir checked":
            assert workdir.prepare(run_dir, config) == "new"
            (run_dir / "data_summary.json").write_text("{}")

    assert workdir.prepare(run_dir, config, is_primary=False, barrier=barrier) == "new"
    assert reached == ["workdir checked", "workdir ready"]
    other = mini_config(tmp_path, steps=20)  # fewer steps: refused (more would extend the run)
    with pytest.raises(workdir.WorkdirError, match="train.steps: 30 -> 20"):
        workdir.prepare(run_dir, other, is_primary=False, barrier=reached.append)
    assert reached == ["workdir checked", "workdir ready"]  # refused before the barrier


def test_spike_rule():
    detector = SpikeDetector(factor=1.5, decay=0.9, warmup_steps=3)
    flags = [detector.update(s, loss) for s, loss in
             enumerate([10.0, 2.0, 9.0, 2.0, 2.0, 6.0, 2.0], start=1)]
    # EMA before step 6: 10 -> 9.2 -> 9.18 -> 8.462 -> 7.8158; 6.0 < 1.5 x 7.8 (no spike);
    # step 3 (9.0 > 1.5 x 9.2? no) is inside warm-up anyway.
    assert flags == [False] * 7
    detector = SpikeDetector(factor=1.5, decay=0.9, warmup_steps=0)
    assert [detector.update(s, x) for s, x in enumerate([2.0, 2.0, 3.1, 2.0])] == [
        False, False, True, False]


def test_gradient_accumulation_matches_one_big_batch(straight):
    """k micro-batches averaged in a scan = one batch (equal token counts per micro-batch).

    The accum=1 step is the fixture's run's step, so it comes from the compilation cache.
    """
    from gated_attention.parallel import sharding

    root, _, _ = straight
    mesh = sharding.create_mesh({"data": -1}, devices=jax.devices()[:1])
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(3, 260, (8, 32), dtype=np.int32),
             "targets": rng.integers(3, 260, (8, 32), dtype=np.int32),
             "segment_ids": np.ones((8, 32), np.int32),
             "positions": np.tile(np.arange(32, dtype=np.int32), (8, 1)),
             "mask": np.ones((8, 32), np.int32)}
    results = []
    for accum in (1, 4):
        config = mini_config(root, grad_accum=accum)
        graphdef, state, shardings = step_lib.create_train_state(config, mesh)
        step = step_lib.jit_train_step(step_lib.make_train_step(graphdef, config), mesh, shardings)
        state, metrics = step(state, batch)
        results.append((jax.tree.leaves(state["params"]), metrics))
    (p1, m1), (p4, m4) = results
    np.testing.assert_allclose(float(m4["loss"]), float(m1["loss"]), rtol=1e-5)
    np.testing.assert_allclose(float(m4["grad_norm"]), float(m1["grad_norm"]), rtol=1e-4)
    assert float(m4["tokens"]) == float(m1["tokens"]) == 8 * 32
    for a, b in zip(p1, p4, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


# A workdir in a bucket (gs://, faked locally by conftest's `fake_bucket`).
RUN = "gs://bucket/runs/g1"


@pytest.fixture
def bucket_checkpoints(fake_bucket, tmp_path, monkeypatch):
    """orbax writes tensors to gs:// through tensorstore's own GCS driver, which no local
    fake reaches: checkpoints of gs:// workdirs go to a local mirror folder instead (outside
    the fake bucket), and the workdirs the trainer asked for are recorded."""
    asked, mirror = [], tmp_path / "orbax_mirror"

    class MirroredCheckpointer(checkpoint.Checkpointer):
        def __init__(self, run_dir, **kwargs):
            asked.append(os.fspath(run_dir))
            super().__init__(os.fspath(run_dir).replace("gs://", f"{mirror}/", 1), **kwargs)

    monkeypatch.setattr(checkpoint, "Checkpointer", MirroredCheckpointer)
    return fake_bucket, mirror, asked


def test_training_in_a_bucket_resumes_and_matches_a_local_run(straight, bucket_checkpoints):
    """Killed after 15 steps and resumed from its step-10 checkpoint in the bucket, the run's
    losses equal those of the straight run in a local workdir."""
    root, config, local = straight
    store, mirror, asked = bucket_checkpoints
    devices = jax.devices()[:1]
    loop.run(config, RUN, progress=False, devices=devices, stop_after=15)
    run_dir = store / "bucket" / "runs" / "g1"
    assert max(r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")) == 15
    summary = loop.run(config, RUN, progress=False, devices=devices)

    # orbax was handed the bucket path itself (then mirrored locally by the fixture)
    assert asked == [RUN, RUN]
    assert summary["workdir"] == RUN
    assert json.loads((run_dir / "summary.json").read_text())["workdir"] == RUN
    assert json.loads((run_dir / "config.json").read_text())["train"]["steps"] == 30
    assert (run_dir / "data_summary.json").exists()
    checkpoints = mirror / "bucket" / "runs" / "g1" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["10", "20", "30"]
    events = list((run_dir / "tb").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0

    key = lambda r: (r["kind"], r["step"], r["loss"])  # noqa: E731
    resumed = [key(r) for r in read_jsonl(run_dir / "metrics.jsonl")]
    straight = [key(r) for r in read_jsonl(root / "straight" / "metrics.jsonl")]
    assert resumed == straight
    assert summary["eval"]["loss"] == local["eval"]["loss"]

    other = mini_config(root, steps=20)  # a different run in the same bucket workdir
    with pytest.raises(workdir.WorkdirError, match="train.steps: 30 -> 20"):
        loop.run(other, RUN, progress=False, devices=devices)
    workdir.prepare(RUN, other, overwrite=True)  # the old run is moved aside, never deleted
    backups = [p for p in (store / "bucket" / "runs").iterdir() if ".backup-" in p.name]
    assert len(backups) == 1 and (backups[0] / "metrics.jsonl").read_text().count("\n") == 33
    assert json.loads((run_dir / "config.json").read_text())["train"]["steps"] == 20


def test_data_files_in_a_bucket(fake_bucket):
    folder = fake_bucket / "bucket" / "c4"
    (folder / "en").mkdir(parents=True)
    (folder / "en" / "a.jsonl").write_text('{"text": "first"}\n{"text": "second"}\n')
    (folder / "en" / "b.txt").write_text("third")
    docs = corpus.text_files("gs://bucket/c4/en/*.jsonl,gs://bucket/c4/en/b.txt")
    assert [(d.name, d.text) for d in docs] == [
        ("gs://bucket/c4/en/a.jsonl:0", "first"), ("gs://bucket/c4/en/a.jsonl:1", "second"),
        ("gs://bucket/c4/en/b.txt", "third")]
    with pytest.raises(FileNotFoundError, match="gs://bucket/c4/fr/\\*.jsonl"):
        corpus.text_files("gs://bucket/c4/fr/*.jsonl")


def test_micro_batched_eval_sums_to_the_whole_batch_eval():
    """grad_accum pieces in the eval step (paper-size batches): same nll sum and tokens."""
    from flax import nnx

    from gated_attention.model.transformer import build_model

    config = run_config.base_config("tiny", "g1_sdpa_headwise")
    # A small model: the sums' equality does not depend on its size (the tiny arch's own
    # 4 x 128 with 8,192 tokens cost 15 CPU-s here, mostly its init and the whole-batch eval).
    config.model.update(dict(num_layers=2, d_model=32, num_heads=2, num_kv_heads=1,
                             head_dim=16, mlp_dim=64, vocab_size=260))
    model = build_model(run_config.model_config(config), seed=1)
    graphdef, params = nnx.split(model)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.model.vocab_size, (8, 17))
    mask = (rng.random((8, 16)) > 0.2).astype(np.float32)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "mask": mask,
             "positions": np.broadcast_to(np.arange(16), (8, 16)),
             "segment_ids": np.ones((8, 16), np.int32)}
    whole = jax.jit(step_lib.make_eval_step(graphdef))(params, batch)
    pieces = jax.jit(step_lib.make_eval_step(graphdef, micro_batches=4))(params, batch)
    assert float(pieces["tokens"]) == float(mask.sum())
    np.testing.assert_allclose(float(pieces["nll_sum"]), float(whole["nll_sum"]), rtol=1e-5)
    # micro-batch i holds rows i and i + 4 (each piece spread over the data shards)
    micro = step_lib.split_micro_batches(batch, 4)
    np.testing.assert_array_equal(np.asarray(micro["inputs"][1]), tokens[[1, 5], :-1])


def test_micro_batched_eval_of_a_scanned_model_traces():
    """Scanned layers inside the eval micro-batch scan (the paper archs' default)."""
    from flax import nnx

    from gated_attention.model.transformer import build_model, per_layer

    config = run_config.base_config("tiny", "baseline")
    config.model.update(dict(num_layers=2, d_model=32, num_heads=2, num_kv_heads=1,
                             head_dim=16, mlp_dim=64, vocab_size=260))
    cfg = run_config.model_config(config)
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.model.vocab_size, (4, 9))
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "mask": np.ones((4, 8)),
             "positions": np.broadcast_to(np.arange(8), (4, 8)),
             "segment_ids": np.ones((4, 8), np.int32)}
    scanned = build_model(cfg.replace(scan_layers=True), seed=2)
    sums = []
    for model in (scanned, per_layer(scanned)):  # the same weights, stacked and per layer
        graphdef, params = nnx.split(model)
        sums.append(float(jax.jit(step_lib.make_eval_step(graphdef, 2))(params, batch)["nll_sum"]))
    np.testing.assert_allclose(sums[0], sums[1], rtol=1e-5)
