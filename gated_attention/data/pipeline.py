"""The input pipeline for the local sources: documents -> tokens -> shuffled chunks -> batches.

Tokenised splits are cached on disk (keyed by the corpus and tokenizer), so a second run
starts at once. Chunks are shuffled globally with a seed and re-shuffled every epoch
(grain's MapDataset.shuffle + repeat); each host takes every process_count-th chunk, then
packs and batches its share. The grain iterator's state (a few integers) is saved with each
checkpoint, so a resumed run sees the very batches an uninterrupted run would.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError
from gated_attention.data import corpus as corpus_lib
from gated_attention.data import packing
from gated_attention.data.tokenizer import Tokenizer, get_tokenizer
from gated_attention.parallel.distributed import per_host_batch

# Chunks are cheap slices of an array in memory: grain's thread pool only adds overhead here
# (4x slower per batch), so read them in the calling thread.
READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)


@dataclasses.dataclass(frozen=True)
class TokenizedSplit:
    """Documents of one split as a flat token array and document offsets into it."""

    tokens: np.ndarray   # [total] int32
    offsets: np.ndarray  # [documents + 1] int64

    @property
    def num_documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, i: int) -> np.ndarray:
        return self.tokens[self.offsets[i]:self.offsets[i + 1]]


class ChunkSource:
    """Random access to the chunks of a split (grain data source: __len__, __getitem__)."""

    def __init__(self, split: TokenizedSplit, seq_len: int, add_bos: bool, bos_id: int):
        bounds = [(int(base) + s, int(base) + e)
                  for i, base in enumerate(split.offsets[:-1])
                  for s, e in packing.chunk_bounds(int(split.offsets[i + 1] - base), seq_len,
                                                   add_bos)]
        self.bounds = np.asarray(bounds, np.int64).reshape(-1, 2)
        self.tokens, self.add_bos, self.bos_id = split.tokens, add_bos, bos_id

    def __len__(self) -> int:
        return len(self.bounds)

    def __getitem__(self, index: int) -> np.ndarray:
        start, end = self.bounds[index]
        piece = self.tokens[start:end]
        if self.add_bos:
            return np.concatenate([np.asarray([self.bos_id], np.int32), piece])
        return np.array(piece, np.int32)


class ConcatRowSource:
    """Rows of seq_len + 1 tokens of a split's documents joined end to end (data.packing=
    'concat'): row i is tokens[i*S : i*S + S + 1], so rows overlap by one token and every
    next-token pair of the joined stream is a target exactly once. With add_bos every
    document starts with BOS."""

    def __init__(self, split: TokenizedSplit, seq_len: int, add_bos: bool, bos_id: int):
        tokens = split.tokens
        if add_bos:
            tokens = np.insert(tokens, split.offsets[:-1], np.int32(bos_id))
        self.tokens, self.seq_len = tokens.astype(np.int32), seq_len

    def __len__(self) -> int:
        return max(len(self.tokens) - 1, 0) // self.seq_len

    def __getitem__(self, index: int) -> np.ndarray:
        start = index * self.seq_len
        return np.array(self.tokens[start:start + self.seq_len + 1], np.int32)


def _is_concat(data_config: Any) -> bool:
    return data_config.get("packing", "segments") == "concat"


@dataclasses.dataclass
class LocalData:
    tokenizer: Tokenizer
    train: TokenizedSplit
    held_out: TokenizedSplit
    summary: dict[str, Any]


def tokenize(documents: Sequence[corpus_lib.Document], tokenizer: Tokenizer, add_eos: bool
             ) -> TokenizedSplit:
    ids = tokenizer.encode([d.text for d in documents])
    if add_eos:
        ids = [np.append(x, np.int32(tokenizer.eos_id)) for x in ids]
    lengths = np.asarray([len(x) for x in ids], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    tokens = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32)
    return TokenizedSplit(tokens, offsets)


def tokenizer_id(tokenizer: Tokenizer) -> str:
    """A tokenizer's identity: token caches and the ArrayRecord manifests key on it."""
    if getattr(tokenizer, "fingerprint", None):  # a tokenizer.json: its text and special ids
        return tokenizer.fingerprint
    model_file = getattr(tokenizer, "model_file", None)
    if model_file is None:
        return f"byte{tokenizer.vocab_size}"
    return hashlib.sha256(paths.resolve(model_file).read_bytes()).hexdigest()[:16]


def _cached_tokenize(documents: Sequence[corpus_lib.Document], tokenizer: Tokenizer,
                     add_eos: bool, cache_dir: str) -> TokenizedSplit:
    key = hashlib.sha256(f"{corpus_lib.fingerprint(documents)}|{tokenizer_id(tokenizer)}|"
                         f"{add_eos}".encode()).hexdigest()[:20]
    path = corpus_lib.cache_root(cache_dir) / "tokens" / f"{key}.npz"
    if path.exists():
        with np.load(path) as data:
            return TokenizedSplit(data["tokens"], data["offsets"])
    split = tokenize(documents, tokenizer, add_eos)
    buffer = io.BytesIO()
    np.savez(buffer, tokens=split.tokens, offsets=split.offsets)
    paths.write_atomic(path, buffer.getvalue())
    return split


