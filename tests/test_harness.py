"""lm-eval backend (gated_attention/evaluation, python -m gated_attention.harness) against a
float64 numpy forward pass of the same Hugging Face weights, through lm-eval's evaluator and
its output files, and the command's bad-input lines."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

from tests.data_fixtures import texts, train_bpe
from tests.hf_fixtures import numpy_forward, random_tensors, tiny_hf_config, write_hf_folder

pytestmark = pytest.mark.needs("lm_eval")
EOS = "<|endoftext|>"
MAX_LENGTH = 24


def qwen_style_folder(folder: pathlib.Path, variant: str = "g1_sdpa_elementwise",
                      seed: int = 1) -> tuple[dict, dict]:
    """A tiny Qwen3 folder with a byte-level BPE tokenizer.json that, as Qwen3's, adds no BOS
    and ends text with <|endoftext|>."""
    hf = tiny_hf_config(variant, vocab_size=320, eos_token_id=0, max_position_embeddings=64)
    tensors = random_tensors(hf, seed=seed)
    write_hf_folder(folder, hf, tensors)
    train_bpe(folder / "tokenizer.json", texts(40), 300, template=False, padding=False,
              specials=(EOS, "<|im_start|>", "<|im_end|>"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": EOS, "bos_token": None, "pad_token": EOS, "add_bos_token": False,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return hf, tensors


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("harness") / "model"
    hf, tensors = qwen_style_folder(root)
    return root, hf, tensors


def make_lm(root: pathlib.Path, batch_size: int = 4, max_length: int = MAX_LENGTH):
    from gated_attention.evaluation import backend, engine
    from gated_attention.inference import loading

    loaded = loading.load(hf_dir=str(root))
    return backend.JaxLM(engine.Engine(loaded.model), loaded.codec, max_length=max_length,
                         batch_size=batch_size)


@pytest.fixture(scope="module")
def lm(folder):
    return make_lm(folder[0])


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def numpy_score(hf, tensors, context: list[int], continuation: list[int], max_length: int
                ) -> tuple[float, bool]:
    """Sum of the continuation's float64 log-probabilities and whether each is the argmax."""
    whole = (context + continuation)[-(max_length + 1):]
    logp = log_softmax64(numpy_forward(hf, tensors, np.asarray([whole[:-1]]))[0])
    n = len(continuation)
    rows = logp[len(whole) - 1 - n:]
    return (float(sum(rows[k, t] for k, t in enumerate(continuation))),
            all(int(rows[k].argmax()) == t for k, t in enumerate(continuation)))


def instances(kind: str, args: list[tuple]) -> list:
    from lm_eval.api.instance import Instance

    return [Instance(kind, {}, a, i) for i, a in enumerate(args)]


PAIRS = [("The import statement", " is used to"), ("Hello", " world"), ("Hello", " x"),
         ("", "abc def"), ("A " * 30, " loop")]  # the last one is cut from the left


@pytest.mark.slow
def test_loglikelihood_equals_float64_numpy(folder, lm):
    _, hf, tensors = folder
    ours = lm.loglikelihood(instances("loglikelihood", PAIRS))
    for (context, continuation), (logp, greedy) in zip(PAIRS, ours):
        if context:
            ctx, cont = lm._encode_pair(context, continuation)
        else:  # lm-eval's rule for an empty context: the prefix token (EOS: no BOS here)
            ctx, cont = [lm.codec.eos_id], lm.tok_encode(continuation, add_special_tokens=False)
        ref, ref_greedy = numpy_score(hf, tensors, ctx, cont, MAX_LENGTH)
        assert abs(logp - ref) < 1e-4, (context, continuation, logp, ref)
        assert greedy == ref_greedy


@pytest.mark.slow
def test_is_greedy_against_the_numpy_argmax(folder, lm):
    """Continuations made of the numpy argmax tokens are greedy; one changed token is not."""
    _, hf, tensors = folder
    context = lm.tok_encode("The gate")
    greedy_cont = []
    for _ in range(3):
        logits = numpy_forward(hf, tensors, np.asarray([context + greedy_cont]))[0, -1]
        greedy_cont.append(int(logits.argmax()))
    other = greedy_cont[:2] + [(greedy_cont[2] + 1) % 300]
    (lp1, g1), (lp2, g2) = lm._loglikelihood_tokens([(None, context, greedy_cont),
                                                      (None, context, other)])
    assert (g1, g2) == (True, False)
    assert abs(lp1 - numpy_score(hf, tensors, context, greedy_cont, MAX_LENGTH)[0]) < 1e-4
    assert abs(lp2 - numpy_score(hf, tensors, context, other, MAX_LENGTH)[0]) < 1e-4


