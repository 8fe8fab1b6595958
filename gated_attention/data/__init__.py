"""Input pipelines. Every source yields the same batches: dicts of int32 [batch, seq_len]
arrays `inputs`, `targets`, `segment_ids`, `positions`, `mask` (see packing.py).

Sources (config.data.source):
- "cpython_docs": English shipped with CPython (pydoc topics + stdlib docstrings); no download.
- "python_source": Python source of the stdlib and installed packages; larger, still local.
- "files": .txt / .jsonl files named by config.data.paths.
- "seqio": a registered seqio Task (e.g. C4 through tfds) for pod-scale runs; needs the
  `seqio` extra and is imported only when used.
- "bigram_backcopy": the synthetic Bigram-Backcopy task (bigram_backcopy.py), generated on
  the fly; a first-token attention sink forms on it in CPU-minutes.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from gated_attention.data.packing import BATCH_KEYS, Batch

__all__ = ["BATCH_KEYS", "Batch", "Inputs", "build_inputs"]


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
    if data.source == "seqio":
        from gated_attention.data import seqio_source

        return seqio_source.build_inputs(config, workdir, process_index=process_index,
                                         process_count=process_count)
    if data.source == "bigram_backcopy":
        from gated_attention.data import bigram_backcopy

        return Inputs(*bigram_backcopy.build_inputs(config, workdir, process_index=process_index,
                                                    process_count=process_count))
    from gated_attention.data import pipeline

    local = pipeline.load_local_data(data, config.model.vocab_size, workdir)
    iterator = iter(pipeline.train_dataset(local, data, train.batch_size, seed=seed,
                                           process_index=process_index,
                                           process_count=process_count))
    evals = (pipeline.eval_batches(local, data, train.batch_size, train.eval_batches,
                                   process_index=process_index, process_count=process_count)
             if train.eval_batches else [])
    return Inputs(iterator, evals, local.tokenizer, local.summary, local)
