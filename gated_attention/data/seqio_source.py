"""seqio Tasks as a data source, for pod-scale runs (C4 through tfds) and local text files.

seqio and tensorflow are heavy optional dependencies (`pip install -e '.[seqio]'`), imported
only here. seqio reads, shuffles, shards (one shard per host) and tokenises documents; the
same chunking and first-fit packing as the grain path then turn them into the same batch
format, so both sources yield identical batches from identical token streams.

    register_c4_task("/path/to/spm.model")  # "c4_en_gated_attention": tfds c4/en, text field
    --config.data.source=seqio --config.data.tokenizer_path=/path/to/spm.model

A user's own task: register it in a module and name both on the command line
(`--seqio_module=my_pkg.tasks --config.data.source=seqio --config.data.seqio.task=my_task`);
its SentencePiece vocabulary is the run's tokenizer unless data.tokenizer_path names one.

Resuming: the iterator state counts the documents consumed (streams.DocumentStream);
restoring rebuilds the (seeded, deterministic) tf.data pipeline and skips that many.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Sequence
from typing import Any

import grain
import numpy as np

from gated_attention.core.checks import ConfigError, require
from gated_attention.data import streams

C4_TASK = "c4_en_gated_attention"
SECTION = "seqio"  # config.data.seqio; the C4 task reads data.tfds_data_dir (shared)
FIELDS = dict(
    task="",                  # a registered task or mixture ("" = the C4 task)
    eval_split="validation",  # the task's split held out
)
FLAT_ALIASES = {"seqio_task": "task", "seqio_eval_split": "eval_split"}
OWN_VOCABULARY = True  # the task's SentencePiece vocabulary gives the token ids


def check(config: Any, cfg: Any) -> None:
    data = config.data
    require(bool(data.tokenizer_path or data.seqio.task), "data.source='seqio' needs "
            "data.tokenizer_path (a SentencePiece .model file with model.vocab_size pieces) or "
            "data.seqio.task (a registered task, which brings its vocabulary)")
    require(data.tokenizer == "sentencepiece", "data.source='seqio' reads a SentencePiece "
            f"vocabulary; data.tokenizer must be 'sentencepiece', not {data.tokenizer!r}")


def check_files(config: Any) -> None:
    """The registered task and its vocabulary can be opened."""
    if config.data.seqio.task:
        task_and_tokenizer(config, None)


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
                       add_eos: bool = True, num_input_examples: dict[str, int] | None = None
                       ) -> str:
    """A task over local text files with one document per line (split -> file patterns);
    num_input_examples (documents per split, if known) lets the epoch guard size it."""
    seqio = _seqio()
    source = seqio.TextLineDataSource(split_to_filepattern={k: list(v) for k, v in
                                                            split_files.items()},
                                      num_input_examples=num_input_examples)
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


def documents(task: str, split: str, *, shuffle: bool, seed: int, repeat: bool,
              shard_index: int = 0, num_shards: int = 1) -> streams.DocumentStream:
    """A task's documents as a checkpointable stream (state: documents consumed)."""
    args = dict(task=task, split=split, shuffle=shuffle, seed=seed, shard_index=shard_index,
                num_shards=num_shards, repeat=repeat)
    return streams.DocumentStream(lambda skip: document_stream(**args, skip=skip))


def batches(task: str, split: str, data_config: Any, batch_size: int, bos_id: int, *,
            shuffle: bool, seed: int, repeat: bool, shard_index: int = 0, num_shards: int = 1,
            for_eval: bool = False) -> grain.IterDataset:
    """Packed batches (the model's format) of a seqio task's documents."""
    docs = documents(task, split, shuffle=shuffle, seed=seed, repeat=repeat,
                     shard_index=shard_index, num_shards=num_shards)
    return streams.batches(docs, data_config, batch_size, bos_id, seed=seed,
                           shuffle_bins=shuffle, for_eval=for_eval)


class SeqioTaskError(ConfigError):
    """data.seqio.task is not registered, or its vocabulary is not a SentencePiece model."""


def task_and_tokenizer(config: Any, workdir: Any) -> tuple[str, Any]:
    """(task name, tokenizer): data.seqio.task with its own vocabulary (unless
    data.tokenizer_path names one), else the C4 task over data.tokenizer_path."""
    from gated_attention.data.tokenizer import get_tokenizer

    data = config.data
    model_path = data.tokenizer_path
    if data.seqio.task:
        seqio = _seqio()
        if data.seqio.task not in seqio.TaskRegistry.names() | seqio.MixtureRegistry.names():
            raise SeqioTaskError(f"data.seqio.task={data.seqio.task!r} is not a registered "
                                 "seqio task or mixture; register it in a module and pass "
                                 "--seqio_module=that.module")
        task = data.seqio.task
        if not model_path:
            vocabulary = seqio.get_mixture_or_task(task).output_features["targets"].vocabulary
            model_path = getattr(vocabulary, "sentencepiece_model_file", "")
            if not model_path:
                raise SeqioTaskError(
                    f"data.seqio.task={task!r} has a {type(vocabulary).__name__} vocabulary; "
                    "only SentencePiece vocabularies are read (or set data.tokenizer_path)")
    else:
        task = register_c4_task(model_path, add_eos=data.add_eos,
                                tfds_data_dir=data.tfds_data_dir or None)
    tokenizer = get_tokenizer("sentencepiece", config.model.vocab_size, workdir=workdir,
                              model_path=model_path)
    return task, tokenizer


def estimate_tokens(task: str, split: str, sample: int = 256) -> int | None:
    """Tokens in a task's split (for the epoch guard): its documents, where the source knows
    them, x the mean tokens of its first `sample` documents; None if the count is unknown."""
    try:
        documents = _seqio().get_mixture_or_task(task).num_input_examples(split)
    except Exception:  # noqa: BLE001 - sources without a count raise various errors
        documents = None
    if not documents:
        return None
    first = []
    for ids in document_stream(task, split, shuffle=False, seed=0, repeat=False):
        first.append(len(ids))
        if len(first) == sample:
            break
    return round(documents * sum(first) / len(first)) if first else None


def build_inputs(config: Any, workdir: Any, *, process_index: int, process_count: int):
    """Inputs for data.source='seqio' (the C4 task unless data.seqio.task names another)."""
    import json

    from gated_attention.core import paths
    from gated_attention.data.inputs import Inputs
    from gated_attention.parallel.distributed import per_host_batch

    data, train = config.data, config.train
    task, tokenizer = task_and_tokenizer(config, workdir)
    local_batch = per_host_batch(train.batch_size, process_count)
    shard = dict(shard_index=process_index, num_shards=process_count)
    train_iter = iter(batches(task, "train", data, local_batch, tokenizer.bos_id, shuffle=True,
                              seed=data.shuffle_seed, repeat=True, **shard))
    evals = streams.first_batches(
        batches(task, data.seqio.eval_split, data, local_batch, tokenizer.bos_id,
                shuffle=False, seed=0, repeat=False, for_eval=True, **shard), train.eval_batches)
    summary = {"source": "seqio", "task": task,
               "train": {"tokens_estimated": estimate_tokens(task, "train")}, "tokenizer": {
        "kind": "sentencepiece", "vocab_size": tokenizer.vocab_size,
        "path": str(data.tokenizer_path)}}
    if workdir is not None:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(summary, indent=2) + "\n")
    return Inputs(train_iter, evals, tokenizer, summary)
