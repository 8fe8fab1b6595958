"""Streams of documents (token-id arrays) -> the model's batches, checkpointable at any point.

The streamed sources (tfds, seqio, the ArrayRecord shards) all end here, so every source is
cut and packed by the same code:
- `DocumentStream`: a restartable reader as a grain IterDataset; its state is the number of
  documents consumed, and restoring re-opens the reader past them.
- `batches(documents, ...)`: with `data.packing='segments'` (the default) documents are cut
  into chunks (packing.chunk_document) and packed first-fit with segment ids and positions;
  with `data.packing='concat'` they are joined into one stream (each already ends in EOS)
  and cut into rows of seq_len + 1 tokens that overlap by one, with no segment ids or
  positions, so attention may use cuDNN (see `ConcatRows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grain
import grain.experimental as ge
import numpy as np

from gated_attention.data import packing

PACKINGS = ("segments", "concat")
OpenStream = Callable[[int], Iterator[np.ndarray]]  # skip -> documents after the first `skip`


class _DocumentIterator(grain.DatasetIterator):
    def __init__(self, open_stream: OpenStream):
        super().__init__()
        self._open = open_stream
        self._restart(0)

    def _restart(self, documents: int) -> None:
        self._documents = documents
        self._stream = self._open(documents)

    def __next__(self) -> np.ndarray:
        document = next(self._stream)
        self._documents += 1
        return document

    def get_state(self) -> dict[str, Any]:
        return {"documents": self._documents}

    def set_state(self, state: dict[str, Any]) -> None:
        self._restart(int(state["documents"]))


class DocumentStream(grain.IterDataset):
    """Documents of a restartable reader; resuming skips the documents already consumed."""

    def __init__(self, open_stream: OpenStream):
        super().__init__()
        self._open = open_stream

    def __iter__(self) -> _DocumentIterator:
        return _DocumentIterator(self._open)


class _ChunkDocument(grain.experimental.FlatMapTransform):
    def __init__(self, seq_len: int, add_bos: bool, bos_id: int):
        self.max_fan_out = 1 << 30  # only MapDataset flat maps use it
        self._args = (seq_len, add_bos, bos_id)

    def flat_map(self, element: np.ndarray) -> list[np.ndarray]:
        return packing.chunk_document(element, *self._args)


class _ConcatRowsIterator(grain.DatasetIterator):
    """Rows of seq_len + 1 tokens from the documents joined end to end (rows overlap by one
    token, so every next-token pair of the stream is a target exactly once). The state is the
    parent's state before the document holding the row's first token, and that token's offset
    in it: a few integers, whatever the row length."""

    def __init__(self, parent: grain.DatasetIterator, seq_len: int, add_bos: bool, bos_id: int):
        super().__init__(parent)
        self._row, self._add_bos, self._bos = seq_len + 1, add_bos, bos_id
        self._pending: list[tuple[Any, np.ndarray]] = []  # (state before it, document)
        self._offset = 0  # tokens of the first pending document already emitted

    def _read(self) -> None:
        state = self._parent.get_state()
        document = np.asarray(next(self._parent), np.int32)
        if self._add_bos:
            document = np.concatenate([np.asarray([self._bos], np.int32), document])
        self._pending.append((state, document))

    def __next__(self) -> np.ndarray:
        while sum(len(d) for _, d in self._pending) - self._offset < self._row:
            self._read()
        pieces, need, offset = [], self._row, self._offset
        for _, document in self._pending:
            take = document[offset:offset + need]
            pieces.append(take)
            need -= len(take)
            offset = 0
            if not need:
                break
        row = np.concatenate(pieces)
        # The next row starts at this row's last token.
        advance = self._row - 1
        while advance:
            left = len(self._pending[0][1]) - self._offset
            if advance >= left:
                advance -= left
                self._pending.pop(0)
                self._offset = 0
            else:
                self._offset += advance
                advance = 0
        return row

    def get_state(self) -> dict[str, Any]:
        if not self._pending:
            return {"parent": self._parent.get_state(), "offset": self._offset}
        return {"parent": self._pending[0][0], "offset": self._offset}

    def set_state(self, state: dict[str, Any]) -> None:
        self._parent.set_state(state["parent"])
        self._pending, self._offset = [], int(state["offset"])


class ConcatRows(grain.IterDataset):
    def __init__(self, parent: grain.IterDataset, seq_len: int, add_bos: bool, bos_id: int):
        super().__init__(parent)
        self._args = (seq_len, add_bos, bos_id)

    def __iter__(self) -> _ConcatRowsIterator:
        return _ConcatRowsIterator(self._parent.__iter__(), *self._args)


def concat_batch(rows: np.ndarray, *, with_segments: bool) -> packing.Batch:
    """Rows [b, S+1] of a joined stream -> inputs, targets, mask (and, for the eval step,
    one segment per row at positions 0..S-1)."""
    if with_segments:
        return packing.single_segment_batch(rows)
    rows = np.asarray(rows, np.int32)
    return {"inputs": rows[:, :-1], "targets": rows[:, 1:],
            "mask": np.ones((rows.shape[0], rows.shape[1] - 1), np.int32)}


def batches(documents: grain.IterDataset, data_config: Any, batch_size: int, bos_id: int, *,
            seed: int, shuffle_bins: bool, for_eval: bool = False) -> grain.IterDataset:
    """Documents -> batches of the model's format, by data.packing (module doc)."""
    seq_len, add_bos = data_config.seq_len, data_config.add_bos
    if data_config.get("packing", "segments") == "concat":
        rows = ConcatRows(documents, seq_len, add_bos, bos_id).batch(batch_size,
                                                                    drop_remainder=True)
        return rows.map(lambda r: concat_batch(r, with_segments=for_eval))
    chunks = ge.FlatMapIterDataset(documents, _ChunkDocument(seq_len, add_bos, bos_id))
    return packing.pack_and_batch(chunks, seq_len, batch_size, seed=seed,
                                  shuffle_bins=shuffle_bins)


def first_batches(dataset: grain.IterDataset, count: int) -> list[packing.Batch]:
    """The first `count` batches (fewer if the dataset ends first)."""
    out: list[packing.Batch] = []
    for batch in (dataset if count > 0 else ()):
        out.append(batch)
        if len(out) == count:
            break
    return out
