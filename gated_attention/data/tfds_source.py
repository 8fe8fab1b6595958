"""data.source=tfds: a prepared tensorflow-datasets dataset (e.g. `c4/en:3.1.0`), read from
data.tfds_data_dir (a local folder or gs://) and tokenised on the fly by the run's tokenizer.

Each host reads only its contiguous share of the split (`tfds.even_splits`); the training
stream shuffles files and examples with data.shuffle_seed and repeats, each pass reshuffled.
The iterator state is the number of documents consumed (streams.DocumentStream), so a resumed
run re-reads its share up to there: fine for tests and short runs; at pod scale tokenize once
with `python -m gated_attention.data.prepare` and train on the ArrayRecord shards instead.
Nothing downloads: a dataset that is not prepared in the data_dir is refused by name.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError, require
from gated_attention.data import streams

ENCODE_BLOCK = 256  # documents tokenised per call (the tokenizers batch internally)
SHUFFLE_BUFFER = 10_000  # documents


SECTION = "tfds"  # config.data.tfds; where it is prepared, and the text feature, are the
                  # shared data.tfds_data_dir and data.text_key
FIELDS = dict(
    name="",                  # e.g. "c4/en:3.1.0" (prepared, never downloaded)
    train_split="train",      # split names (tfds slicing allowed)
    eval_split="validation",
)
FLAT_ALIASES = {"tfds_name": "name", "tfds_train_split": "train_split",
                "tfds_eval_split": "eval_split"}


class TfdsSourceError(ConfigError):
    """The tfds dataset, split or feature named in the config is not there."""


def check(config: Any, cfg: Any) -> None:
    """A stream trains no tokenizer: a SentencePiece one must be given."""
    data = config.data
    require(data.tokenizer != "sentencepiece" or bool(data.tokenizer_path),
            "data.source='tfds' streams its text: data.tokenizer='sentencepiece' needs "
            "data.tokenizer_path (a .model file), since nothing is trained on a stream; or use "
            "data.tokenizer='hf' or 'byte'")


def check_files(config: Any) -> None:
    check_dataset(config.data)


def _tfds():
    import tensorflow_datasets as tfds

    return tfds


def open_builder(data_config: Any) -> Any:
    """The dataset's builder, prepared in data.tfds_data_dir (never downloads)."""
    tfds = _tfds()
    name, data_dir = data_config.tfds.name, data_config.tfds_data_dir or None
    where = f"data.tfds_data_dir={data_config.tfds_data_dir!r}" if data_dir else \
        "the default tfds data dir (~/tensorflow_datasets; set data.tfds_data_dir)"
    if not name:
        raise TfdsSourceError("data.source='tfds' needs data.tfds.name (e.g. 'c4/en:3.1.0'; "
                              "data.tfds_name is its old spelling)")
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except Exception as err:  # noqa: BLE001 - tfds raises several kinds for a missing dataset
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise TfdsSourceError(f"data.tfds.name={name!r} is not found in {where}: {first}"
                              ) from None
    if not builder.is_prepared():
        raise TfdsSourceError(f"data.tfds.name={name!r} is not prepared in {where}; prepare it "
                              "first (e.g. `tfds build` with --data_dir), nothing is downloaded "
                              "at training time")
    return builder


def check_dataset(data_config: Any) -> dict[str, int]:
    """Before compiling: the dataset, both splits and the text feature exist.
    Returns {split: number of documents}."""
    builder = open_builder(data_config)
    splits = builder.info.splits
    counts = {}
    for field in ("train_split", "eval_split"):
        split = data_config.tfds[field]
        base = split.split("[")[0]
        if base not in splits:
            raise TfdsSourceError(f"data.tfds.{field}={split!r} is not a split of "
                                  f"{data_config.tfds.name!r}; splits: {', '.join(splits)}")
        counts[split] = int(splits[split].num_examples)
    features = builder.info.features
    if data_config.text_key not in features:
        raise TfdsSourceError(f"data.text_key={data_config.text_key!r} is not a feature of "
                              f"{data_config.tfds.name!r}; features: {', '.join(features)}")
    return counts


