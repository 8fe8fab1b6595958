"""What every source hands the training loop (`Inputs`), and the helpers the streamed sources
share. A submodule of its own, so the sources import it without importing the package face
(which imports them)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from gated_attention.data.packing import Batch


@dataclasses.dataclass
class Inputs:
    train: Any                 # a grain DatasetIterator (get_state / set_state) of batches
    eval_batches: list[Batch]  # fixed held-out batches (this host's share)
    tokenizer: Any
    summary: dict[str, Any]
    local: Any = None          # pipeline.LocalData for local sources (analysis batches)


def stream_tokenizer(config: Any, workdir: str | os.PathLike[str] | None = None) -> Any:
    """The tokenizer of a streamed source: data.tokenizer_path (sentencepiece, hf) or bytes;
    nothing is trained, since a stream has no training split to learn from."""
    from gated_attention.data.tokenizer import get_tokenizer

    return get_tokenizer(config.data.tokenizer, config.model.vocab_size, workdir=workdir,
                         model_path=config.data.tokenizer_path)


def tokenizer_summary(data_config: Any, tokenizer: Any) -> dict[str, Any]:
    """The tokenizer part of a run's data_summary.json."""
    from gated_attention.data.pipeline import tokenizer_id

    return {"kind": data_config.tokenizer, "vocab_size": tokenizer.vocab_size,
            "id": tokenizer_id(tokenizer), "path": os.fspath(data_config.tokenizer_path)}


def import_modules(names: str) -> None:
    """Import comma-separated modules (--seqio_module: a user's module registering seqio
    tasks), with a one-line error naming the flag if one is missing."""
    import importlib

    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except ImportError as err:
            raise ImportError(f"--seqio_module={name!r} cannot be imported: {err}") from None
