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
- "bigram_backcopy": the synthetic Bigram-Backcopy task (bigram_backcopy.py), generated on
  the fly; a first-token attention sink forms on it in CPU-minutes.
- "passkey": rows packed with marked pass keys (passkey.py), generated on the fly; a tiny
  model learns retrieval on it in a few hundred CPU steps.

data.packing: "segments" (documents cut into chunks, packed with segment ids) or "concat"
(documents joined with EOS into rows, no segment ids; attention may then use cuDNN).
Before compiling, `check_epochs` refuses a run that would pass over its training split more
than data.max_epochs times.
"""

from __future__ import annotations

import os
from typing import Any

from gated_attention.data.inputs import Inputs, import_modules, stream_tokenizer
from gated_attention.data.packing import BATCH_KEYS, Batch

__all__ = ["BATCH_KEYS", "LOCAL_SOURCES", "Batch", "Inputs", "build_inputs", "check_epochs",
           "import_modules", "stream_tokenizer"]

LOCAL_SOURCES = ("cpython_docs", "python_source", "files")


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
    if data.source == "bigram_backcopy":
        from gated_attention.data import bigram_backcopy

        return bigram_backcopy.build_inputs(config, workdir, **hosts)
    if data.source == "passkey":
        from gated_attention.data import passkey

        return passkey.build_inputs(config, workdir, **hosts)
    from gated_attention.data import pipeline

    local = pipeline.load_local_data(data, config.model.vocab_size, workdir)
    iterator = iter(pipeline.train_dataset(local, data, train.batch_size, seed=seed,
                                           process_index=process_index,
                                           process_count=process_count))
    evals = (pipeline.eval_batches(local, data, train.batch_size, train.eval_batches,
                                   process_index=process_index, process_count=process_count)
             if train.eval_batches else [])
    return Inputs(iterator, evals, local.tokenizer, local.summary, local)


def check_epochs(config: Any, inputs: Inputs) -> None:
    """Refuse (ConfigError) a run that would repeat its training split more than
    data.max_epochs times; called before compiling. See epochs.py."""
    from gated_attention.config_lib import check_epochs as check

    check(config, inputs.summary)
