"""Training end to end with a tokenizer.json trained here, on prepared ArrayRecord shards (a
run killed mid-shard resumes bit for bit) and on a tfds dataset built here, both with
data.packing=concat (one compiled step serves all runs); the epoch guard refuses before
compiling."""

import json

import jax
import numpy as np
import pytest
from data_fixtures import texts, tiny_tfds_builder, train_bpe, write_jsonl

from gated_attention.config import run_config
from gated_attention.data import prepare
from gated_attention.training import loop
from gated_attention.training import step as step_lib
from gated_attention.training.metrics_writer import read_jsonl


def _config(root, **data):
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(vocab_size=384, num_layers=1, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=16, mlp_dim=64))
    config.data.update(dict(source="files", paths=str(root / "c.jsonl"), tokenizer="hf",
                            tokenizer_path=str(root / "tokenizer.json"), seq_len=32,
                            cache_dir=str(root / "cache"), eval_fraction=0.2,
                            packing="concat"))
    config.data.update(data)
    config.train.update(dict(steps=8, batch_size=4, eval_every=8, eval_batches=1, log_every=1,
                             checkpoint_every=4, async_checkpoint=False))
    config.optimizer.update(dict(warmup_steps=1, peak_lr=1e-2))
    return config


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    root = tmp_path_factory.mktemp("data_train")
    jax.config.update("jax_compilation_cache_dir", str(root / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    corpus = texts(80)
    write_jsonl(root / "c.jsonl", corpus)
    train_bpe(root / "tokenizer.json", corpus, 320)
    prepare.prepare(_config(root), str(root / "shards"), num_shards=2)
    return root


def _run(config, run_dir, **kwargs):
    return loop.run(config, run_dir, progress=False, devices=jax.devices()[:1], **kwargs)


def _params(run_dir):
    from flax import nnx

    model, _ = loop.load_params(run_dir)
    return jax.tree.leaves(nnx.state(model, nnx.Param))


def test_a_run_on_shards_resumes_mid_shard_bit_for_bit(shards):
    root = shards
    config = _config(root, source="array_record", paths=str(root / "shards"), tokenizer_path="")
    summary = _run(config, root / "straight")
    # An untrained model of 384 outputs starts near log(384); eight steps move it down.
    losses = [r["loss"] for r in read_jsonl(root / "straight" / "metrics.jsonl")
              if r["kind"] == "train"]
    assert abs(losses[0] - np.log(384)) < 0.3 and losses[-1] < losses[0] - 0.3
    assert np.isfinite(summary["eval"]["loss"])
    data = json.loads((root / "straight" / "data_summary.json").read_text())
    assert data["tokenizer"]["kind"] == "hf" and data["tokenizer"]["vocab_size"] == 320
    assert (root / "straight" / "tokenizer.json").read_text() == \
        (root / "tokenizer.json").read_text()
    # Killed after step 6 (last checkpoint at 4, in the middle of the shards), then resumed.
    _run(config, root / "resumed", stop_after=6)
    _run(config, root / "resumed")
    for a, b in zip(_params(root / "straight"), _params(root / "resumed"), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    after = [r["loss"] for r in read_jsonl(root / "resumed" / "metrics.jsonl")
             if r["kind"] == "train"]
    assert after == losses


def test_the_epoch_guard_refuses_before_compiling(shards, monkeypatch):
    root = shards
    config = _config(root, source="array_record", paths=str(root / "shards"), tokenizer_path="")
    manifest = json.loads((root / "shards" / "manifest.json").read_text())
    tokens = manifest["splits"]["train"]["tokens"]
    config.train.steps = 5 * tokens // (4 * 32) + 1  # just over 5 epochs
    config.data.max_epochs = 5.0

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled although the epoch guard should have refused")

    monkeypatch.setattr(step_lib, "train_state_spec", no_compile)
    with pytest.raises(run_config.ConfigError, match=r"is 5.0 epochs of the training split of "
                       r"data.source='array_record' .* more than data.max_epochs=5; use a "
                       r"larger dataset"):
        _run(config, root / "too_long")


def test_a_run_on_a_tfds_dataset(shards):
    root = shards
    tiny_tfds_builder(texts(80), "GaTinyTrainText")(data_dir=str(root / "tfds")
                                                    ).download_and_prepare()
    config = _config(root, source="tfds", tfds=dict(name="ga_tiny_train_text"),
                     tfds_data_dir=str(root / "tfds"))
    config.train.update(dict(steps=4, checkpoint_every=0))
    summary = _run(config, root / "tfds_run")
    assert summary["train"]["step"] == 4 and np.isfinite(summary["eval"]["loss"])
    data = json.loads((root / "tfds_run" / "data_summary.json").read_text())
    assert data["source"] == "tfds" and data["train"]["documents"] == len(texts(80))
