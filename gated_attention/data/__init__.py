"""Input pipelines. Every source yields the same batches: dicts of int32 [batch, seq_len]
arrays `inputs`, `targets`, `segment_ids`, `positions`, `mask` (see packing.py).

Sources (config.data.source):
- "cpython_docs": English shipped with CPython (pydoc topics + stdlib docstrings); no download.
- "python_source": Python source of the stdlib and installed packages; larger, still local.
- "files": .txt / .jsonl files named by config.data.paths.
- "seqio": a registered seqio Task (e.g. C4 through tfds, or a user's own task registered by
  a module named with --seqio_module); needs the `seqio` extra, imported only when used.
- "tfds": a prepared tensorflow-datasets dataset (data.tfds_name), tokenised on the fly.
- "array_record": shards written once by `python -m gated_attention.data.prepare` (data.paths
  = their folder), read with grain: the pod-scale path.

data.packing: "segments" (documents cut into chunks, packed with segment ids) or "concat"
(documents joined with EOS into rows, no segment ids; attention may then use cuDNN).
Before compiling, `check_epochs` refuses a run that would pass over its training split more
than data.max_epochs times.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from gated_attention.data.packing import BATCH_KEYS, Batch

__all__ = ["BATCH_KEYS", "LOCAL_SOURCES", "Batch", "Inputs", "build_inputs", "check_epochs",
           "import_modules", "stream_tokenizer"]

LOCAL_SOURCES = ("cpython_docs", "python_source", "files")


@dataclasses.dataclass
class Inputs:
    train: Any                 # a grain DatasetIterator (get_state / set_state) of batches
    eval_batches: list[Batch]  # fixed held-out batches (this host's share)
    tokenizer: Any
    summary: dict[str, Any]
    local: Any = None          # pipeline.LocalData for local sources (analysis batches)


def build_inputs(config: Any, workdir: str | os.PathLike[str] | None = None, *,
                 process_index: int = 0, process_count: int = 1) -> Inputs:
    data, train = config.data, config.train
    seed = data.shuffle_seed
    hosts = dict(process_index=process_index, process_count=process_count)
    if data.source == "seqio":
        from gated_attention.data import seqio_source

        return seqio_source.build_inputs(config, workdir, **hosts)
    if data.source == "tfds":
        from gated_attention.data import tfds_source

        return tfds_source.build_inputs(config, workdir, **hosts)
    if data.source == "array_record":
        from gated_attention.data import array_record_source

        return array_record_source.build_inputs(config, workdir, **hosts)
    from gated_attention.data import pipeline

    local = pipeline.load_local_data(data, config.model.vocab_size, workdir)
    iterator = iter(pipeline.train_dataset(local, data, train.batch_size, seed=seed,
                                           process_index=process_index,
                                           process_count=process_count))
    evals = (pipeline.eval_batches(local, data, train.batch_size, train.eval_batches,
                                   process_index=process_index, process_count=process_count)
             if train.eval_batches else [])
    return Inputs(iterator, evals, local.tokenizer, local.summary, local)


def stream_tokenizer(config: Any, workdir: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer of a streamed source: data.tokenizer_path (sentencepiece, hf) or bytes;
    nothing is trained, since a stream has no training split to learn from."""
    from gated_attention.data.tokenizer import get_tokenizer

    return get_tokenizer(config.data.tokenizer, config.model.vocab_size, workdir=workdir,
                         model_path=config.data.tokenizer_path)


def check_epochs(config: Any, inputs: Inputs) -> None:
    """Refuse (ConfigError) a run that would repeat its training split more than
    data.max_epochs times; called before compiling. See epochs.py."""
    from gated_attention.data import epochs

    epochs.check(config, inputs.summary)


def import_modules(names: str) -> None:
    """Import comma-separated modules (--seqio_module: a user's module registering seqio
    tasks), with a one-line error naming the flag if one is missing."""
    import importlib

    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ImportError(f"--seqio_module={name!r} cannot be imported: {err}") from None
