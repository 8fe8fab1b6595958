"""A data source is one module and one line in data/registry.py's SOURCES.

This file is such a module: a toy counting source (token t of row r of batch i is
(i + r + t) mod data.toy.period, shifted past the special ids), registered with one line
(monkeypatched into SOURCES), its section added to the config by base_config, checked by
validate_run_config and read or trained on through the normal config path.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import grain
import jax
import numpy as np
import pytest

from gated_attention.config import run_config
from gated_attention.core.checks import ConfigError, require
from gated_attention.data import registry
from gated_attention.data.inputs import Inputs
from gated_attention.training import loop

# --------------------------------------------------------- the toy source (the whole module)
SECTION = "toy"  # config.data.toy
FIELDS = dict(period=7)  # tokens count up modulo this period
OWN_VOCABULARY = True  # the counter's values are the token ids
FIRST_ID = 3  # ids 0..2 are pad, bos, eos in every tokenizer of the package


def check(config: Any, cfg: Any) -> None:
    period = config.data.toy.period
    require(2 <= period <= cfg.vocab_size - FIRST_ID, f"data.toy.period={period} must be in "
            f"2..model.vocab_size - {FIRST_ID} = {cfg.vocab_size - FIRST_ID}")


class _Counting:
    """Random access to batch i (a grain data source: resumable by index)."""

    def __init__(self, period: int, rows: int, seq_len: int, length: int):
        self.period, self.rows, self.seq_len, self.length = period, rows, seq_len, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        grid = index + np.arange(self.rows)[:, None] + np.arange(self.seq_len + 1)[None, :]
        tokens = (FIRST_ID + grid % self.period).astype(np.int32)
        ones = np.ones((self.rows, self.seq_len), np.int32)
        return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": ones,
                "positions": np.broadcast_to(np.arange(self.seq_len, dtype=np.int32),
                                             ones.shape).copy(), "mask": ones}


def build_inputs(config: Any, workdir: Any = None, *, process_index: int = 0,
                 process_count: int = 1) -> Inputs:
    data, train_section = config.data, config.train
    rows = train_section.batch_size // process_count
    source = _Counting(int(data.toy.period), rows, int(data.seq_len), 2**62)
    iterator = iter(grain.MapDataset.source(source).to_iter_dataset())
    evals = [_Counting(int(data.toy.period), rows, int(data.seq_len), 1)[0]
             for _ in range(int(train_section.eval_batches))]
    return Inputs(iterator, evals, None, {"source": "toy_counting"})

# ------------------------------------------------------------------------ the tests


@pytest.fixture
def toy_source(monkeypatch):
    monkeypatch.setitem(registry.SOURCES, "toy_counting", __name__)  # the one registry line


def toy_config(**data):
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(vocab_size=64, num_layers=1, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=16, mlp_dim=64))
    config.data.update(dict(source="toy_counting", seq_len=16, **data))
    config.train.update(dict(steps=3, batch_size=4, eval_every=0, eval_batches=1, log_every=1,
                             checkpoint_every=0, telemetry_every=0))
    config.optimizer.update(dict(warmup_steps=1))
    return config


@pytest.mark.reference("independent")
def test_a_registered_source_adds_its_section_and_its_batches(toy_source):
    assert run_config.base_config("tiny").data.toy.to_dict() == {"period": 7}  # its defaults
    config = toy_config(toy=dict(period=5))
    assert "toy_period" not in config.data  # flat aliases are the old sources' alone
    run_config.validate_run_config(config)
    from gated_attention.data import build_inputs as package_build_inputs

    batch = next(package_build_inputs(config, None).train)
    # Written out by hand: batch 0, row r, token t is 3 + (r + t) mod 5.
    row1 = [3 + (1 + t) % 5 for t in range(17)]
    np.testing.assert_array_equal(batch["inputs"][1], row1[:-1])
    np.testing.assert_array_equal(batch["targets"][1], row1[1:])
    assert batch["inputs"].shape == (4, 16)


@pytest.mark.reference("error_message")
def test_a_registered_source_checks_its_own_field(toy_source):
    with pytest.raises(ConfigError, match=r"^data.toy.period=1 must be in 2..model.vocab_size "
                                          r"- 3 = 61$"):
        run_config.validate_run_config(toy_config(toy=dict(period=1)))


@pytest.mark.reference("error_message")
def test_an_unregistered_source_names_the_registered_ones():
    config = run_config.base_config("tiny")
    config.data.source = "toy_counting"
    with pytest.raises(ConfigError, match=r"^data.source='toy_counting' is not allowed; choose "
                                          r"one of cpython_docs, python_source, files, seqio"):
        run_config.validate_run_config(config)


@pytest.mark.reference("error_message")
@pytest.mark.parametrize("section", ["passkey", "paths"])
def test_a_section_name_is_claimed_once(monkeypatch, section):
    """A section named like another source's, or like a shared data-level field, is a bug."""
    monkeypatch.setitem(registry.SOURCES, "toy_counting", __name__)
    monkeypatch.setattr(sys.modules[__name__], "SECTION", section)
    with pytest.raises(ValueError, match=rf"^data.{section} is claimed twice"):
        run_config.base_config("tiny")


