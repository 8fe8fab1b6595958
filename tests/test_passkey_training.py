"""A tiny model trained on pass keys at 64 tokens retrieves whole keys at 64 tokens, far
above chance: trained with the project's model and train step, scored on held-out keys through
evaluate_length's forward pass and retrieval_tasks' exact scorer."""

import re

import jax
import numpy as np
import pytest
from flax import nnx

from gated_attention.analysis import length as evaluate_length
from gated_attention.analysis import retrieval_scores as rt
from gated_attention.config import run_config
from gated_attention.data.synthetic import passkey
from gated_attention.data.tokenizer import ByteTokenizer
from gated_attention.model.transformer import abstract_model
from gated_attention.ops import cpu_compile
from gated_attention.parallel import sharding
from gated_attention.training import loop
from gated_attention.training import step as step_lib

# 300 steps of 16 rows at 64 tokens, Adam at a constant 3e-2 (measured 2026-12-03, this
# training compiled as below, this file run alone): 0.98 of the answer digits and 59 of 64
# whole keys right at 64 tokens; with 150 steps 0.69 and 26 of 64, so 300 leave a wide
# margin above the thresholds below. (At 128 tokens the same 300 steps reached only 0.47 to
# 0.62 of the digits, at three times this training's cost; at 256 tokens and 1e-2 the copy
# took 600 steps.)
LENGTH, STEPS, BATCH, DIGITS, EXAMPLES, PEAK_LR = 64, 300, 16, 4, 64, 3e-2
# The training's one program is compiled with XLA's default CPU optimisations (its MLIR fusion
# emitters included), named here so that no XLA_FLAGS of the test process can change them
# (gated_attention/ops/cpu_compile.py's cheap settings make each step about twice as slow).
OPTIMIZED = {"xla_backend_optimization_level": 2, "xla_llvm_disable_expensive_passes": False,
             **cpu_compile.fusion_emitters(True)}
TOKENIZER = ByteTokenizer(260)
COUNT = rt.token_counter(TOKENIZER, add_bos=False)
# Keys are uniform over [1000, 10000) and independent of everything but the needle, so without
# retrieval a model gets a key right with probability 1 / 9000, and one digit with
# probability at most 1/9 (the first digit is one of 1..9, every other one of 0..9).
CHANCE_EXACT, CHANCE_DIGIT = 1 / (9 * 10 ** (DIGITS - 1)), 1 / 9


def tiny_config():
    """arch=passkey_tiny: 2 layers of width 64, 4 heads of 16, bytes; Adam at a constant
    PEAK_LR after warm-up."""
    config = run_config.base_config("passkey_tiny", "baseline")
    assert (config.data.source, config.data.tokenizer, config.model.vocab_size) == (
        "passkey", "byte", 260)
    config.data.update(dict(seq_len=LENGTH))
    config.train.update(dict(steps=STEPS, batch_size=BATCH))
    config.optimizer.update(dict(warmup_steps=15, peak_lr=PEAK_LR, final_lr=PEAK_LR))
    return config


def held_out(length, count=EXAMPLES):
    rng = np.random.default_rng([7, length])  # training draws from default_rng([0, step])
    return [rt.marked_passkey(rng, length + 1, COUNT, DIGITS) for _ in range(count)]


def scores(forward, params, examples, length):
    """(mean exact-match score from the project's scorer, share of answer digits right)."""
    batch = rt.answer_batch(examples, TOKENIZER, length, add_bos=False)
    _, predicted = forward(params, batch["inputs"], batch["targets"])
    predicted, at = np.asarray(predicted), batch["answer_mask"] > 0
    exact = rt.score_predictions(examples, TOKENIZER, predicted, batch["answer_mask"])
    return float(np.mean(exact)), float(np.mean(predicted[at] == batch["targets"][at]))


@pytest.fixture(scope="module")
def trained():
    config = tiny_config()
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    graphdef, state, shardings = step_lib.create_train_state(config, mesh)
    step = step_lib.jit_train_step(step_lib.make_train_step(graphdef, config), mesh, shardings)
    first = passkey.packed_batch(TOKENIZER, LENGTH, BATCH, 0, digits=DIGITS)
    step = step.lower(state, first).compile(OPTIMIZED)  # the same program, optimised
    cfg = evaluate_length.scaled_config(run_config.model_config(config), "none", LENGTH, 1.0,
                                        LENGTH)
    forward = evaluate_length.make_forward(nnx.split(abstract_model(cfg), nnx.Param, ...)[0])
    before = scores(forward, state["params"], held_out(LENGTH), LENGTH)
    for i in range(STEPS):
        state, _ = step(state, passkey.packed_batch(TOKENIZER, LENGTH, BATCH, i, digits=DIGITS))
    return forward, state["params"], before


@pytest.mark.slow
def test_passkeys_are_retrieved_at_the_training_length_far_above_chance(trained):
    forward, params, before = trained
    # Held-out rows (another seed). Every 4-digit key occurs in training, but a key is drawn
    # independently of the filler, its depth and the row: only the needle tells it, so
    # memory cannot beat the chance levels above; only retrieval can.
    examples = held_out(LENGTH)
    exact, digit = scores(forward, params, examples, LENGTH)
    print(f"at {LENGTH}: exact {exact:.3f} (chance {CHANCE_EXACT:.1e}), per digit {digit:.3f} "
          f"(chance <= {CHANCE_DIGIT:.3f}); untrained: {before}")
    assert before[0] == 0.0 and before[1] < 2 * CHANCE_DIGIT  # untrained: chance level
    # 256 digits: at chance at most 28 +- 5 right; 0.4 is 102 (measured: 0.98). Whole keys: at
    # chance 64 / 9000 = 0.007 expected, 3 or more with probability < 1e-7 (measured: 59).
    assert digit >= 0.4
    assert exact >= 3 / EXAMPLES


