"""The seqio path and the grain path give identical token streams and batches from one text."""

import json
from pydoc_data.topics import topics

import numpy as np
import pytest

from gated_attention.config import run_config
from gated_attention.data import corpus, packing, pipeline, registry, seqio_source, tokenizer


@pytest.fixture(scope="module")
def texts_and_vocab(tmp_path_factory):
    root = tmp_path_factory.mktemp("seqio")
    # One document per line: paragraphs of the language reference, newlines folded.
    texts = [" ".join(t.split())[:600] for _, t in sorted(topics.items())[:40]]
    (root / "docs.txt").write_text("".join(t + "\n" for t in texts))
    (root / "docs.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    model = root / "spm.model"
    tokenizer.train_sentencepiece([corpus.Document(str(i), t) for i, t in enumerate(texts)],
                                  400, model)
    return root, texts, str(model)


@pytest.mark.needs("seqio")
def test_seqio_and_grain_yield_identical_tokens_and_batches(texts_and_vocab):
    root, texts, model = texts_and_vocab
    task = seqio_source.register_text_task(
        "ga_test_text", {"train": [str(root / "docs.txt")]}, model)
    seqio_docs = list(seqio_source.document_stream(task, "train", shuffle=False, seed=0,
                                                   repeat=False))
    docs = corpus.text_files(str(root / "docs.jsonl"))
    sp = tokenizer.SentencePieceTokenizer(model)
    grain_split = pipeline.tokenize(docs, sp, add_eos=True)
    assert len(seqio_docs) == grain_split.num_documents == len(texts)
    for i, ids in enumerate(seqio_docs):
        np.testing.assert_array_equal(ids, grain_split.document(i))
        assert ids[-1] == sp.eos_id
        assert sp.decode(ids[:-1]) == texts[i]  # an independent check: decoding gives the text

    data_config = run_config.data_section("tiny")
    data_config.seq_len, data_config.add_bos = 32, True
    grain_batches = list(packing.pack_and_batch(
        pipeline.grain.MapDataset.source(pipeline.ChunkSource(
            grain_split, 32, True, sp.bos_id)).to_iter_dataset(pipeline.READ_OPTIONS),
        32, 4, seed=0, shuffle_bins=False))
    seqio_batches = list(seqio_source.batches(task, "train", data_config, 4, sp.bos_id,
                                              shuffle=False, seed=0, repeat=False))
    assert len(grain_batches) == len(seqio_batches) > 3
    for a, b in zip(grain_batches, seqio_batches):
        for key in packing.BATCH_KEYS:
            np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.needs("seqio")
def test_seqio_iterator_resumes_exactly(texts_and_vocab):
    root, _, model = texts_and_vocab
    task = seqio_source.register_text_task(
        "ga_test_resume", {"train": [str(root / "docs.txt")]}, model)
    data_config = run_config.data_section("tiny")
    data_config.seq_len = 16
    ds = seqio_source.batches(task, "train", data_config, 2, 1, shuffle=True, seed=3,
                              repeat=True)
    it = iter(ds)
    for _ in range(7):
        next(it)
    state = json.loads(json.dumps(it.get_state()))
    expected = [next(it) for _ in range(10)]
    again = iter(ds)
    again.set_state(state)
    for a, b in zip(expected, [next(again) for _ in range(10)]):
        for key in packing.BATCH_KEYS:
            np.testing.assert_array_equal(a[key], b[key])


@pytest.mark.needs("seqio")
def test_a_users_task_module_is_imported_and_brings_its_vocabulary(texts_and_vocab, tmp_path,
                                                                    monkeypatch):
    from gated_attention.data import build_inputs
    from gated_attention.data.inputs import import_modules

    root, texts, model = texts_and_vocab
    (tmp_path / "ga_user_tasks.py").write_text(
        "from gated_attention.data import seqio_source\n"
        f"seqio_source.register_text_task('ga_user_task', {{'train': [{str(root / 'docs.txt')!r}],"
        f" 'validation': [{str(root / 'docs.txt')!r}]}}, {model!r},"
        f" num_input_examples={{'train': {len(texts)}, 'validation': {len(texts)}}})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = run_config.base_config("tiny", "baseline")
    config.model.vocab_size = 400
    config.data.update(dict(source="seqio", seqio=dict(task="ga_user_task"), seq_len=32))
    config.train.update(dict(batch_size=2, eval_batches=1))
    with pytest.raises(run_config.ConfigError, match=r"^data.seqio.task='ga_user_task' is not "
                       r"a registered seqio task or mixture; .* --seqio_module=that.module$"):
        run_config.validate_run_config(config)
        registry.check_files(config)  # opens the task
    with pytest.raises(ImportError, match=r"--seqio_module='ga_no_such_module' cannot be"):
        import_modules("ga_no_such_module")
    import_modules("ga_user_tasks")
    run_config.validate_run_config(config)  # no data.tokenizer_path: the task's vocabulary
    inputs = build_inputs(config, tmp_path / "run")
    batch = next(inputs.train)
    assert batch["inputs"].shape == (2, 32) and len(inputs.eval_batches) == 1
    # The epoch guard's estimate reads the first 256 documents: here all 40, so it is exact.
    assert inputs.summary["train"]["tokens_estimated"] == sum(
        len(ids) + 1 for ids in tokenizer.SentencePieceTokenizer(model).encode(texts))
    assert (tmp_path / "run" / tokenizer.TOKENIZER_FILE).read_bytes() == \
        (root / "spm.model").read_bytes()
    sp = tokenizer.SentencePieceTokenizer(model)
    assert sp.decode(inputs.eval_batches[0]["inputs"][0][:20]) in texts[0]
    # The task tokenized once into shards: every document, EOS-terminated, in file order.
    from gated_attention.data import array_record_source, prepare

    manifest = prepare.prepare(config, str(tmp_path / "shards"), num_shards=1)
    docs = array_record_source.documents(str(tmp_path / "shards"), manifest, "train")
    assert len(docs) == len(texts) and manifest["source"]["task"] == "ga_user_task"
    assert sp.decode(docs[5][:-1]) == texts[5] and docs[5][-1] == sp.eos_id


@pytest.mark.needs("seqio")
def test_c4_task_registers_without_download(texts_and_vocab):
    _, _, model = texts_and_vocab
    import seqio

    name = seqio_source.register_c4_task(model)
    task = seqio.get_mixture_or_task(name)
    assert task.output_features["targets"].vocabulary.vocab_size == 400


def test_main_imports_the_seqio_module_before_validating(tmp_path):
    import os
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "gated_attention.main", "--seqio_module=ga_no_such_tasks",
         "--config=configs/ablation.py:arch=tiny,variant=baseline",
         f"--workdir={tmp_path / 'run'}", "--config.data.source=seqio",
         "--config.data.seqio.task=my_task"],
        capture_output=True, text=True, timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "Config error: --seqio_module='ga_no_such_tasks' cannot be imported: No module named "
        "'ga_no_such_tasks'")
    assert not (tmp_path / "run").exists()