@pytest.mark.slow
@pytest.mark.reference("smoke")
def test_a_registered_source_trains_through_the_normal_path(toy_source, tmp_path):
    summary = loop.run(toy_config(), tmp_path / "run", progress=False,
                        devices=jax.devices()[:1])
    assert summary["train"]["step"] == 3
    assert np.isfinite(summary["train"]["loss"])
    assert json.loads((tmp_path / "run" / "config.json").read_text())["data"]["toy"] == {
        "period": 7}


# ------------------------------------------------------------ data.source=synthetic


def synthetic_config(**train_fields):
    config = toy_config()
    config.data.source = "synthetic"
    config.train.update(train_fields)
    return config


@pytest.mark.reference("independent")
def test_synthetic_batches_are_uniform_ids_in_the_config_shapes():
    """Uniform over ids 3..63 (61 of them): over 64 x 256 tokens each id's count is within
    5 binomial standard deviations of 16384 / 61; batch i does not depend on what came
    before or on the host count (two hosts' rows make the one-host batch)."""
    from gated_attention.data import build_inputs
    from gated_attention.data.synthetic import source as synthetic

    config = synthetic_config(batch_size=64, eval_batches=2)
    config.data.seq_len = 255
    run_config.validate_run_config(config)
    inputs = build_inputs(config, None)
    batch = next(inputs.train)
    assert {k: v.shape for k, v in batch.items()} == {k: (64, 255) for k in batch}
    tokens = np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1)
    np.testing.assert_array_equal(batch["targets"][:, :-1], batch["inputs"][:, 1:])
    assert tokens.min() >= 3 and tokens.max() <= 63
    counts = np.bincount(tokens.reshape(-1), minlength=64)[3:]
    n, p = tokens.size, 1 / 61
    assert np.all(np.abs(counts - n * p) < 5 * np.sqrt(n * p * (1 - p))), counts
    np.testing.assert_array_equal(batch["segment_ids"], 1)
    np.testing.assert_array_equal(batch["mask"], 1)
    np.testing.assert_array_equal(batch["positions"][3], np.arange(255))
    assert len(inputs.eval_batches) == 2
    assert not np.array_equal(inputs.eval_batches[0]["inputs"], batch["inputs"])
    hosts = [next(build_inputs(config, None, process_index=i, process_count=2).train)
             for i in range(2)]
    np.testing.assert_array_equal(np.concatenate([h["inputs"] for h in hosts]),
                                  batch["inputs"])
    assert inputs.summary["source"] == "synthetic" and synthetic.FIRST_ID == 3


@pytest.mark.reference("independent")
def test_a_paper_size_model_on_synthetic_data_passes_the_data_checks_without_reading():
    """The 1.7B arch on the embedded corpus is refused by its data checks (its 151,936-id
    vocabulary cannot be learnt from it); on synthetic data nothing is read and there is no
    tokenizer to size, so the run's checks pass at once."""
    from gated_attention.training import run_checks

    config = run_config.base_config("dense_1p7b_28l", "g1_sdpa_elementwise")
    config.data.source = "synthetic"
    config.data.cache_dir = "/nonexistent/cache"  # nothing is read or written
    run_config.validate_run_config(config)
    assert run_checks.check_run(config) == {}


@pytest.mark.slow
@pytest.mark.reference("independent")
def test_a_model_trained_on_synthetic_data_starts_at_the_uniform_loss(tmp_path):
    """Targets uniform over 61 ids: a freshly initialised model's loss is about ln 64 (its
    logits near zero over the 64-id vocabulary), and no data file is written but the
    summary."""
    summary = loop.run(synthetic_config(steps=2), tmp_path / "run", progress=False,
                        devices=jax.devices()[:1])
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    first = next(r for r in records if r.get("step") == 1 and "loss" in r)
    assert abs(first["loss"] - np.log(64)) < 0.15, first
    assert summary["train"]["step"] == 2
    data = json.loads((tmp_path / "run" / "data_summary.json").read_text())
    assert data["source"] == "synthetic" and data["vocab_size"] == 64
