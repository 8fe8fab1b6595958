"""data.source=array_record: documents tokenised once by `python -m gated_attention.data.prepare`
into ArrayRecord shards (grain's native format), read with grain.

A shard folder (data.paths, a field shared with the `files` source: this source has no
section of its own) holds `manifest.json`, the tokenizer file it was made with, and
`<split>-NNNNN-of-MMMMM.array_record` shards whose records are the documents' int32 token ids
(little-endian; EOS already appended when the manifest says add_eos). Training reads the
training split's records in an order shuffled with data.shuffle_seed and reshuffled every
epoch; each host reads only every process_count-th record of it (its share), then chunks and
packs them with the same code as every other source (streams.batches). The grain iterator
state (a few integers) is saved in each checkpoint, so a resumed run continues bit for bit.

A run refuses shards whose tokenizer fingerprint differs from its own tokenizer's. The folder
may be local or a bucket mounted with gcsfuse (ArrayRecord reads local paths).
"""

from __future__ import annotations

import json
import os
from typing import Any

import grain
import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError
from gated_attention.data import streams

TOKENIZER_IN_DATA = True  # the folder holds the tokenizer it was made with
MANIFEST = "manifest.json"
FORMAT = "gated_attention.token_shards/v1"
TRAIN, HELD_OUT = "train", "held_out"
# Records are read from files (possibly through gcsfuse): a few threads hide the latency.
READ_OPTIONS = grain.ReadOptions(num_threads=4, prefetch_buffer_size=256)


class ShardError(ConfigError):
    """The shard folder is missing, incomplete, or made with another tokenizer."""


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.array_record"


def read_manifest(folder: str) -> dict[str, Any]:
    """The manifest of a complete shard folder (ShardError naming data.paths otherwise)."""
    hint = "write one with `python -m gated_attention.data.prepare --out=DIR`"
    if not folder:
        raise ShardError(f"data.source='array_record' needs data.paths (a shard folder; {hint})")
    root = paths.resolve(folder)
    if not root.is_dir():
        raise ShardError(f"data.paths={folder!r} is not a folder ({hint})")
    manifest_file = root / MANIFEST
    if not manifest_file.exists():
        what = "is empty" if not any(root.iterdir()) else f"holds no {MANIFEST} (an unfinished " \
            "prepare?)"
        raise ShardError(f"data.paths={folder!r} {what}; {hint}")
    manifest = json.loads(manifest_file.read_text())
    if manifest.get("format") != FORMAT:
        raise ShardError(f"data.paths={folder!r}: {MANIFEST} is not of format {FORMAT}")
    for split, info in manifest["splits"].items():
        missing = [name for name in info["shards"] if not (root / name).exists()]
        if missing:
            raise ShardError(f"data.paths={folder!r} lacks {len(missing)} {split} shard(s) its "
                             f"manifest lists, e.g. {missing[0]}")
        if not info["tokens"]:
            raise ShardError(f"data.paths={folder!r}: the {split} split holds no tokens")
    return manifest


def shards_tokenizer_path(folder: str, manifest: dict[str, Any]) -> str:
    return os.fspath(paths.resolve(folder) / manifest["tokenizer"]["file"]) \
        if manifest["tokenizer"].get("file") else ""


def run_tokenizer(config: Any, manifest: dict[str, Any], workdir: Any = None) -> Any:
    """data.tokenizer_path if given, else the tokenizer the shards were written with."""
    from gated_attention.data.tokenizer import get_tokenizer

    data = config.data
    model_path = data.tokenizer_path or shards_tokenizer_path(data.paths, manifest)
    return get_tokenizer(data.tokenizer, config.model.vocab_size, workdir=workdir,
                         model_path=model_path)


