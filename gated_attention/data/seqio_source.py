"""seqio Tasks as a data source, for pod-scale runs (C4 through tfds) and local text files.

seqio and tensorflow are heavy optional dependencies (`pip install -e '.[seqio]'`), imported
only here. seqio reads, shuffles, shards (one shard per host) and tokenises documents; the
same chunking and first-fit packing as the grain path then turn them into the same batch
format, so both sources yield identical batches from identical token streams.

    register_c4_task("/path/to/spm.model")  # "c4_en_gated_attention": tfds c4/en, text field
    --config.data.source=seqio --config.data.tokenizer_path=/path/to/spm.model

Resuming: the iterator state is (documents consumed, chunks of the current document
emitted); restoring rebuilds the (seeded, deterministic) tf.data pipeline and skips that many
documents.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from gated_attention.data import packing

C4_TASK = "c4_en_gated_attention"


def _seqio():
    try:
        import seqio
    except ImportError as err:
        raise ImportError("data.source='seqio' needs the seqio extra: "
                          "pip install -e '.[seqio]'") from err
    return seqio


def _output_features(vocab_path: str, add_eos: bool) -> dict[str, Any]:
    seqio = _seqio()
    vocabulary = seqio.SentencePieceVocabulary(os.path.expanduser(vocab_path))
    return {"targets": seqio.Feature(vocabulary, add_eos=add_eos, dtype=_tf().int32)}


def _tf():
    import tensorflow as tf

    return tf


def _preprocessors(text_key: str | None) -> list[Any]:
    seqio = _seqio()
    first = (functools.partial(seqio.preprocessors.rekey, key_map={"targets": text_key})
             if text_key else _line_to_targets)
    return [first, seqio.preprocessors.tokenize, seqio.preprocessors.append_eos]


def _line_to_targets(dataset: Any) -> Any:
    """TextLineDataSource yields bare strings; seqio's tokenize wants {"targets": text}."""
    return dataset.map(lambda line: {"targets": line})


def _register(name: str, source: Any, vocab_path: str, add_eos: bool, text_key: str | None
              ) -> str:
    seqio = _seqio()
    if name in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(name, source=source, preprocessors=_preprocessors(text_key),
                           output_features=_output_features(vocab_path, add_eos))
    return name


def register_c4_task(vocab_path: str, *, name: str = C4_TASK, tfds_name: str = "c4/en:3.0.1",
                     tfds_data_dir: str | None = None, add_eos: bool = True) -> str:
    """A C4-style task: the `text` field of a tfds dataset, tokenised with `vocab_path`."""
    seqio = _seqio()
    source = seqio.TfdsDataSource(tfds_name=tfds_name, tfds_data_dir=tfds_data_dir or None)
    return _register(name, source, vocab_path, add_eos, text_key="text")


def register_text_task(name: str, split_files: dict[str, Sequence[str]], vocab_path: str, *,
                       add_eos: bool = True) -> str:
    """A task over local text files with one document per line (split -> file patterns)."""
    seqio = _seqio()
    source = seqio.TextLineDataSource(split_to_filepattern={k: list(v) for k, v in
                                                            split_files.items()})
    return _register(name, source, vocab_path, add_eos, text_key=None)


def document_stream(task: str, split: str, *, shuffle: bool, seed: int, shard_index: int = 0,
                    num_shards: int = 1, skip: int = 0, repeat: bool = True
                    ) -> Iterator[np.ndarray]:
    """Token ids of each document of the task's split (this host's shard), as int32 arrays."""
    seqio = _seqio()
    dataset = seqio.get_mixture_or_task(task).get_dataset(
        sequence_length=None, split=split, shuffle=shuffle, seed=seed,
        shard_info=seqio.ShardInfo(index=shard_index, num_shards=num_shards),
        num_epochs=None if repeat else 1, use_cached=False)
    for example in dataset.skip(skip).as_numpy_iterator():
        yield np.asarray(example["targets"], np.int32)


