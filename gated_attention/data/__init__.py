"""Input pipelines. Every source yields the same batches: dicts of int32 [batch, seq_len]
arrays `inputs`, `targets`, `segment_ids`, `positions`, `mask` (see packing.py).

Sources (config.data.source), one module each, listed in registry.py (docs/data.md says how
to add one):
- "cpython_docs", "python_source", "files" (local_source.py): text on this machine (English
  shipped with CPython, Python source, or .txt / .jsonl files named by config.data.paths).
- "seqio" (seqio_source.py): a registered seqio Task (e.g. C4 through tfds, or a user's own
  task registered by a module named with --seqio_module); needs the `seqio` extra.
- "tfds" (tfds_source.py): a prepared tensorflow-datasets dataset (data.tfds.name),
  tokenised on the fly.
- "array_record" (array_record_source.py): shards written once by `python -m
  gated_attention.data.prepare` (data.paths = their folder), read with grain: the pod path.
- "bigram_backcopy" (bigram_backcopy.py): the synthetic Bigram-Backcopy task, generated on
  the fly; a first-token attention sink forms on it in CPU-minutes.
- "passkey" (passkey.py): rows packed with marked pass keys, generated on the fly; a tiny
  model learns retrieval on it in a few hundred CPU steps.
- "synthetic" (synthetic.py): uniform random ids of the model's vocabulary in the config's
  shapes, nothing read: the pre-flight, benchmarks and throughput checks before any data.

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
    """The run's Inputs from the module of config.data.source (registry.py)."""
    from gated_attention.data import registry

    return registry.build_inputs(config, workdir, process_index=process_index,
                                 process_count=process_count)


def check_epochs(config: Any, inputs: Inputs) -> None:
    """Refuse (ConfigError) a run that would repeat its training split more than
    data.max_epochs times; called before compiling. See epochs.py."""
    from gated_attention.data import epochs

    epochs.check(config, inputs.summary)
