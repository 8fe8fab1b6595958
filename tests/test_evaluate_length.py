"""evaluate_length: perplexity at the training length is the analysis code's; results per
length, bucket, task and scaling; earlier results are kept; bad arguments are refused."""

import json

import jax
import numpy as np
import pytest
from flax import nnx
from test_train import mini_config

from gated_attention.analysis import length as evaluate_length
from gated_attention.analysis import stats
from gated_attention.config import run_config
from gated_attention.data import pipeline
from gated_attention.model.transformer import abstract_model
from gated_attention.training import loop


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("length")
    config = mini_config(root, steps=3, eval_every=0, checkpoint_every=0)
    config.optimizer.warmup_steps = 1
    loop.run(config, root / "run", progress=False, devices=jax.devices()[:1])
    return root / "run"


def test_perplexity_at_the_training_length_is_the_analysis_perplexity(trained):
    model, config = loop.load_params(trained)
    local = pipeline.load_local_data(config.data, config.model.vocab_size, trained)
    seq_len = config.data.seq_len
    batch = pipeline.analysis_batches(local, config.data, 4, 1)[0]  # what analyze measures
    rows, source = evaluate_length.held_out_rows(local, config.data, seq_len, 4)
    assert source == "held-out document chunks from position 0"
    np.testing.assert_array_equal(rows[:, :-1], batch["inputs"])
    np.testing.assert_array_equal(rows[:, 1:], batch["targets"])

    expected = stats.model_statistics(model, [batch])["perplexity"]
    cfg = evaluate_length.scaled_config(run_config.model_config(config), "none", seq_len, 1.0, 8)
    forward = evaluate_length.make_forward(nnx.split(abstract_model(cfg), nnx.Param, ...)[0])
    nll, _ = forward(nnx.state(model, nnx.Param), rows[:, :-1], rows[:, 1:])
    got = evaluate_length.perplexity_by_position(np.asarray(nll), np.ones(nll.shape), seq_len)
    assert got["perplexity"] == pytest.approx(expected, rel=1e-5)
    assert [(b["start"], b["end"]) for b in got["buckets"]] == [(0, 32)]


def test_evaluation_writes_every_length_and_keeps_earlier_results(trained, capsys):
    assert evaluate_length.position_buckets(300) == [(0, 64), (64, 128), (128, 256), (256, 300)]
    result = evaluate_length.evaluate(trained, [150, 64], scalings=("yarn",),
                                      tasks=("passkey",), examples=2, ppl_rows=2, batch_size=2,
                                      block=32)
    assert result["settings"]["lengths"] == [64, 150]
    assert result["settings"]["yarn_factor"] == pytest.approx(150 / 32)
    at_150 = result["results"]["yarn"]["150"]
    buckets = at_150["perplexity"]["buckets"]
    assert sum(b["tokens"] for b in buckets) == at_150["perplexity"]["tokens"] == 2 * 150
    assert np.isfinite(at_150["perplexity"]["perplexity"])
    passkey_150 = at_150["tasks"]["passkey"]
    assert len(passkey_150["scores"]) == 2 and set(passkey_150["scores"]) <= {0.0, 1.0}
    assert passkey_150["score"] == pytest.approx(np.mean(passkey_150["scores"]))
    too_short = result["results"]["yarn"]["64"]["tasks"]["passkey"]
    assert too_short["score"] is None and "too short" in too_short["note"]
    saved = trained / "length_eval" / "length_eval.json"
    assert json.loads(saved.read_text())["settings"] == result["settings"]
    # Other settings: the earlier result moves aside instead of being overwritten.
    evaluate_length.evaluate(trained, [64], scalings=("none",), tasks=(), ppl_rows=1)
    assert json.loads((trained / "length_eval.1" / "length_eval.json").read_text())[
        "settings"] == result["settings"]
    assert "none L=    64" in capsys.readouterr().out


@pytest.mark.parametrize("oracle, tasks, want", [
    ("targets", ("passkey", "variable_tracking"), 1.0), ("shifted", ("passkey",), 0.0)])
def test_task_scores_come_from_the_predictions_at_the_answer(trained, monkeypatch, oracle,
                                                             tasks, want):
    """A forward that predicts every target exactly scores 1 on each task at each length; one
    that predicts the token before each target (an off-by-one in the answer mask) scores 0 on
    the one-number pass key."""
    def fake_make_forward(graphdef):
        def forward(params, inputs, targets):
            predicted = targets if oracle == "targets" else inputs
            return np.zeros(np.shape(targets), np.float32), np.asarray(predicted)
        return forward

    monkeypatch.setattr(evaluate_length, "make_forward", fake_make_forward)
    result = evaluate_length.evaluate(trained, [512, 400], scalings=("none",),
                                      tasks=tasks, examples=2,
                                      ppl_rows=0, batch_size=2, block=32)
    for length in ("400", "512"):
        for task in tasks:
            entry = result["results"]["none"][length]["tasks"][task]
            assert entry.get("scores") == [want, want], (length, task, entry)


@pytest.mark.parametrize("kwargs, message", [
    (dict(lengths=[1]), "--lengths=.* must be integers >= 2"),
    (dict(lengths=[64], scalings=("dynamic",)), "'dynamic' is not allowed"),
    (dict(lengths=[64], tasks=("ruler",)), "task='ruler' is not allowed"),
    (dict(lengths=[64], batch_size=0), "--batch_size=0"),
])
def test_bad_arguments_are_refused_before_anything_is_written(trained, kwargs, message):
    before = sorted(p.name for p in trained.iterdir())
    with pytest.raises(ValueError, match=message):
        evaluate_length.evaluate(trained, **kwargs)
    assert sorted(p.name for p in trained.iterdir()) == before
