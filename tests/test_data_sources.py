"""tfds, seqio, files and ArrayRecord shards give the same token streams from the same text;
hosts split them without loss or duplication; bad sources are one-line errors before any
compile; the epoch guard; concat packing."""

import collections
import json

import numpy as np
import pytest
from data_fixtures import texts, tiny_tfds_builder, train_bpe, write_jsonl

from gated_attention.config import run_config
from gated_attention.data import (
    array_record_source,
    corpus,
    epochs,
    pipeline,
    prepare,
    registry,
    seqio_source,
    streams,
    tfds_source,
    tokenizer,
)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """40 texts as .jsonl, .txt (one per line), a tfds dataset (both file formats), a
    SentencePiece model and a BPE tokenizer.json, all built here."""
    root = tmp_path_factory.mktemp("sources")
    corpus_texts = texts()
    write_jsonl(root / "docs.jsonl", corpus_texts)
    (root / "docs.txt").write_text("".join(t + "\n" for t in corpus_texts))
    builder = tiny_tfds_builder(corpus_texts)
    builder(data_dir=str(root / "tfds")).download_and_prepare()
    builder(data_dir=str(root / "tfds_ar"), file_format="array_record").download_and_prepare()
    tokenizer.train_sentencepiece([corpus.Document(str(i), t) for i, t in
                                   enumerate(corpus_texts)], 400, root / "spm.model")
    train_bpe(root / "tokenizer.json", corpus_texts, 320)
    return root, corpus_texts


def _config(root, *, tokenizer_kind="hf", source="tfds", vocab=384, **data):
    config = run_config.base_config("tiny", "baseline")
    config.model.vocab_size = vocab
    path = str(root / ("spm.model" if tokenizer_kind == "sentencepiece" else "tokenizer.json"))
    config.data.update(dict(source=source, tokenizer=tokenizer_kind, tokenizer_path=path,
                            tfds=dict(name="ga_tiny_text"), tfds_data_dir=str(root / "tfds"),
                            paths=str(root / "docs.jsonl"), seq_len=32,
                            cache_dir=str(root / "cache")))
    config.data.update(data)
    config.train.update(dict(batch_size=4, steps=10, eval_batches=1))
    config.optimizer.warmup_steps = 1
    return config


def _expected(tok, corpus_texts):
    """The reference: each text encoded by the tokenizer alone, then EOS."""
    return [tuple(ids.tolist()) + (tok.eos_id,) for ids in tok.encode(corpus_texts)]


@pytest.mark.parametrize("kind", ["sentencepiece", "hf"])
def test_every_source_gives_the_same_token_stream(world, tmp_path, kind):
    root, corpus_texts = world
    config = _config(root, tokenizer_kind=kind, vocab=400 if kind == "sentencepiece" else 384)
    tok = tokenizer.get_tokenizer(kind, config.model.vocab_size,
                                  model_path=config.data.tokenizer_path)
    expected = _expected(tok, corpus_texts)
    assert tok.decode(expected[3][:-1]) == corpus_texts[3]  # the reference decodes to the text

    files = pipeline.tokenize(corpus.text_files(config.data.paths), tok, add_eos=True)
    streams_by_source = {"files": [tuple(files.document(i).tolist())
                                   for i in range(files.num_documents)]}
    for data_dir in ("tfds", "tfds_ar"):
        config.data.tfds_data_dir = str(root / data_dir)
        builder = tfds_source.open_builder(config.data)
        docs = tfds_source.document_stream(builder, "train", config.data, tok, shuffle=False,
                                           seed=0, repeat=False)
        streams_by_source[data_dir] = [tuple(d.tolist()) for d in docs]
    if kind == "sentencepiece":  # seqio reads SentencePiece vocabularies only
        task = seqio_source.register_text_task(f"ga_src_{kind}",
                                               {"train": [str(root / "docs.txt")]},
                                               config.data.tokenizer_path)
        streams_by_source["seqio"] = [tuple(d.tolist()) for d in seqio_source.document_stream(
            task, "train", shuffle=False, seed=0, repeat=False)]
    config.data.tfds_data_dir = str(root / "tfds")
    manifest = prepare.prepare(config, str(tmp_path / "shards"), num_shards=1)
    assert manifest["splits"]["train"]["tokens"] == sum(len(e) for e in expected)
    assert manifest["splits"]["held_out"]["documents"] == 8
    one_shard = array_record_source.documents(str(tmp_path / "shards"), manifest, "train")
    streams_by_source["array_record"] = [tuple(one_shard[i].tolist())
                                         for i in range(len(one_shard))]
    for name, stream in streams_by_source.items():
        assert stream == expected, name


