"""Tokenize a run's data source once into ArrayRecord shards, for data.source=array_record.

    python -m gated_attention.data.prepare \
        --config=configs/ablation.py:arch=dense_1p7b_28l,variant=baseline \
        --config.data.source=tfds --config.data.tfds.name=c4/en:3.1.0 \
        --config.data.tfds_data_dir=/mnt/bucket/tfds \
        --config.data.tokenizer=hf --config.data.tokenizer_path=/mnt/bucket/qwen/tokenizer.json \
        --out=/mnt/bucket/c4_qwen --num_shards=64

Any source works (cpython_docs, python_source, files, tfds, seqio). Documents are written in
source order, round-robin over the shards; the training split goes to `--num_shards` shards
(use at least as many as hosts) and the held-out split to `--num_eval_shards`. The manifest
(written last, so a folder without one is an unfinished prepare) records the token and
document counts, the tokenizer and source fingerprints and the splits. --out must be new or
empty: nothing is overwritten. ArrayRecord writes local files; for a bucket, write to a
gcsfuse mount (see docs/data_at_scale.md).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from absl import app, flags
from ml_collections import config_flags

from gated_attention.core import errors, paths
from gated_attention.core.errors import UserError
from gated_attention.data import array_record_source as shards
from gated_attention.data.tfds_source import ENCODE_BLOCK

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (importing the module defines none)."""
    config_flags.DEFINE_config_file("config", None, "Run config whose data section to prepare, "
                                    "e.g. configs/ablation.py:arch=tiny,variant=baseline",
                                    lock_config=True)
    flags.DEFINE_string("out", None, "New (or empty) folder for the shards and manifest.")
    flags.DEFINE_integer("num_shards", 8, "Shards of the training split (>= the hosts that read).")
    flags.DEFINE_integer("num_eval_shards", 1, "Shards of the held-out split.")
    flags.DEFINE_string("seqio_module", "", "Module(s) to import first (comma-separated), e.g. "
                        "one that registers seqio tasks.")
    flags.DEFINE_integer("max_documents", 0, "Stop each split after this many documents (0: all).")
    flags.mark_flags_as_required(["config", "out"])


class PrepareError(UserError):
    """A flag or config field cannot be prepared as asked."""


def _local_splits(config: Any, tokenizer_kind: str) -> tuple[Any, dict[str, Iterator[str]],
                                                             dict[str, Any]]:
    from gated_attention.data import corpus, tokenizer

    data = config.data
    documents = corpus.load_documents(data.source, paths=data.paths, text_key=data.text_key,
                                      cache_dir=data.cache_dir)
    train, held_out = corpus.split_documents(documents, data.eval_fraction)
    tok = tokenizer.get_tokenizer(
        tokenizer_kind, config.model.vocab_size, train, cache_dir=data.cache_dir,
        model_type=data.sp_model_type, input_sentence_size=data.sp_input_sentence_size,
        model_path=data.tokenizer_path)
    texts = {shards.TRAIN: (d.text for d in train), shards.HELD_OUT: (d.text for d in held_out)}
    source = {"kind": data.source, "sha256": corpus.fingerprint(documents),
              "eval_fraction": data.eval_fraction}
    return tok, texts, source


def _tfds_splits(config: Any) -> tuple[Any, dict[str, Iterator[str]], dict[str, Any]]:
    from gated_attention.data import tfds_source
    from gated_attention.data.inputs import stream_tokenizer

    data = config.data
    tfds_source.check_dataset(data)
    builder = tfds_source.open_builder(data)
    tok = stream_tokenizer(config)

    def texts(split: str) -> Iterator[str]:
        for block in tfds_source.texts(builder, split, data.text_key, shuffle=False, seed=0,
                                       repeat=False):
            yield from block

    train, held_out = data.tfds.train_split, data.tfds.eval_split
    source = {"kind": "tfds", "name": data.tfds.name, "version": str(builder.info.version),
              "splits": [train, held_out],
              "documents": {s: int(builder.info.splits[s].num_examples)
                            for s in (train, held_out)}}
    return tok, {shards.TRAIN: texts(train), shards.HELD_OUT: texts(held_out)}, source


def _encode(tokenizer: Any, texts: Iterator[str], add_eos: bool) -> Iterator[np.ndarray]:
    from gated_attention.data.tfds_source import token_documents

    def blocks() -> Iterator[list[str]]:
        block: list[str] = []
        for text in texts:
            block.append(text)
            if len(block) == ENCODE_BLOCK:
                yield block
                block = []
        if block:
            yield block

    return token_documents(tokenizer, blocks(), add_eos)


def token_splits(config: Any) -> tuple[Any, dict[str, Iterator[np.ndarray]], dict[str, Any]]:
    """(tokenizer, {train, held_out: token arrays of documents}, source description)."""
    data = config.data
    if data.source == "seqio":
        from gated_attention.data import seqio_source

        task, tok = seqio_source.task_and_tokenizer(config, None)
        docs = {name: seqio_source.document_stream(task, split, shuffle=False, seed=0,
                                                   repeat=False)
                for name, split in ((shards.TRAIN, "train"),
                                    (shards.HELD_OUT, data.seqio.eval_split))}
        return tok, docs, {"kind": "seqio", "task": task,
                           "splits": ["train", data.seqio.eval_split]}
    if data.source == "tfds":
        tok, texts, source = _tfds_splits(config)
    elif data.source == "array_record":
        raise PrepareError("data.source='array_record' is already prepared; choose the source "
                           "to tokenize (cpython_docs, python_source, files, tfds, seqio)")
    else:
        tok, texts, source = _local_splits(config, data.tokenizer)
    return tok, {k: _encode(tok, v, data.add_eos) for k, v in texts.items()}, source


