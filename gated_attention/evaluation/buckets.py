"""Length buckets and fixed-size batches: every request is padded to one of a few lengths and
every batch to the same row count, so the scoring and decoding functions compile once per
bucket instead of once per request length. Four buckets per octave: powers of two alone
padded a 280-token row to 512 and halved the scoring speed."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")
SMALLEST_BUCKET = 16


STEPS_PER_OCTAVE = (4, 5, 6, 7)  # 2^k x {1, 1.25, 1.5, 1.75}: at most 25% padding


def bucket_length(length: int, cap: int) -> int:
    """The smallest ladder length >= length (16, 20, 24, 28, 32, 40, ..., 256, 320, 384,
    448, 512, ...; four per octave, so padding costs at most a quarter), at most `cap`."""
    if length > cap:
        raise ValueError(f"a row of {length} tokens does not fit the cap of {cap}")
    octave = SMALLEST_BUCKET // 4
    while True:
        for step in STEPS_PER_OCTAVE:
            if step * octave >= length:
                return min(step * octave, cap)
        octave *= 2


def span_length(length: int, cap: int) -> int:
    """The scored span's length: a power of two up to 16 (one-token answers stay one
    position), then `bucket_length`'s ladder; at most `cap`."""
    if length <= SMALLEST_BUCKET:
        return min(1 << max(length - 1, 0).bit_length(), cap)
    return bucket_length(length, cap)


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def longest_first(items: Sequence[T], length: Sequence[int]) -> list[int]:
    """Indices of `items`, longest first (ties in their given order): neighbours share a bucket."""
    return sorted(range(len(items)), key=lambda i: -length[i])


def chunks(order: Sequence[int], size: int) -> Iterator[list[int]]:
    for start in range(0, len(order), size):
        yield list(order[start:start + size])


def right_padded(rows: Sequence[Sequence[int]], length: int, batch: int,
                 pad_id: int = 0) -> np.ndarray:
    """[batch, length] int32: the rows left-aligned, padded on the right and below."""
    out = np.full((batch, length), pad_id, np.int32)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def right_aligned(rows: Sequence[Sequence[int]], length: int, batch: int,
                  pad_id: int = 0) -> np.ndarray:
    """[batch, length] int32: each row's last `length` entries, right-aligned."""
    out = np.full((batch, length), pad_id, np.int32)
    for i, row in enumerate(rows):
        tail = list(row)[-length:]
        out[i, length - len(tail):] = tail
    return out


def left_padded(rows: Sequence[Sequence[int]], length: int, batch: int,
                pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """([batch, length] tokens, positions): rows right-aligned, pads (and the filler rows below,
    one token each) at negative positions, which the KV cache never lets anyone see."""
    tokens = np.full((batch, length), pad_id, np.int32)
    positions = np.tile(np.arange(length, dtype=np.int32) - (length - 1), (batch, 1))
    for i, row in enumerate(rows):
        pad = length - len(row)
        tokens[i, pad:] = row
        positions[i] = np.arange(length, dtype=np.int32) - pad
    return tokens, positions
