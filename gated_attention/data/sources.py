"""Checks of the streamed sources (tfds, array_record, seqio) made during config validation:
before anything is compiled or written, each names the field that is wrong."""

from __future__ import annotations

from typing import Any


def check(config: Any) -> None:
    """Raise ValueError (one line, naming the field) if the source cannot be read as set."""
    data = config.data
    if data.tokenizer == "sentencepiece" and not data.tokenizer_path and data.source == "tfds":
        raise ValueError("data.source='tfds' streams its text: data.tokenizer='sentencepiece' "
                         "needs data.tokenizer_path (a .model file), since nothing is trained "
                         "on a stream; or use data.tokenizer='hf' or 'byte'")
    if data.source == "tfds":
        from gated_attention.data import tfds_source

        tfds_source.check(data)
    elif data.source == "array_record":
        from gated_attention.data import array_record_source

        array_record_source.check(config)
    elif data.source == "seqio" and data.seqio_task:
        from gated_attention.data import seqio_source

        seqio_source.task_and_tokenizer(config, None)