def texts(builder: Any, split: str, text_key: str, *, shuffle: bool, seed: int, repeat: bool,
          process_index: int = 0, process_count: int = 1, skip: int = 0
          ) -> Iterator[list[str]]:
    """Blocks of this host's documents (decoded text), after the first `skip`.

    Datasets prepared as ArrayRecord (`--file_format=array_record`) are read by index with
    grain (no tf.data); TFRecord ones (tfds' default, e.g. C4) through tf.data.
    """
    tfds = _tfds()
    host_split = tfds.even_splits(split, n=process_count)[process_index]
    if getattr(builder.info.file_format, "value", builder.info.file_format) == "array_record":
        yield from _array_record_texts(builder, host_split, text_key, shuffle=shuffle,
                                       seed=seed, repeat=repeat, skip=skip)
        return
    # An ordered dataset (disable_shuffling) refuses shuffled files; the buffer still shuffles.
    shuffle_files = shuffle and not builder.info.disable_shuffling
    dataset = builder.as_dataset(split=host_split, shuffle_files=shuffle_files,
                                 read_config=tfds.ReadConfig(shuffle_seed=seed))
    dataset = dataset.map(lambda example: example[text_key])
    if shuffle:
        dataset = dataset.shuffle(SHUFFLE_BUFFER, seed=seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    for block in dataset.skip(skip).batch(ENCODE_BLOCK).as_numpy_iterator():
        yield [t.decode("utf-8") for t in block]


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _array_record_texts(builder: Any, split: Any, text_key: str, *, shuffle: bool, seed: int,
                        repeat: bool, skip: int) -> Iterator[list[str]]:
    import grain

    documents = grain.MapDataset.source(builder.as_data_source(split=split))
    if shuffle:
        documents = documents.shuffle(seed=seed)
    if repeat:
        documents = documents.repeat()
    index = skip
    while index < len(documents):
        end = min(index + ENCODE_BLOCK, len(documents))
        yield [_text(documents[i][text_key]) for i in range(index, end)]
        index = end


def token_documents(tokenizer: Any, text_blocks: Iterator[list[str]], add_eos: bool
                    ) -> Iterator[np.ndarray]:
    """Tokenise blocks of texts; each document ends in EOS when add_eos."""
    eos = np.asarray([tokenizer.eos_id], np.int32)
    for block in text_blocks:
        for ids in tokenizer.encode(block):
            yield np.concatenate([ids, eos]) if add_eos else ids


def document_stream(builder: Any, split: str, data_config: Any, tokenizer: Any, *,
                    shuffle: bool, seed: int, repeat: bool, process_index: int = 0,
                    process_count: int = 1) -> streams.DocumentStream:
    def open_stream(skip: int) -> Iterator[np.ndarray]:
        return token_documents(tokenizer, texts(
            builder, split, data_config.text_key, shuffle=shuffle, seed=seed, repeat=repeat,
            process_index=process_index, process_count=process_count, skip=skip),
            data_config.add_eos)

    return streams.DocumentStream(open_stream)


def estimate_tokens(builder: Any, split: str, data_config: Any, tokenizer: Any,
                    documents: int) -> int:
    """Tokens in a split: its documents x the mean tokens of its first ENCODE_BLOCK ones (for
    the epoch guard; C4's documents are alike enough for that)."""
    first = next(texts(builder, split, data_config.text_key, shuffle=False, seed=0,
                       repeat=False), [])
    if not first:
        return 0
    sample = sum(len(x) for x in token_documents(tokenizer, iter([first]), data_config.add_eos))
    return round(documents * sample / len(first))


def build_inputs(config: Any, workdir: Any, *, process_index: int, process_count: int):
    from gated_attention.data.inputs import Inputs, stream_tokenizer, tokenizer_summary
    from gated_attention.data.pipeline import per_host_batch

    data, train = config.data, config.train
    counts = check_dataset(data)
    builder = open_builder(data)
    tokenizer = stream_tokenizer(config, workdir)
    local_batch = per_host_batch(train.batch_size, process_count)
    host = dict(process_index=process_index, process_count=process_count)
    section = data.tfds
    train_docs = document_stream(builder, section.train_split, data, tokenizer, shuffle=True,
                                 seed=data.shuffle_seed, repeat=True, **host)
    train_iter = iter(streams.batches(train_docs, data, local_batch, tokenizer.bos_id,
                                      seed=data.shuffle_seed, shuffle_bins=True))
    eval_docs = document_stream(builder, section.eval_split, data, tokenizer, shuffle=False,
                                seed=0, repeat=False, **host)
    evals = streams.first_batches(streams.batches(eval_docs, data, local_batch,
                                                  tokenizer.bos_id, seed=0, shuffle_bins=False,
                                                  for_eval=True), train.eval_batches)
    if train.eval_batches and not evals:
        raise TfdsSourceError(f"data.tfds.eval_split={section.eval_split!r} is too small for "
                              f"one batch of {train.batch_size} x {data.seq_len}")
    summary = {"source": "tfds", "tfds_name": section.name,
               "train": {"split": section.train_split,
                         "documents": counts[section.train_split],
                         "tokens_estimated": estimate_tokens(
                             builder, section.train_split, data, tokenizer,
                             counts[section.train_split])},
               "held_out": {"split": section.eval_split,
                            "documents": counts[section.eval_split]},
               "tokenizer": tokenizer_summary(data, tokenizer)}
    if workdir is not None:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(summary, indent=2) + "\n")
    return Inputs(train_iter, evals, tokenizer, summary)

