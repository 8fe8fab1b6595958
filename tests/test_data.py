"""Corpus, tokenizers, chunking and packing against naive references; resumable iterators."""

import collections
import json
from pydoc_data.topics import topics

import grain
import numpy as np
import pytest

from gated_attention.config import run_config
from gated_attention.core.checks import ConfigError
from gated_attention.data import corpus, packing, pipeline, tokenizer


def _documents(seed=0, n=30, bos=1):
    rng = np.random.default_rng(seed)
    lengths = rng.choice([1, 2, 5, 17, 33, 64, 65, 70, 150], size=n)
    return [rng.integers(3, 500, size=int(k), dtype=np.int32) for k in lengths]


def _split(docs):
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])]).astype(np.int64)
    return pipeline.TokenizedSplit(np.concatenate(docs).astype(np.int32), offsets)


def _naive_pairs(docs):
    """Every (token, next token) pair inside a document, as a multiset."""
    pairs = collections.Counter()
    for d in docs:
        pairs.update(zip(d.tolist()[:-1], d.tolist()[1:]))
    return pairs


@pytest.mark.parametrize("add_bos", [False, True])
def test_packing_loses_and_duplicates_nothing(add_bos):
    seq_len, batch, bos = 64, 4, 1
    docs = _documents()
    source = pipeline.ChunkSource(_split(docs), seq_len, add_bos, bos)
    chunks = [source[i] for i in range(len(source))]
    assert all(1 < len(c) <= seq_len + 1 for c in chunks)
    ds = grain.MapDataset.source(source).to_iter_dataset(pipeline.READ_OPTIONS)
    packed = list(packing.pack_rows(ds, seq_len, batch, seed=0, shuffle_bins=False,
                                    drop_remainder=False))
    segments, pairs = [], collections.Counter()
    for rows in packed:
        b = packing.to_model_batch(rows)
        assert set(b) == set(packing.BATCH_KEYS)
        assert all(v.dtype == np.int32 and v.shape[1] == seq_len for v in b.values())
        for r in range(len(b["inputs"])):
            tokens, seg, pos = (rows[k][r].tolist() for k in
                                ("tokens", "tokens_segment_ids", "tokens_positions"))
            nonzero = [s for s in seg if s]
            assert seg == nonzero + [0] * (len(seg) - len(nonzero))  # padding only at the end
            assert sorted(set(nonzero)) == list(range(1, len(set(nonzero)) + 1))
            for s in set(nonzero):
                where = [t for t in range(seq_len + 1) if seg[t] == s]
                assert where == list(range(where[0], where[-1] + 1))  # contiguous
                assert [pos[t] for t in where] == list(range(len(where)))
                segments.append(tuple(tokens[t] for t in where))
            for t in range(seq_len):  # the batch format, position by position
                assert b["inputs"][r, t] == tokens[t] and b["targets"][r, t] == tokens[t + 1]
                assert b["segment_ids"][r, t] == seg[t] and b["positions"][r, t] == pos[t]
                same = seg[t] != 0 and seg[t + 1] == seg[t]
                assert b["mask"][r, t] == same
                if same:
                    pairs[(tokens[t], tokens[t + 1])] += 1
    # Every chunk lands in exactly one row ...
    assert collections.Counter(segments) == collections.Counter(tuple(c.tolist())
                                                                for c in chunks)
    doc_pairs = _naive_pairs(docs)
    if add_bos:
        # ... every document token is a target exactly once, from BOS at each chunk start
        targets = collections.Counter()
        for (_, target), n in pairs.items():
            targets[target] += n
        assert targets == collections.Counter(t for d in docs for t in d.tolist())
        from_bos = sum(n for (a, _), n in pairs.items() if a == bos)
        assert from_bos == len(chunks)
        assert collections.Counter({k: n for k, n in pairs.items() if k[0] != bos}) <= doc_pairs
    else:
        # ... every (token, next token) pair of every document is trained on exactly once
        assert pairs == doc_pairs


def test_chunk_bounds_examples():
    assert packing.chunk_bounds(10, 4, add_bos=False) == [(0, 5), (4, 9), (8, 10)]
    assert packing.chunk_bounds(9, 4, add_bos=False) == [(0, 5), (4, 9)]
    assert packing.chunk_bounds(9, 4, add_bos=True) == [(0, 4), (4, 8), (8, 9)]
    assert packing.chunk_bounds(1, 4, add_bos=False) == []


def _local_data(docs, vocab=600):
    split = _split(docs)
    return pipeline.LocalData(tokenizer.ByteTokenizer(vocab), split, split, {})


