"""The local sources: text on this machine, read whole, split, tokenised and cached.

- "cpython_docs": English shipped with CPython (pydoc topics + stdlib docstrings); no download.
- "python_source": Python source of the stdlib and installed packages; larger, still local.
- "files": .txt / .jsonl files named by data.paths (.jsonl text in field data.text_key; both
  fields are shared with other sources, so they sit in config.data, not in a section).
A SentencePiece tokenizer is trained on the training split unless data.tokenizer_path names
one (pipeline.py); data.eval_fraction of the documents is held out.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from gated_attention.core.checks import require
from gated_attention.data.inputs import Inputs


def _parts(paths: str) -> list[str]:
    return [p for p in (part.strip() for part in paths.split(",")) if p]


def check(config: Any, cfg: Any) -> None:
    data = config.data
    if data.source == "files":
        require(bool(data.paths.strip()), "data.source='files' needs data.paths (comma-separated "
                "paths or globs of .txt / .jsonl files)")


def check_files(config: Any) -> None:
    """Every local part of data.paths matches a file (bucket paths are listed when read)."""
    from gated_attention.core.paths import is_local

    data = config.data
    if data.source != "files":
        return
    for part in _parts(data.paths):
        require(not is_local(part) or bool(glob.glob(os.path.expanduser(part))),
                f"data.paths: {part!r} matches no file (comma-separated paths or globs of "
                ".txt / .jsonl files)")


def build_inputs(config: Any, workdir: str | os.PathLike[str] | None = None, *,
                 process_index: int = 0, process_count: int = 1) -> Inputs:
    from gated_attention.data import pipeline

    check_files(config)
    data, train = config.data, config.train
    hosts = dict(process_index=process_index, process_count=process_count)
    local = pipeline.load_local_data(data, config.model.vocab_size, workdir)
    iterator = iter(pipeline.train_dataset(local, data, train.batch_size,
                                           seed=data.shuffle_seed, **hosts))
    evals = (pipeline.eval_batches(local, data, train.batch_size, train.eval_batches, **hosts)
             if train.eval_batches else [])
    return Inputs(iterator, evals, local.tokenizer, local.summary, local)