def write_split(folder: Any, split: str, documents: Iterator[np.ndarray], num_shards: int,
                max_documents: int = 0) -> dict[str, Any]:
    """Round-robin the documents over num_shards new shards; returns the split's manifest."""
    from array_record.python.array_record_module import ArrayRecordWriter

    names = [shards.shard_name(split, i, num_shards) for i in range(num_shards)]
    writers = [ArrayRecordWriter(os.fspath(folder / n), "group_size:1") for n in names]
    per_shard = [0] * num_shards
    tokens = 0
    try:
        for i, ids in enumerate(documents):
            if max_documents and i == max_documents:
                break
            writers[i % num_shards].write(np.asarray(ids, "<i4").tobytes())
            per_shard[i % num_shards] += 1
            tokens += len(ids)
    finally:
        for writer in writers:
            writer.close()
    return {"shards": names, "documents": sum(per_shard), "tokens": tokens,
            "shard_documents": per_shard}


def tokenizer_file(tokenizer: Any) -> Any:
    return getattr(tokenizer, "model_file", None)


def prepare(config: Any, out: str, *, num_shards: int, num_eval_shards: int = 1,
            max_documents: int = 0) -> dict[str, Any]:
    """Write the shards and manifest of `config`'s data into the new folder `out`."""
    from gated_attention.data.pipeline import tokenizer_id

    if num_shards < 1 or num_eval_shards < 1:
        raise PrepareError(f"--num_shards={num_shards} and --num_eval_shards={num_eval_shards} "
                           "must be >= 1")
    if not paths.is_local(out):
        raise PrepareError(f"--out={out!r} must be a local folder (ArrayRecord writes local "
                           "files); for a bucket, write to its gcsfuse mount")
    folder = paths.resolve(out)
    if folder.exists() and any(folder.iterdir()):
        raise PrepareError(f"--out={out!r} is not empty; nothing is overwritten: choose a new "
                           "folder")
    tok, splits, source = token_splits(config)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    written = {
        shards.TRAIN: write_split(folder, shards.TRAIN, splits[shards.TRAIN], num_shards,
                                  max_documents),
        shards.HELD_OUT: write_split(folder, shards.HELD_OUT, splits[shards.HELD_OUT],
                                     num_eval_shards, max_documents)}
    model_file = tokenizer_file(tok)
    copied = ""
    if model_file is not None:
        copied = paths.resolve(model_file).name
        paths.write_atomic(folder / copied, paths.resolve(model_file).read_bytes())
    manifest = {
        "format": shards.FORMAT, "dtype": "int32", "add_eos": bool(config.data.add_eos),
        "tokenizer": {"kind": config.data.tokenizer, "id": tokenizer_id(tok),
                      "vocab_size": int(tok.vocab_size), "bos_id": int(tok.bos_id),
                      "eos_id": int(tok.eos_id), "pad_id": int(tok.pad_id), "file": copied},
        "source": {**source, "sha256": source.get("sha256") or hashlib.sha256(
            json.dumps(source, sort_keys=True).encode()).hexdigest()},
        "splits": written,
        "seconds": round(time.perf_counter() - start, 2),
    }
    paths.write_atomic(folder / shards.MANIFEST, json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        manifest = prepare(FLAGS.config, FLAGS.out, num_shards=FLAGS.num_shards,
                           num_eval_shards=FLAGS.num_eval_shards,
                           max_documents=FLAGS.max_documents)
    except (UserError, FileNotFoundError) as err:
        errors.fail(err)
    for split, info in manifest["splits"].items():
        print(f"{split}: {info['documents']:,} documents, {info['tokens']:,} tokens in "
              f"{len(info['shards'])} shard(s)")
    print(f"Wrote {FLAGS.out}/{shards.MANIFEST} (tokenizer {manifest['tokenizer']['id']}) in "
          f"{manifest['seconds']:.1f} s")


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing with errors as one line; --seqio_module is imported before the config is
    resolved, so the tasks it registers exist when the config names them."""
    from gated_attention.data.inputs import import_modules

    try:
        import_modules(_early_flag(argv, "seqio_module"))
        return FLAGS(argv)
    except flags.Error as err:
        if (user := errors.user_error_in(err)) is not None:  # the config file refused
            errors.fail(user, "Config error")
        if "Traceback (most recent call last)" in str(err):  # the config file's code failed
            raise
        errors.exit_with(f"Flag error: {str(err).splitlines()[0]}")
    except ImportError as err:  # --seqio_module names a module that is not there
        errors.exit_with(f"--seqio_module: {err}")


def _early_flag(argv: list[str], name: str) -> str:
    for i, arg in enumerate(argv):
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
        if arg == f"--{name}" and i + 1 < len(argv):
            return argv[i + 1]
    return ""


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    define_flags()
    app.run(main, flags_parser=parse_flags)