def test_train_iterator_resumes_exactly_and_reshuffles_each_epoch():
    data_config = run_config.data_section("tiny")
    data_config.seq_len = 32
    data = _local_data(_documents(1, n=12))
    ds = pipeline.train_dataset(data, data_config, 4, seed=5)
    it = iter(ds)
    for _ in range(9):
        next(it)
    state = it.get_state()
    expected = [next(it) for _ in range(12)]
    again = iter(ds)
    again.set_state(json.loads(json.dumps(state)))  # the state survives a JSON round trip
    for a, b in zip(expected, [next(again) for _ in range(12)]):
        for key in packing.BATCH_KEYS:
            np.testing.assert_array_equal(a[key], b[key])
    source = pipeline.ChunkSource(data.train, 32, False, 1)
    order = grain.MapDataset.range(len(source)).shuffle(seed=5).repeat()
    first, second = [order[i] for i in range(len(source))], [
        order[i] for i in range(len(source), 2 * len(source))]
    assert sorted(first) == sorted(second) == list(range(len(source))) and first != second


def test_hosts_read_disjoint_shares():
    data_config = run_config.data_section("tiny")
    data_config.seq_len = 32
    data = _local_data(_documents(2, n=20))
    rows = []
    for host in range(2):
        batches = iter(pipeline.train_dataset(data, data_config, 4, seed=0, process_index=host,
                                              process_count=2))
        b = next(batches)
        assert b["inputs"].shape == (2, 32)
        rows.append({tuple(r) for r in b["inputs"].tolist()})
    assert not rows[0] & rows[1]


def test_byte_tokenizer_round_trip_and_vocab_check():
    tok = tokenizer.ByteTokenizer(300)
    ids = tok.encode(["héllo"])[0]
    assert ids.tolist() == [b + tokenizer.BYTE_OFFSET for b in "héllo".encode()]
    assert tok.decode(ids) == "héllo"
    with pytest.raises(ConfigError, match="vocab_size=200.*>= 259"):
        tokenizer.ByteTokenizer(200)


def test_sentencepiece_trains_once_then_comes_from_cache(tmp_path):
    docs = [corpus.Document(k, v) for k, v in sorted(topics.items())[:30]]
    tok = tokenizer.get_tokenizer("sentencepiece", 400, docs, workdir=tmp_path / "run",
                                  cache_dir=str(tmp_path / "cache"))
    assert tok.vocab_size == 400 and (tmp_path / "run" / tokenizer.TOKENIZER_FILE).exists()
    assert tok.decode(tok.encode([docs[0].text])[0]) == docs[0].text
    cached = list((tmp_path / "cache" / "tokenizers").iterdir())
    assert len(cached) == 1
    stamp = cached[0].stat().st_mtime_ns
    tokenizer.get_tokenizer("sentencepiece", 400, docs, cache_dir=str(tmp_path / "cache"))
    assert cached[0].stat().st_mtime_ns == stamp  # not retrained
    with pytest.raises(ConfigError, match="has 400 tokens but model.vocab_size=512"):
        tokenizer.get_tokenizer("sentencepiece", 512, workdir=tmp_path / "run")


def test_split_is_by_name_and_order_free():
    docs = [corpus.Document(f"doc{i}", "x" * i) for i in range(200)]
    train, held = corpus.split_documents(docs, 0.1)
    train2, held2 = corpus.split_documents(docs[::-1], 0.1)
    assert {d.name for d in held} == {d.name for d in held2}
    assert not {d.name for d in train} & {d.name for d in held}
    assert 5 <= len(held) <= 40


def test_text_files_read_txt_and_jsonl(tmp_path):
    (tmp_path / "a.txt").write_text("first document")
    (tmp_path / "b.jsonl").write_text('{"text": "one"}\n\n{"text": "two"}\n')
    docs = corpus.text_files(f"{tmp_path}/*.txt,{tmp_path}/b.jsonl")
    assert [d.text for d in docs] == ["first document", "one", "two"]
    (tmp_path / "c.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(ConfigError, match=r"c\.jsonl:1 has no field 'text' \(data\.text_key\)"):
        corpus.text_files(str(tmp_path / "c.jsonl"))
    (tmp_path / "d.jsonl").write_text('{"text": "one"}\nnot json\n')
    with pytest.raises(ConfigError, match=r"d\.jsonl:2 is not a JSON record"):
        corpus.text_files(str(tmp_path / "d.jsonl"))
    (tmp_path / "e.txt").write_bytes(b"\xff\xfe binary")
    with pytest.raises(ConfigError, match=r"^data\.paths: '.*e\.txt' is not UTF-8 text"):
        corpus.text_files(str(tmp_path / "e.txt"))
    # a user error, and still a missing file to callers that ask for one
    with pytest.raises(ConfigError, match="matches no file") as missing:
        corpus.text_files(str(tmp_path / "missing*.txt"))
    assert isinstance(missing.value, FileNotFoundError)