@pytest.mark.parametrize("hosts", [2, 4])
def test_hosts_read_every_document_once(world, tmp_path, hosts):
    root, corpus_texts = world
    config = _config(root)
    tok = tokenizer.get_tokenizer("hf", 384, model_path=config.data.tokenizer_path)
    expected = collections.Counter(_expected(tok, corpus_texts))
    builder = tfds_source.open_builder(config.data)
    tfds_docs = collections.Counter()
    for host in range(hosts):
        share = [tuple(d.tolist()) for d in tfds_source.document_stream(
            builder, "train", config.data, tok, shuffle=True, seed=1, repeat=False,
            process_index=host, process_count=hosts)]
        assert abs(len(share) - len(corpus_texts) / hosts) <= 1
        tfds_docs.update(share)
    assert tfds_docs == expected

    folder = str(tmp_path / "shards")
    manifest = prepare.prepare(config, folder, num_shards=3)
    assert manifest["splits"]["train"]["shard_documents"] == [14, 13, 13]
    shard_docs = collections.Counter()
    for host in range(hosts):  # the first epoch of each host's shuffled, repeated share
        it = iter(array_record_source.train_documents(folder, manifest, seed=4,
                                                      process_index=host, process_count=hosts))
        count = len(range(host, len(corpus_texts), hosts))
        shard_docs.update(tuple(next(it).tolist()) for _ in range(count))
    assert shard_docs == expected


def test_array_record_batches_resume_exactly_mid_shard(world, tmp_path):
    root, _ = world
    folder = str(tmp_path / "shards")
    prepare.prepare(_config(root), folder, num_shards=2)
    for packing in ("segments", "concat"):
        config = _config(root, source="array_record", paths=folder, packing=packing)
        run_config.validate_run_config(config)
        inputs = array_record_source.build_inputs(config, None, process_index=1,
                                                  process_count=2)
        for _ in range(5):
            next(inputs.train)
        state = json.loads(json.dumps(inputs.train.get_state()))
        expected = [next(inputs.train) for _ in range(8)]  # crosses an epoch boundary
        again = array_record_source.build_inputs(config, None, process_index=1,
                                                 process_count=2)
        again.train.set_state(state)
        for a, b in zip(expected, [next(again.train) for _ in range(8)], strict=True):
            assert a.keys() == b.keys()
            assert ("segment_ids" in a) == (packing == "segments")
            for key in a:
                np.testing.assert_array_equal(a[key], b[key])


def _checked(config):
    """The checks a run makes before compiling: the fields, then the files they name."""
    run_config.validate_run_config(config)
    registry.check_files(config)


def _error(config):
    with pytest.raises(run_config.ConfigError) as err:
        _checked(config)
    assert "\n" not in str(err.value)
    return str(err.value)


def test_bad_sources_are_one_line_errors_naming_the_field(world, tmp_path):
    root, _ = world
    missing = _config(root, source="array_record", paths=str(tmp_path / "nowhere"))
    assert _error(missing).startswith(f"data.paths='{tmp_path}/nowhere' is not a folder")
    (tmp_path / "empty").mkdir()
    empty = _config(root, source="array_record", paths=str(tmp_path / "empty"))
    assert _error(empty).startswith(f"data.paths='{tmp_path}/empty' is empty")
    # Shards written with the SentencePiece model, read by a run with the tokenizer.json.
    folder = str(tmp_path / "sp_shards")
    prepare.prepare(_config(root, tokenizer_kind="sentencepiece", vocab=400), folder,
                    num_shards=1)
    other = _config(root, source="array_record", paths=folder)
    assert _error(other).startswith(f"data.paths='{folder}' was prepared with another "
                                    "tokenizer (sentencepiece")
    assert "data.tokenizer='hf'" in _error(other)
    # Left empty, data.tokenizer_path means the shards' own tokenizer: accepted.
    _checked(_config(root, tokenizer_kind="sentencepiece", vocab=400, source="array_record",
                     paths=folder, tokenizer_path=""))
    unknown = _config(root, tfds=dict(name="no_such_dataset_here"))
    assert _error(unknown).startswith("data.tfds.name='no_such_dataset_here' is not found in "
                                      f"data.tfds_data_dir='{root}/tfds'")
    elsewhere = _config(root, tfds_data_dir=str(tmp_path / "empty"))
    assert "is not prepared in data.tfds_data_dir=" in _error(elsewhere)
    assert _error(_config(root, tfds=dict(eval_split="test"))).startswith(
        "data.tfds.eval_split='test' is not a split of 'ga_tiny_text'")
    assert "data.text_key='body'" in _error(_config(root, text_key="body"))
    assert "data.packing='concat' joins documents with EOS" in _error(
        _config(root, packing="concat", add_eos=False))
    with pytest.raises(prepare.PrepareError, match="--out=.* is not empty"):
        prepare.prepare(_config(root), folder, num_shards=1)


