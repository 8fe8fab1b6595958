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

As a run's data (`data.source=passkey`, `build_inputs`): training batch i is
`packed_batch(seed=data.shuffle_seed, index=i)` of the whole global batch, of which each host
keeps its rows; the held-out batches come from a stream of their own, so their keys are new.
"""

from __future__ import annotations

import json
import os
from typing import Any

import grain
import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError, require
from gated_attention.data.inputs import Inputs, stream_tokenizer
from gated_attention.data.packing import Batch
from gated_attention.data.synthetic import retrieval_tasks
from gated_attention.parallel.distributed import host_rows

ENDLESS = 2**62  # a training stream has no end: the run's steps decide
EVAL_STREAM = 1  # held-out batches: SeedSequence([seed, EVAL_STREAM, i]), never a training key
READ_OPTIONS = grain.ReadOptions(num_threads=1, prefetch_buffer_size=2)
# Rows packed with marked pass keys ("#<key>." in filler, then " #" and the key).
SECTION = "passkey"  # config.data.passkey
FIELDS = dict(
    digits=10,         # digits of each key
    min_tokens=24,     # shortest example (at least what "#<key>. #<key>" takes)
    answer_only=True,  # the loss on the answer keys only (else on every token)
)
FLAT_ALIASES = {"passkey_digits": "digits", "passkey_min_tokens": "min_tokens",
                "passkey_answer_only": "answer_only"}


def check(config: Any, cfg: Any) -> None:
    data = config.data
    require(data.tokenizer == "byte" or bool(data.tokenizer_path), "data.source='passkey' "
            "generates its text: it needs data.tokenizer='byte' or a data.tokenizer_path "
            "(nothing to train a tokenizer on)")
    own = data.passkey
    require(1 <= own.digits <= 18, f"data.passkey.digits={own.digits} must be in 1..18")
    require(own.min_tokens >= 1, f"data.passkey.min_tokens={own.min_tokens} must be >= 1")


def packed_batch(tokenizer: Any, seq_len: int, batch_size: int, index: int, *, seed: int = 0,
                 digits: int = 10, min_tokens: int = 24, answer_only: bool = True,
                 add_bos: bool = False, stream: int | None = None) -> Batch:
    """Batch `index` of rows packed with marked pass keys, in the training batch format.

    stream: None draws from default_rng([seed, index]); an int from [seed, stream, index]
    (the held-out batches of a run use EVAL_STREAM)."""
    count_tokens = retrieval_tasks.token_counter(tokenizer, add_bos)
    key = "9" * digits  # the example without filler: "#<key>. #" then the key
    smallest = count_tokens(retrieval_tasks.Example("marked_passkey", f"#{key}. #", key, (key,)))
    if not smallest <= min_tokens <= seq_len + 1:
        raise ValueError(f"min_tokens={min_tokens} must be in [{smallest}, seq_len + 1 = "
                         f"{seq_len + 1}] ({digits}-digit keys take {smallest} tokens)")
    width = seq_len + 1
    tokens, segments, positions, answers = (np.zeros((batch_size, width), np.int32)
                                            for _ in range(4))
    rng = np.random.default_rng([seed, index] if stream is None else [seed, stream, index])
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


class PasskeySource:
    """Random access to a stream of packed pass-key batches (a grain data source): batch i
    is drawn as a whole global batch and this host keeps its rows, so the data do not depend
    on the number of hosts."""

    def __init__(self, tokenizer: Any, data: Any, global_batch: int, *, stream: int | None,
                 length: int, process_index: int = 0, process_count: int = 1):
        self.rows = host_rows(global_batch, process_index, process_count)
        self.tokenizer, self.global_batch, self.stream, self.length = (
            tokenizer, global_batch, stream, length)
        own = data.passkey
        self.options = dict(seed=int(data.shuffle_seed), digits=int(own.digits),
                            min_tokens=int(own.min_tokens), answer_only=bool(own.answer_only),
                            add_bos=bool(data.add_bos))
        self.seq_len = int(data.seq_len)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Batch:
        batch = packed_batch(self.tokenizer, self.seq_len, self.global_batch, int(index),
                             stream=self.stream, **self.options)
        return {k: v[self.rows] for k, v in batch.items()}


def build_inputs(config: Any, workdir: str | os.PathLike[str] | None = None, *,
                 process_index: int = 0, process_count: int = 1) -> Inputs:
    """The data.Inputs of a `data.source=passkey` run (tokenizer: bytes or data.tokenizer_path)."""
    data, train = config.data, config.train
    tokenizer = stream_tokenizer(config, workdir)
    hosts = dict(process_index=process_index, process_count=process_count)
    try:
        train_source = PasskeySource(tokenizer, data, train.batch_size, stream=None,
                                     length=ENDLESS, **hosts)
        train_source[0]  # the smallest example fits, before anything is compiled
    except ValueError as err:
        raise ConfigError(f"data.passkey.min_tokens: {err}") from None
    iterator = iter(grain.MapDataset.source(train_source).to_iter_dataset(READ_OPTIONS))
    held_out = PasskeySource(tokenizer, data, train.batch_size, stream=EVAL_STREAM,
                             length=int(train.eval_batches), **hosts)
    evals = [held_out[i] for i in range(len(held_out))]
    info = {"source": "passkey", "seq_len": int(data.seq_len),
            "digits": int(data.passkey.digits), "min_tokens": int(data.passkey.min_tokens),
            "answer_only": bool(data.passkey.answer_only), "seed": int(data.shuffle_seed)}
    if workdir is not None and process_index == 0:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(info, indent=2) + "\n")
    return Inputs(iterator, evals, tokenizer, info)