@pytest.mark.slow
def test_whole_keys_are_copied_when_the_needle_is_near(trained):
    forward, params, _ = trained
    exact, digit = scores(forward, params, held_out(32), 32)
    print(f"at 32: exact {exact:.3f}, per digit {digit:.3f}")
    # Measured: 0.98 of the digits and 58 of 64 whole keys (chance 1 / 9000 each).
    assert digit >= 0.6 and exact >= 0.4


def test_rows_pack_marked_passkeys_with_the_loss_on_the_keys_only():
    batch = passkey.packed_batch(TOKENIZER, 128, 4, index=3, digits=DIGITS)
    again = passkey.packed_batch(TOKENIZER, 128, 4, index=3, digits=DIGITS)
    assert all(np.array_equal(batch[k], again[k]) for k in batch)  # batch i is fixed
    for row in range(4):
        segments = batch["segment_ids"][row]
        for segment in set(segments[segments > 0].tolist()):
            at = np.flatnonzero(segments == segment)
            np.testing.assert_array_equal(batch["positions"][row, at], np.arange(len(at)))
            text = TOKENIZER.decode(batch["inputs"][row, at].tolist())
            needle = re.match(rf".*#(\d{{{DIGITS}}})\. ", text).group(1)  # the key in the filler
            in_mask = (batch["mask"][row] > 0) & (segments == segment)
            answer = TOKENIZER.decode(batch["targets"][row, in_mask].tolist())
            assert answer == needle  # the prompt ends " #", the key follows (its last token
            assert (text + needle[-1]).endswith(" #" + needle) or text.endswith(" #" + needle)
            # is an input only when the segment ends before the row does)
    with pytest.raises(ValueError, match="min_tokens=10 must be in"):
        passkey.packed_batch(TOKENIZER, 128, 1, 0, min_tokens=10)


def passkey_run_config(**data):
    config = tiny_config()
    config.data.update(dict(source="passkey", seq_len=64, **data))
    config.train.update(dict(steps=3, batch_size=4, eval_every=3, eval_batches=1,
                             checkpoint_every=3, log_every=1))
    config.optimizer.warmup_steps = 1
    return config


def test_passkey_source_serves_each_host_its_rows_of_the_global_batch():
    config = passkey_run_config(passkey=dict(digits=6))
    both = [passkey.build_inputs(config, process_index=i, process_count=2) for i in range(2)]
    whole = passkey.packed_batch(TOKENIZER, 64, 4, 0, digits=6)
    for host, inputs in enumerate(both):
        batch = next(inputs.train)
        for key in whole:
            np.testing.assert_array_equal(batch[key], whole[key][2 * host:2 * host + 2])
    held_out = both[0].eval_batches[0]
    trained = TOKENIZER.decode(whole["targets"][whole["mask"] > 0].tolist())
    keys = TOKENIZER.decode(held_out["targets"][held_out["mask"] > 0].tolist())
    assert keys and keys not in trained  # the held-out stream draws other keys
    assert both[0].summary["digits"] == 6


def test_a_passkey_run_trains_is_scored_at_length_and_bad_fields_are_named(tmp_path):
    config = passkey_run_config(passkey=dict(digits=6))
    metrics = loop.run(config, tmp_path / "run", progress=False, devices=jax.devices()[:1])
    # The held-out loss is the mean NLL over the key tokens of the held-out batch, recomputed
    # here in float64 numpy from the saved model's logits.
    model, _ = loop.load_params(tmp_path / "run")
    batch = passkey.build_inputs(config).eval_batches[0]
    logits = np.asarray(model(batch["inputs"], positions=batch["positions"],
                              segment_ids=batch["segment_ids"])[0], np.float64)
    logp = logits - logits.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, batch["targets"][..., None], -1)[..., 0]
    mask = batch["mask"] > 0
    assert mask.sum() > 0 and metrics["eval"]["tokens"] == mask.sum()
    assert metrics["eval"]["loss"] == pytest.approx(nll[mask].mean(), rel=1e-4)
    assert np.isfinite(metrics["train"]["loss"])
    # the length evaluation scores it on keys as long as its own, with no text perplexity
    out = evaluate_length.evaluate(tmp_path / "run", [64, 128], scalings=("none",),
                                   tasks=["marked_passkey"], ppl_rows=0, examples=2)
    for length in ("64", "128"):
        entry = out["results"]["none"][length]
        assert "perplexity" not in entry
        task = entry["tasks"]["marked_passkey"]  # one key per example: each scores 0 or 1
        assert len(task["scores"]) == 2 and set(task["scores"]) <= {0.0, 1.0}
        assert task["score"] == pytest.approx(np.mean(task["scores"]))
    examples = rt.make_examples("marked_passkey", 128, 3, COUNT, digits=6)
    assert all(re.search(rf"#{e.answers[0]}\. ", e.prompt) and len(e.answers[0]) == 6
               for e in examples)
    with pytest.raises(ValueError, match="has no held-out text: pass --ppl_rows=0"):
        evaluate_length.evaluate(tmp_path / "run", [64], tasks=["marked_passkey"], ppl_rows=2)
    bad = [(dict(tokenizer="sentencepiece"), "data.source='passkey' generates its text"),
           (dict(passkey=dict(digits=0)), "data.passkey.digits=0 must be in 1..18")]
    for fields, message in bad:
        with pytest.raises(run_config.ConfigError, match=re.escape(message)):
            run_config.validate_run_config(passkey_run_config(**fields))
    with pytest.raises(ValueError, match="data.passkey.min_tokens: min_tokens=5 must be in"):
        passkey.build_inputs(passkey_run_config(passkey=dict(min_tokens=5)))