def load_local_data(data_config: Any, vocab_size: int,
                    workdir: str | os.PathLike[str] | None = None) -> LocalData:
    """Collect, split, tokenise (training the tokenizer on the train split if needed)."""
    documents = corpus_lib.load_documents(data_config.source, paths=data_config.paths,
                                          text_key=data_config.text_key,
                                          cache_dir=data_config.cache_dir)
    train_docs, held_out_docs = corpus_lib.split_documents(documents, data_config.eval_fraction)
    tokenizer = get_tokenizer(
        data_config.tokenizer, vocab_size, train_docs, workdir=workdir,
        cache_dir=data_config.cache_dir, model_type=data_config.sp_model_type,
        input_sentence_size=data_config.sp_input_sentence_size,
        model_path=data_config.get("tokenizer_path", ""))
    train = _cached_tokenize(train_docs, tokenizer, data_config.add_eos, data_config.cache_dir)
    held_out = _cached_tokenize(held_out_docs, tokenizer, data_config.add_eos,
                                data_config.cache_dir)
    summary = {
        "source": data_config.source,
        "corpus": corpus_lib.summary(documents),
        "train": {**corpus_lib.summary(train_docs), "tokens": int(train.tokens.size)},
        "held_out": {**corpus_lib.summary(held_out_docs), "tokens": int(held_out.tokens.size)},
        "tokenizer": {"kind": data_config.tokenizer, "vocab_size": tokenizer.vocab_size,
                      "id": tokenizer_id(tokenizer)},
    }
    if workdir is not None:
        root = paths.resolve(workdir)
        paths.write_atomic(root / "data_summary.json", json.dumps(summary, indent=2) + "\n")
        paths.write_atomic(root / "data_documents.txt",
            "".join(f"{'held_out' if d in held_out_set else 'train'}\t{d}\n"
                    for held_out_set in [{x.name for x in held_out_docs}]
                    for d in (x.name for x in documents)))
    return LocalData(tokenizer, train, held_out, summary)


def train_dataset(data: LocalData, data_config: Any, batch_size: int, *, seed: int,
                  process_index: int = 0, process_count: int = 1) -> grain.IterDataset:
    """Endless, shuffled, host-sharded batches of the training split (this host's share)."""
    if _is_concat(data_config):
        from gated_attention.data.streams import concat_batch

        rows = ConcatRowSource(data.train, data_config.seq_len, data_config.add_bos,
                               data.tokenizer.bos_id)
        rows = grain.MapDataset.source(rows).shuffle(seed=seed).repeat()
        rows = rows[process_index::process_count].batch(per_host_batch(batch_size,
                                                                       process_count))
        return rows.map(lambda r: concat_batch(r, with_segments=False)).to_iter_dataset(
            READ_OPTIONS)
    source = ChunkSource(data.train, data_config.seq_len, data_config.add_bos,
                         data.tokenizer.bos_id)
    chunks = grain.MapDataset.source(source).shuffle(seed=seed).repeat()
    chunks = chunks[process_index::process_count]
    return packing.pack_and_batch(chunks.to_iter_dataset(READ_OPTIONS), data_config.seq_len,
                                  per_host_batch(batch_size, process_count), seed=seed,
                                  shuffle_bins=True)


def eval_batches(data: LocalData, data_config: Any, batch_size: int, num_batches: int, *,
                 process_index: int = 0, process_count: int = 1) -> list[packing.Batch]:
    """The first num_batches batches of the held-out split, in document order (fixed)."""
    if _is_concat(data_config):
        from gated_attention.data.streams import concat_batch

        rows = ConcatRowSource(data.held_out, data_config.seq_len, data_config.add_bos,
                               data.tokenizer.bos_id)
        local = per_host_batch(batch_size, process_count)
        rows = grain.MapDataset.source(rows)[process_index::process_count]
        out = [concat_batch(np.stack([rows[i] for i in range(b, b + local)]),
                            with_segments=True)
               for b in range(0, min(len(rows), num_batches * local) - local + 1, local)]
        if not out:
            raise ConfigError(f"the held-out split has too few tokens "
                              f"({data.held_out.tokens.size}) for one batch of {batch_size} x "
                              f"{data_config.seq_len}; raise data.eval_fraction or lower "
                              "train.batch_size")
        return out
    source = ChunkSource(data.held_out, data_config.seq_len, data_config.add_bos,
                         data.tokenizer.bos_id)
    chunks = grain.MapDataset.source(source)[process_index::process_count]
    batches = packing.pack_and_batch(chunks.to_iter_dataset(READ_OPTIONS), data_config.seq_len,
                                     per_host_batch(batch_size, process_count), seed=0,
                                     shuffle_bins=False)
    out = []
    for batch in batches:
        if len(out) == num_batches:
            break
        out.append(batch)
    if not out:
        raise ConfigError(f"the held-out split has too few tokens ({data.held_out.tokens.size}) "
                          f"for one batch of {batch_size} x {data_config.seq_len}; raise "
                          "data.eval_fraction or lower train.batch_size")
    return out


def analysis_batches(data: LocalData, data_config: Any, batch_size: int, num_batches: int
                     ) -> list[packing.Batch]:
    """Held-out rows that are each one whole chunk at positions 0..S-1 (for F-Attn, M-Act)."""
    source = ChunkSource(data.held_out, data_config.seq_len, data_config.add_bos,
                         data.tokenizer.bos_id)
    full = [i for i in range(len(source))
            if source.bounds[i, 1] - source.bounds[i, 0] + data_config.add_bos
            == data_config.seq_len + 1]
    rows = [source[i] for i in full[:batch_size * num_batches]]
    return [packing.single_segment_batch(np.stack(rows[i:i + batch_size]))
            for i in range(0, len(rows) - batch_size + 1, batch_size)]
