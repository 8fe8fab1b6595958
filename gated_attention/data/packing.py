"""Documents of token ids -> chunks -> packed rows -> training batches.

A row holds seq_len + 1 tokens: `inputs = row[:-1]`, `targets = row[1:]`. Documents are cut
into chunks that fit a row, so every next-token prediction inside a document is made exactly
once and none crosses a document boundary:
- with BOS: chunk i = [bos] + tokens[i*S : (i+1)*S]; every token of the document is a target;
- without: chunk i = tokens[i*S : i*S + S + 1] (chunks overlap by one token, which is the
  target of one chunk and the first input of the next); the first token is never a target.
Chunks are packed into rows first-fit (grain.experimental.FirstFitPackIterDataset), which
yields segment ids (1, 2, ... per row; 0 = padding) and positions (restarting at 0 per chunk).
`mask` is 0 where a target belongs to another segment than its input, or is padding.
"""

from __future__ import annotations

from typing import Any

import grain
import numpy as np

Batch = dict[str, np.ndarray]
BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "mask")


def chunk_bounds(length: int, seq_len: int, add_bos: bool) -> list[tuple[int, int]]:
    """[start, end) token ranges of a document's chunks (without the BOS a chunk may get)."""
    if add_bos:
        return [(s, min(s + seq_len, length)) for s in range(0, length, seq_len)]
    return [(s, min(s + seq_len + 1, length)) for s in range(0, max(length - 1, 0), seq_len)]


def chunk_document(tokens: np.ndarray, seq_len: int, add_bos: bool, bos_id: int
                   ) -> list[np.ndarray]:
    chunks = []
    for start, end in chunk_bounds(len(tokens), seq_len, add_bos):
        piece = np.asarray(tokens[start:end], np.int32)
        chunks.append(np.concatenate([[bos_id], piece]).astype(np.int32) if add_bos else piece)
    return chunks


def to_model_batch(packed: dict[str, np.ndarray]) -> Batch:
    """Packed rows {tokens, tokens_segment_ids, tokens_positions} [b, S+1] -> the batch format."""
    tokens = np.asarray(packed["tokens"], np.int32)
    segments = np.asarray(packed["tokens_segment_ids"], np.int32)
    positions = np.asarray(packed["tokens_positions"], np.int32)
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] > 0)
    return {
        "inputs": tokens[:, :-1],
        "targets": tokens[:, 1:],
        "segment_ids": segments[:, :-1],
        "positions": positions[:, :-1],
        "mask": same.astype(np.int32),
    }


def pack_rows(chunks: grain.IterDataset, seq_len: int, batch_size: int, *, seed: int,
              shuffle_bins: bool, drop_remainder: bool = True) -> grain.IterDataset:
    """Chunks -> batches of packed rows {tokens, tokens_segment_ids, tokens_positions}.

    A finite stream's last, partial batch is dropped unless drop_remainder=False.
    """
    import grain.experimental as ge

    rows = ge.FirstFitPackIterDataset(
        chunks.map(lambda c: {"tokens": c}), length_struct={"tokens": seq_len + 1},
        num_packing_bins=batch_size, seed=seed, shuffle_bins=shuffle_bins)
    return rows.batch(batch_size, drop_remainder=drop_remainder)


def pack_and_batch(chunks: grain.IterDataset, seq_len: int, batch_size: int, *, seed: int,
                   shuffle_bins: bool) -> grain.IterDataset:
    """Chunks (1-D int32 arrays of <= seq_len + 1 tokens) -> batches of the model format."""
    return pack_rows(chunks, seq_len, batch_size, seed=seed,
                     shuffle_bins=shuffle_bins).map(to_model_batch)


def single_segment_batch(rows: np.ndarray) -> Batch:
    """Rows of seq_len + 1 tokens, each one whole segment starting at position 0."""
    rows = np.asarray(rows, np.int32)
    b, s = rows.shape[0], rows.shape[1] - 1
    return {"inputs": rows[:, :-1], "targets": rows[:, 1:],
            "segment_ids": np.ones((b, s), np.int32),
            "positions": np.broadcast_to(np.arange(s, dtype=np.int32), (b, s)).copy(),
            "mask": np.ones((b, s), np.int32)}


def describe(batch: dict[str, Any]) -> str:
    return ", ".join(f"{k}{tuple(np.shape(v))}" for k, v in batch.items())
