"""Training rows of marked pass keys: a synthetic task on which a small model learns retrieval
(a previous-token head and an induction head) in a few hundred CPU steps.

Each row of seq_len + 1 tokens is packed with `retrieval_tasks.marked_passkey` examples of
random lengths (from `min_tokens` to the row's free space), each its own segment with
positions from 0, as packing.py packs documents. Short examples make the copy easy to find;
long ones teach it at distance, up to the whole row. The loss mask covers the answer keys
only (`answer_only`, the default): the filler is the same in every example and the key in
the needle is random, so neither carries anything a model should learn; without the mask the
filler's loss dominates the first steps and the copy forms later. A general-text run does not
learn passkey retrieval at tiny scale (docs/long_context.md), which this task isolates.

Everything is drawn from (seed, index): batch i is the same whatever came before.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from gated_attention.analysis import retrieval_tasks
from gated_attention.data.packing import Batch


def packed_batch(tokenizer: Any, seq_len: int, batch_size: int, index: int, *, seed: int = 0,
                 digits: int = 10, min_tokens: int = 24, answer_only: bool = True,
                 add_bos: bool = False) -> Batch:
    """Batch `index` of rows packed with marked pass keys, in the training batch format."""
    count_tokens = retrieval_tasks.token_counter(tokenizer, add_bos)
    key = "9" * digits  # the example without filler: "#<key>. #" then the key
    smallest = count_tokens(retrieval_tasks.Example("marked_passkey", f"#{key}. #", key, (key,)))
    if not smallest <= min_tokens <= seq_len + 1:
        raise ValueError(f"min_tokens={min_tokens} must be in [{smallest}, seq_len + 1 = "
                         f"{seq_len + 1}] ({digits}-digit keys take {smallest} tokens)")
    width = seq_len + 1
    tokens, segments, positions, answers = (np.zeros((batch_size, width), np.int32)
                                            for _ in range(4))
    rng = np.random.default_rng([seed, index])
    for row in range(batch_size):
        at, segment = 0, 1
        while width - at >= min_tokens:
            budget = int(rng.integers(min_tokens, width - at + 1))
            example = retrieval_tasks.marked_passkey(rng, budget, count_tokens, digits)
            ids, n_answer = retrieval_tasks.encode_example_text(
                tokenizer, example.prompt, example.answer_text, add_bos)
            end = at + len(ids)
            tokens[row, at:end], segments[row, at:end] = ids, segment
            positions[row, at:end] = np.arange(len(ids))
            answers[row, end - n_answer:end] = 1  # the answer tokens, as targets
            at, segment = end, segment + 1
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, :-1] > 0)
    mask = answers[:, 1:] if answer_only else same.astype(np.int32)
    return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:], "segment_ids": segments[:, :-1],
            "positions": positions[:, :-1], "mask": (mask & same).astype(np.int32)}