def check_matches(config: Any, manifest: dict[str, Any], tokenizer: Any) -> None:
    """The shards were made with this run's tokenizer and EOS setting."""
    from gated_attention.data.pipeline import tokenizer_id

    data, made = config.data, manifest["tokenizer"]
    ours = tokenizer_id(tokenizer)
    if made["id"] != ours or made["kind"] != data.tokenizer:
        raise ShardError(
            f"data.paths={data.paths!r} was prepared with another tokenizer ({made['kind']}, "
            f"fingerprint {made['id']}, {made['vocab_size']} ids) than this run's "
            f"data.tokenizer={data.tokenizer!r} data.tokenizer_path={data.tokenizer_path!r} "
            f"(fingerprint {ours}); prepare the shards again with this tokenizer, or leave "
            "data.tokenizer_path empty to use the shards' own")
    if bool(manifest["add_eos"]) != bool(data.add_eos):
        raise ShardError(f"data.paths={data.paths!r} was prepared with add_eos="
                         f"{manifest['add_eos']}, but data.add_eos={data.add_eos}")


def check_files(config: Any) -> dict[str, Any]:
    """Before compiling (registry.check_files): a complete folder made with this tokenizer."""
    manifest = read_manifest(config.data.paths)
    check_matches(config, manifest, run_tokenizer(config, manifest))
    return manifest


def documents(folder: str, manifest: dict[str, Any], split: str) -> grain.MapDataset:
    """Random access to a split's documents (int32 token arrays), across all its shards."""
    root = paths.resolve(folder)
    source = grain.sources.ArrayRecordDataSource(
        [os.fspath(root / name) for name in manifest["splits"][split]["shards"]])
    return grain.MapDataset.source(source).map(lambda record: np.frombuffer(record, "<i4"))


def train_documents(folder: str, manifest: dict[str, Any], *, seed: int, process_index: int = 0,
                    process_count: int = 1) -> grain.IterDataset:
    """This host's share of the shuffled, endlessly repeated training documents."""
    docs = documents(folder, manifest, TRAIN).shuffle(seed=seed).repeat()
    return docs[process_index::process_count].to_iter_dataset(READ_OPTIONS)


def held_out_documents(folder: str, manifest: dict[str, Any], *, process_index: int = 0,
                       process_count: int = 1) -> grain.IterDataset:
    docs = documents(folder, manifest, HELD_OUT)
    return docs[process_index::process_count].to_iter_dataset(READ_OPTIONS)


def build_inputs(config: Any, workdir: Any, *, process_index: int, process_count: int):
    from gated_attention.data.inputs import Inputs, tokenizer_summary
    from gated_attention.parallel.distributed import per_host_batch

    data, train = config.data, config.train
    manifest = read_manifest(data.paths)
    tokenizer = run_tokenizer(config, manifest, workdir)
    check_matches(config, manifest, tokenizer)
    local_batch = per_host_batch(train.batch_size, process_count)
    host = dict(process_index=process_index, process_count=process_count)
    train_iter = iter(streams.batches(
        train_documents(data.paths, manifest, seed=data.shuffle_seed, **host), data,
        local_batch, tokenizer.bos_id, seed=data.shuffle_seed, shuffle_bins=True))
    evals = streams.first_batches(streams.batches(
        held_out_documents(data.paths, manifest, **host), data, local_batch, tokenizer.bos_id,
        seed=0, shuffle_bins=False, for_eval=True), train.eval_batches)
    if train.eval_batches and not evals:
        raise ShardError(f"data.paths={data.paths!r}: the held-out split is too small for one "
                         f"batch of {train.batch_size} x {data.seq_len}")
    splits = manifest["splits"]
    summary = {"source": "array_record", "paths": data.paths, "manifest_source":
               manifest["source"],
               "train": {k: splits[TRAIN][k] for k in ("documents", "tokens")},
               "held_out": {k: splits[HELD_OUT][k] for k in ("documents", "tokens")},
               "tokenizer": tokenizer_summary(data, tokenizer)}
    if workdir is not None:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(summary, indent=2) + "\n")
    return Inputs(train_iter, evals, tokenizer, summary)