@pytest.mark.slow
def test_rolling_loglikelihood_over_lm_evals_windows(folder, lm):
    from lm_eval import utils

    _, hf, tensors = folder
    text = " ".join(texts(2))[:400]
    tokens = lm.tok_encode(text)
    assert len(tokens) > 3 * MAX_LENGTH
    windows = map(utils.make_disjoint_window, utils.get_rolling_token_windows(
        token_list=tokens, prefix_token=lm.codec.eos_id, max_seq_len=MAX_LENGTH, context_len=1))
    ref = sum(numpy_score(hf, tensors, ctx, cont, MAX_LENGTH)[0] for ctx, cont in windows)
    (ours,) = lm.loglikelihood_rolling(instances("loglikelihood_rolling", [(text,)]))
    assert abs(ours - ref) < 1e-4 * max(1.0, len(tokens) / 64)


def numpy_greedy(hf, tensors, prompt: list[int], steps: int) -> list[int]:
    out = list(prompt)
    for _ in range(steps):
        out.append(int(numpy_forward(hf, tensors, np.asarray([out]))[0, -1].argmax()))
    return out[len(prompt):]


@pytest.mark.slow
def test_greedy_generation_equals_numpy_and_stops(folder, lm):
    _, hf, tensors = folder
    prompts = ["The import statement", "Hello there, this is a longer prompt"]
    steps = 10
    expected = []
    for prompt in prompts:  # lm-eval's hf backend keeps the last max_length - max_gen_toks
        ids = lm.tok_encode(prompt)[-(MAX_LENGTH - steps):]
        expected.append(lm.tok_decode(numpy_greedy(hf, tensors, ids, steps)))
    assert len(lm.tok_encode(prompts[1])) > MAX_LENGTH - steps  # the second one is cut
    stop = expected[0][len(expected[0]) // 2:][:2]  # a stop string inside the first output
    got = lm.generate_until(instances("generate_until", [
        (p, {"until": [stop], "max_gen_toks": steps}) for p in prompts]))
    assert got == [t.split(stop)[0] for t in expected]
    assert len(got[0]) < len(expected[0])  # the stop string cut it


@pytest.mark.slow
def test_batch_and_bucket_change_nothing(folder, lm):
    one = make_lm(folder[0], batch_size=1)
    requests = PAIRS + [(t[:80], t[80:110]) for t in texts(6)]
    a = [x for x, _ in one.loglikelihood(instances("loglikelihood", requests))]
    b = [x for x, _ in make_lm(folder[0], batch_size=8).loglikelihood(
        instances("loglikelihood", requests))]
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.slow
def test_shared_contexts_equal_full_rows_and_numpy(folder, lm, monkeypatch):
    """Multiple-choice requests (choices sharing a context, mixed lengths, one cut from the
    left at max_length) score as one full row each does and as float64 numpy does."""
    from gated_attention.evaluation import backend

    _, hf, tensors = folder
    words = lm.tok_encode(" ".join(texts(3)))
    contexts = [words[:3], words[40:52], words[100:121]]
    choices = [[words[5:6], words[60:62], words[80:85]],           # one-token choice too
               [words[7:8], words[9:10], words[200:206], words[210:213]],
               [words[300:302], words[310:316], words[320:321]]]   # 21 + 6 > 24 + 1: cut
    assert len(contexts[2]) + len(choices[2][1]) > MAX_LENGTH + 1
    reqs = [(None, c, x) for c, xs in zip(contexts, choices) for x in xs]
    rows = []
    original = backend.JaxLM._score_shared_batch
    monkeypatch.setattr(backend.JaxLM, "_score_shared_batch", lambda self, batch, *a: (
        rows.append(sorted(i for piece in batch for i in piece)), original(self, batch, *a)))
    ours = lm._loglikelihood_tokens(reqs)
    cut = 3 + 4 + 1
    assert sorted(i for b in rows for i in b) == [i for i in range(len(reqs)) if i != cut]
    monkeypatch.setattr(backend.JaxLM, "_score_shared_batch", original)
    for req, (logp, greedy) in zip(reqs, ours):
        ((alone, alone_greedy),) = lm._loglikelihood_tokens([req])  # one full row
        assert abs(logp - alone) < 1e-5 and greedy == alone_greedy, req
        ref, ref_greedy = numpy_score(hf, tensors, req[1], req[2], MAX_LENGTH)
        assert abs(logp - ref) < 1e-4 and greedy == ref_greedy, req


TASKS = {
    "ga_mc": dict(output_type="multiple_choice", doc_to_text="{{question}}",
                  doc_to_target="{{answer}}", doc_to_choice="{{choices}}",
                  metric_list=[dict(metric="acc")]),
    "ga_rolling": dict(output_type="loglikelihood_rolling", doc_to_text="",
                       doc_to_target="{{text}}",
                       metric_list=[dict(metric="word_perplexity"),
                                    dict(metric="bits_per_byte")]),
    "ga_gen": dict(output_type="generate_until", doc_to_text="{{question}}",
                   doc_to_target="{{answer}}",
                   generation_kwargs=dict(until=["\n", "."], max_gen_toks=8, do_sample=False),
                   metric_list=[dict(metric="exact_match")]),
}


def write_tasks(root: pathlib.Path) -> pathlib.Path:
    """Three lm-eval YAML tasks on jsonl files (JSON is YAML)."""
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    docs = [dict(question=f"Question {i}: {t[:40]}", choices=[" yes", " no", " maybe"],
                 answer=i % 3, text=t[:200]) for i, t in enumerate(texts(4))]
    for name, spec in TASKS.items():
        data = root / f"{name}.jsonl"
        rows = docs if name != "ga_gen" else [{**d, "answer": "x"} for d in docs]
        data.write_text("".join(json.dumps(d) + "\n" for d in rows))
        (root / f"{name}.yaml").write_text(yaml.safe_dump(dict(
            task=name, dataset_path="json", dataset_kwargs=dict(data_files=dict(test=str(data))),
            test_split="test", **spec)))
    return root


@pytest.mark.slow
def test_three_tasks_through_lm_evals_evaluator_and_its_files(folder, tmp_path):
    from gated_attention import harness

    root, hf, tensors = folder
    tasks = write_tasks(tmp_path / "tasks")
    out = tmp_path / "out"
    results = harness.run(harness.parse([
        f"--hf_dir={root}", "--tasks=ga_mc,ga_rolling,ga_gen", f"--include_path={tasks}",
        f"--output_path={out}", "--log_samples", "--max_length=24", "--batch_size=4"]))
    assert set(results["results"]) == {"ga_mc", "ga_rolling", "ga_gen"}
    files = sorted(p.name for p in out.rglob("*.json*"))
    assert len([f for f in files if f.startswith("results_")]) == 1, files
    for name in TASKS:
        assert any(f.startswith(f"samples_{name}_") and f.endswith(".jsonl") for f in files)
    samples = [json.loads(line) for line in next(out.rglob("samples_ga_mc_*.jsonl")).open()]
    assert len(samples) == 4
    lm = make_lm(root)
    correct = 0
    for sample in samples:  # every choice's log-likelihood, as numpy scores it
        scores = []
        for args, resp in zip(sample["arguments"].values(), sample["resps"]):
            ctx, cont = lm._encode_pair(args["arg_0"], args["arg_1"])
            ref = numpy_score(hf, tensors, ctx, cont, MAX_LENGTH)[0]
            assert abs(float(resp[0][0]) - ref) < 1e-4
            scores.append(ref)
        correct += int(np.argmax(scores) == int(sample["target"]))
    assert results["results"]["ga_mc"]["acc,none"] == pytest.approx(correct / 4)


@pytest.mark.parametrize("argv, message", [
    pytest.param(["--tasks=no_such_task_xyz"], "--tasks=no_such_task_xyz is not a task",
                 marks=pytest.mark.slow),  # lm-eval reads its whole task index (~10 s)
    pytest.param(["--tasks=hellaswag"], "--tasks=hellaswag: the task cannot be loaded (its "
                 "dataset is not on this machine and downloads are off", marks=pytest.mark.slow),
    (["--tasks=ga_mc", "--workdir={tmp}/empty_run"], "--workdir={tmp}/empty_run holds no "
                                                     "checkpoint"),
    (["--tasks=ga_mc", "--hf_dir={tmp}/broken"], "--hf_dir={tmp}/broken: "),
    (["--tasks=ga_mc", "--hf_dir={tmp}/broken", "--dtype=float16"], "--dtype='float16' is "
                                                                    "not allowed"),
    (["--tasks=ga_mc", "--batch_size=0"], "--batch_size='0' must be a positive integer"),
])
def test_bad_input_is_one_line_naming_the_flag_before_any_compile(
        argv, message, folder, tmp_path, monkeypatch, capsys):
    from gated_attention import harness
    from gated_attention.evaluation import engine

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(engine.Engine, "__init__", lambda *a, **k: pytest.fail("compiled"))
    tasks = write_tasks(tmp_path / "tasks")
    (tmp_path / "empty_run").mkdir()
    (tmp_path / "empty_run" / "config.json").write_text("{}")
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    argv = [a.format(tmp=tmp_path) for a in argv]
    if not any(a.startswith(("--workdir", "--hf_dir")) for a in argv):
        argv.append(f"--hf_dir={folder[0]}")
    with pytest.raises(SystemExit) as exit_info:
        harness.main([*argv, f"--include_path={tasks}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message.format(tmp=tmp_path) in err[0], err


@pytest.mark.slow
def test_training_hook_and_the_command_on_the_trained_run(tmp_path):
    """train.harness_every writes kind "harness" records at steps 2 and 4 and record.json's
    final.harness; the command on the finished run's checkpoint reads the same numbers."""
    import jax

    from gated_attention import harness
    from gated_attention.config import run_config
    from gated_attention.training import loop
    from gated_attention.training.metrics_writer import read_jsonl
    from tests.data_fixtures import write_jsonl

    tasks = write_tasks(tmp_path / "tasks")
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(vocab_size=259, num_layers=1, d_model=32, num_heads=2,
                             num_kv_heads=1, head_dim=16, mlp_dim=64))
    config.data.update(dict(source="files", paths=write_jsonl(tmp_path / "c.jsonl", texts(30)),
                            tokenizer="byte", seq_len=64, cache_dir=str(tmp_path / "cache"),
                            eval_fraction=0.2))
    config.train.update(dict(steps=4, batch_size=4, eval_every=0, eval_batches=0, log_every=1,
                             checkpoint_every=0, async_checkpoint=False, telemetry_every=0,
                             harness_every=2, harness_tasks="ga_mc,ga_gen",
                             harness_include_path=str(tasks)))
    config.optimizer.update(dict(warmup_steps=1, peak_lr=3e-2))
    loop.run(config, tmp_path / "run", progress=False, devices=jax.devices()[:1])
    records = [r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl")
               if r["kind"] == "harness"]
    assert [r["step"] for r in records] == [2, 4]
    assert {"ga_mc/acc", "ga_gen/exact_match"} <= set(records[-1])
    record = json.loads((tmp_path / "run" / "record.json").read_text())
    assert record["final"]["harness"]["ga_mc/acc"] == records[-1]["ga_mc/acc"]
    results = harness.run(harness.parse([
        f"--workdir={tmp_path / 'run'}", "--tasks=ga_mc", f"--include_path={tasks}"]))
    assert results["results"]["ga_mc"]["acc,none"] == records[-1]["ga_mc/acc"]


@pytest.mark.parametrize("field, value, message", [
    ("harness_every", -1, "train.harness_every=-1 must be an integer >= 0"),
    ("harness_tasks", "", "train.harness_every=5 needs train.harness_tasks"),
    ("harness_include_path", "/no/such/folder", "train.harness_include_path='/no/such/folder'"),
])
def test_bad_harness_fields_are_config_errors(field, value, message):
    from gated_attention.config import run_config
    from gated_attention.core.checks import ConfigError

    config = run_config.base_config("tiny", "baseline")
    config.train.update(dict(harness_every=5, harness_tasks="ga_mc"))
    config.train[field] = value
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        run_config.validate_run_config(config)


@pytest.mark.slow
def test_chat_template_renders_as_transformers_would(lm, monkeypatch):
    template = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
                "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    monkeypatch.setattr(lm, "template", template)
    assert lm.chat_template(True) == template and lm.chat_template(False) is None
    assert lm.apply_chat_template([{"role": "user", "content": "hi"}]) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