def test_epoch_guard_counts_the_epochs_asked():
    config = run_config.base_config("tiny", "baseline")
    config.train.update(dict(steps=1000, batch_size=16))
    config.data.seq_len = 256
    # 1000 x 16 x 256 = 4,096,000 tokens over a 800,000-token split: 5.12 epochs.
    assert epochs.check(config, {"train": {"tokens": 1_024_000}}) == pytest.approx(4.0)
    with pytest.raises(run_config.ConfigError) as err:
        epochs.check(config, {"train": {"tokens": 800_000}})
    message = str(err.value)
    assert "= 4.1M tokens is 5.1 epochs of the training split of data.source='cpython_docs' " \
           "(0.80M tokens), more than data.max_epochs=4" in message
    assert "data.source=python_source" in message and "train.steps <= 781" in message
    config.data.max_epochs = 6.0
    assert epochs.check(config, {"train": {"tokens": 800_000}}) == pytest.approx(5.12)
    assert epochs.check(config, {"train": {}}) is None


def test_concat_rows_train_every_pair_of_the_joined_stream_once():
    rng = np.random.default_rng(0)
    docs = [rng.integers(3, 300, size=int(n), dtype=np.int32)
            for n in rng.choice([1, 3, 9, 40, 70], size=25)]
    joined = np.concatenate(docs)
    seq = 16
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    source = pipeline.ConcatRowSource(pipeline.TokenizedSplit(joined, offsets), seq, False, 1)
    pairs = collections.Counter()
    for i in range(len(source)):
        row = source[i].tolist()
        assert len(row) == seq + 1
        pairs.update(zip(row[:-1], row[1:]))
    whole = collections.Counter(zip(joined.tolist()[:(len(source)) * seq],
                                    joined.tolist()[1:len(source) * seq + 1]))
    assert pairs == whole and len(source) == (len(joined) - 1) // seq
    # The streamed version cuts the same rows, and resumes mid-document exactly.
    stream = streams.DocumentStream(lambda skip: iter(docs[skip:]))
    rows = streams.ConcatRows(stream, seq, False, 1)
    it = iter(rows)
    got = [next(it) for _ in range(3)]
    state = json.loads(json.dumps(it.get_state()))
    got += [next(it) for _ in range(4)]
    for i, row in enumerate(got):
        np.testing.assert_array_equal(row, source[i])
    again = iter(rows)
    again.set_state(state)
    for i in range(3, 7):
        np.testing.assert_array_equal(next(again), source[i])


def test_tfds_inputs_with_concat_rows(world):
    root, _ = world
    config = _config(root, packing="concat")
    inputs = tfds_source.build_inputs(config, None, process_index=0, process_count=1)
    batch = next(inputs.train)
    assert sorted(batch) == ["inputs", "mask", "targets"]  # no segment ids: cuDNN may apply
    np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
    assert inputs.eval_batches[0]["segment_ids"].min() == 1  # one segment per eval row
    # 40 documents of about 120 tokens: the estimate is within a few percent of the truth.
    tok = tokenizer.get_tokenizer("hf", 384, model_path=config.data.tokenizer_path)
    truth = sum(len(e) for e in _expected(tok, texts()))
    assert abs(inputs.summary["train"]["tokens_estimated"] - truth) <= 0.05 * truth