class SeqioChunkIterator(grain.DatasetIterator):
    """Chunks of the documents of a seqio task; checkpointable by (documents, chunk)."""

    def __init__(self, stream_args: dict[str, Any], seq_len: int, add_bos: bool, bos_id: int):
        super().__init__()
        self._args, self._seq_len, self._add_bos, self._bos = stream_args, seq_len, add_bos, bos_id
        self._restart(0, 0)

    def _restart(self, documents: int, chunk: int) -> None:
        """Continue at chunk `chunk` of the document after the first `documents` ones."""
        self._documents, self._chunk = documents, chunk
        self._stream = document_stream(**self._args, skip=documents)
        self._current: list[np.ndarray] | None = None

    def __next__(self) -> np.ndarray:
        while True:
            if self._current is None:
                self._current = packing.chunk_document(next(self._stream), self._seq_len,
                                                       self._add_bos, self._bos)
            if self._chunk < len(self._current):
                self._chunk += 1
                return self._current[self._chunk - 1]
            self._documents, self._chunk, self._current = self._documents + 1, 0, None

    def get_state(self) -> dict[str, Any]:
        return {"documents": self._documents, "chunk": self._chunk}

    def set_state(self, state: dict[str, Any]) -> None:
        self._restart(int(state["documents"]), int(state["chunk"]))


class SeqioChunkDataset(grain.IterDataset):
    def __init__(self, stream_args: dict[str, Any], seq_len: int, add_bos: bool, bos_id: int):
        super().__init__()
        self._init = (stream_args, seq_len, add_bos, bos_id)

    def __iter__(self) -> SeqioChunkIterator:
        return SeqioChunkIterator(*self._init)


def batches(task: str, split: str, data_config: Any, batch_size: int, bos_id: int, *,
            shuffle: bool, seed: int, repeat: bool, shard_index: int = 0, num_shards: int = 1
            ) -> grain.IterDataset:
    """Packed batches (the model's format) of a seqio task's documents."""
    stream_args = dict(task=task, split=split, shuffle=shuffle, seed=seed,
                       shard_index=shard_index, num_shards=num_shards, repeat=repeat)
    chunks = SeqioChunkDataset(stream_args, data_config.seq_len, data_config.add_bos, bos_id)
    return packing.pack_and_batch(chunks, data_config.seq_len, batch_size, seed=seed,
                                  shuffle_bins=shuffle)


def build_inputs(config: Any, workdir: Any, *, process_index: int, process_count: int):
    """Inputs for data.source='seqio' (the C4 task unless data.seqio_task names another)."""
    import json

    from gated_attention import paths
    from gated_attention.data import Inputs
    from gated_attention.data.pipeline import per_host_batch
    from gated_attention.data.tokenizer import get_tokenizer

    data, train = config.data, config.train
    tokenizer = get_tokenizer("sentencepiece", config.model.vocab_size, workdir=workdir,
                              model_path=data.tokenizer_path)
    task = data.seqio_task or register_c4_task(data.tokenizer_path, add_eos=data.add_eos,
                                               tfds_data_dir=data.tfds_data_dir or None)
    local_batch = per_host_batch(train.batch_size, process_count)
    shard = dict(shard_index=process_index, num_shards=process_count)
    train_iter = iter(batches(task, "train", data, local_batch, tokenizer.bos_id, shuffle=True,
                              seed=data.shuffle_seed, repeat=True, **shard))
    evals = []
    if train.eval_batches:
        for batch in batches(task, data.seqio_eval_split, data, local_batch, tokenizer.bos_id,
                             shuffle=False, seed=0, repeat=False, **shard):
            evals.append(batch)
            if len(evals) == train.eval_batches:
                break
    summary = {"source": "seqio", "task": task, "tokenizer": {
        "kind": "sentencepiece", "vocab_size": tokenizer.vocab_size,
        "path": str(data.tokenizer_path)}}
    if workdir is not None:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(summary, indent=2) + "\n")
    return Inputs(train_iter, evals, tokenizer, summary)
