"""Bigram-Backcopy: a synthetic task on which a first-token attention sink forms in minutes.

From Guo et al. 2024 ("Active-Dormant Attention Heads", arXiv 2410.13835). Token 0 is BOS and
starts every sequence; tokens 1..V-1 follow a fixed random bigram chain whose rows are drawn
from a symmetric Dirichlet(alpha). The `triggers` most frequent chain tokens (under the
chain's stationary distribution) are triggers: the token after a trigger copies the token
before it. An attention head is useful only at trigger positions and must do nothing
elsewhere; a softmax head "does nothing" by parking its attention on BOS, which is the sink.

Everything is drawn from seeds: the chain from `data.backcopy.seed`, the sequences from
`data.shuffle_seed` and the batch index, so batch i is the same whatever came before, and a
grain iterator over batch indices resumes exactly (its state is the next index). Held-out
batches come from a separate stream of the same chain.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any

import grain
import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError, require
from gated_attention.data.inputs import Inputs
from gated_attention.data.packing import Batch
from gated_attention.parallel.distributed import host_rows

BOS_ID = 0
TRAIN_STREAM, EVAL_STREAM = 0, 1
READ_OPTIONS = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)
ENDLESS = 2**62  # batch indices a training stream can reach


@dataclasses.dataclass(frozen=True)
class Chain:
    """The task's fixed random process: transition matrix, start distribution, triggers."""

    transitions: np.ndarray  # [V, V] float64; rows/columns 0 (BOS) are never used
    stationary: np.ndarray   # [V] float64, the chain's stationary distribution (0 at BOS)
    triggers: np.ndarray     # [n] int32 token ids, most frequent first

    @property
    def vocab_size(self) -> int:
        return len(self.stationary)

    @property
    def bos_id(self) -> int:
        return BOS_ID

    @functools.cached_property
    def is_trigger(self) -> np.ndarray:
        """[V] bool lookup table."""
        table = np.zeros(self.vocab_size, bool)
        table[self.triggers] = True
        return table

    @functools.cached_property
    def row_entropy(self) -> np.ndarray:
        """[V] entropy (nats) of the next token after each token, under the bigram rule."""
        p = self.transitions
        return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1)

    def label(self, token: int) -> str:
        if token == BOS_ID:
            return "<bos>"
        return f"T{token}" if self.is_trigger[token] else str(token)


def make_chain(vocab_size: int, num_triggers: int, alpha: float, seed: int) -> Chain:
    """Dirichlet(alpha) rows over tokens 1..V-1; triggers = the most frequent tokens."""
    if vocab_size < num_triggers + 3:
        raise ConfigError(f"model.vocab_size={vocab_size} must be >= data.backcopy.triggers + 3 "
                          f"= {num_triggers + 3} (BOS, the triggers, two other tokens)")
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xB16]))
    n = vocab_size - 1
    rows = rng.dirichlet(np.full(n, alpha), size=n)
    transitions = np.zeros((vocab_size, vocab_size))
    transitions[1:, 1:] = rows
    # Stationary distribution: the left eigenvector of eigenvalue 1 (power iteration suffices
    # for a chain with all entries > 0, which Dirichlet rows have almost surely).
    pi = np.full(n, 1.0 / n)
    for _ in range(10_000):
        nxt = pi @ rows
        if np.max(np.abs(nxt - pi)) < 1e-13:
            break
        pi = nxt
    stationary = np.concatenate([[0.0], nxt / nxt.sum()])
    order = np.argsort(-stationary[1:], kind="stable") + 1
    return Chain(transitions, stationary, order[:num_triggers].astype(np.int32))


def chain_from_config(data_config: Any, vocab_size: int) -> Chain:
    own = data_config.backcopy
    return make_chain(vocab_size, int(own.triggers), float(own.alpha), int(own.seed))


# The chain over model.vocab_size tokens (BOS = 0); sequences are drawn from data.shuffle_seed.
SECTION = "backcopy"  # config.data.backcopy
FIELDS = dict(
    triggers=3,  # how many of the most frequent tokens trigger a copy
    alpha=0.1,   # Dirichlet concentration of the chain's rows
    seed=0,      # seed of the chain itself
)
FLAT_ALIASES = {"backcopy_triggers": "triggers", "backcopy_alpha": "alpha",
                "backcopy_seed": "seed"}
OWN_VOCABULARY = True  # the chain's states are the token ids: no tokenizer


def check(config: Any, cfg: Any) -> None:
    own = config.data.backcopy
    require(1 <= own.triggers <= cfg.vocab_size - 3,
            f"data.backcopy.triggers={own.triggers} must be in 1..model.vocab_size - 3"
            f" = {cfg.vocab_size - 3} (BOS and two other tokens stay non-triggers)")
    require(own.alpha > 0,
            f"data.backcopy.alpha={own.alpha} must be > 0 (Dirichlet concentration)")


def sample_sequences(chain: Chain, rows: int, length: int, rng: np.random.Generator
                     ) -> np.ndarray:
    """[rows, length] int32: BOS, then the chain with the back-copy rule after triggers.

    Position 1 is drawn from the stationary distribution; at position t >= 2 the token copies
    position t-2 when position t-1 holds a trigger and t-2 is not BOS, else follows row
    x[t-1] of the chain.
    """
    out = np.zeros((rows, length), np.int32)
    out[:, 0] = BOS_ID
    if length == 1:
        return out
    cdf = np.cumsum(chain.transitions, axis=1)
    cdf[:, -1] = 1.0
    start_cdf = np.cumsum(chain.stationary)
    start_cdf[-1] = 1.0
    u = rng.random((rows, length))
    out[:, 1] = np.searchsorted(start_cdf, u[:, 1], side="right")
    for t in range(2, length):
        prev = out[:, t - 1]
        bigram = np.minimum(
            (cdf[prev] < u[:, t:t + 1]).sum(axis=1), chain.vocab_size - 1).astype(np.int32)
        copy = chain.is_trigger[prev] & (t >= 3)  # position t-2 = 0 is BOS: nothing to copy
        out[:, t] = np.where(copy, out[:, t - 2], bigram)
    return out


def copy_positions(chain: Chain, inputs: np.ndarray) -> np.ndarray:
    """[b, s] bool: input positions whose next token is a copy (a trigger after a real token)."""
    positions = np.arange(inputs.shape[1])
    return chain.is_trigger[inputs] & (positions >= 2)


def make_batch(sequences: np.ndarray) -> Batch:
    """[b, S + 1] sequences -> the training batch format (one segment per row)."""
    rows, length = sequences.shape
    seq_len = length - 1
    return {
        "inputs": sequences[:, :-1],
        "targets": sequences[:, 1:],
        "segment_ids": np.ones((rows, seq_len), np.int32),
        "positions": np.broadcast_to(np.arange(seq_len, dtype=np.int32), (rows, seq_len)).copy(),
        "mask": np.ones((rows, seq_len), np.int32),
    }


class BatchSource:
    """Random access to the batches of one stream (grain data source: __len__, __getitem__).

    Batch i is drawn from SeedSequence([shuffle_seed, stream, i]) as a whole global batch,
    and this host keeps its rows, so the data do not depend on the number of hosts.
    """

    def __init__(self, chain: Chain, seq_len: int, global_batch: int, *, seed: int,
                 stream: int, length: int, process_index: int = 0, process_count: int = 1):
        self.rows = host_rows(global_batch, process_index, process_count)
        self.chain, self.seq_len, self.global_batch = chain, seq_len, global_batch
        self.seed, self.stream, self.length = seed, stream, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Batch:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, self.stream, int(index)]))
        return make_batch(self.sequences(rng)[self.rows])

    def sequences(self, rng: np.random.Generator) -> np.ndarray:
        """[global batch, seq_len + 1] int32: one whole global batch of the chain."""
        return sample_sequences(self.chain, self.global_batch, self.seq_len + 1, rng)


def eval_batches(chain: Chain, seq_len: int, batch_size: int, num_batches: int, *, seed: int,
                 process_index: int = 0, process_count: int = 1) -> list[Batch]:
    source = BatchSource(chain, seq_len, batch_size, seed=seed, stream=EVAL_STREAM,
                         length=num_batches, process_index=process_index,
                         process_count=process_count)
    return [source[i] for i in range(num_batches)]


def summary(chain: Chain, data_config: Any) -> dict[str, Any]:
    """What a run's data were: the chain's size, triggers and the loss floor it implies."""
    pi = chain.stationary
    return {
        "source": "bigram_backcopy", "vocab_size": chain.vocab_size, "bos_id": BOS_ID,
        "triggers": chain.triggers.tolist(),
        "trigger_frequency": float(pi[chain.triggers].sum()),
        "alpha": float(data_config.backcopy.alpha), "chain_seed": int(data_config.backcopy.seed),
        "bigram_entropy_nats": float(pi @ chain.row_entropy),
        "seq_len": int(data_config.seq_len),
    }


def build_inputs(config: Any, workdir: str | os.PathLike[str] | None = None, *,
                 process_index: int = 0, process_count: int = 1) -> Inputs:
    """The data.Inputs of a bigram_backcopy run (the Chain stands in for the tokenizer)."""
    data, train = config.data, config.train
    chain = chain_from_config(data, config.model.vocab_size)
    source = BatchSource(chain, data.seq_len, train.batch_size, seed=data.shuffle_seed,
                         stream=TRAIN_STREAM, length=ENDLESS, process_index=process_index,
                         process_count=process_count)
    iterator = iter(grain.MapDataset.source(source).to_iter_dataset(READ_OPTIONS))
    evals = (eval_batches(chain, data.seq_len, train.batch_size, train.eval_batches,
                          seed=data.shuffle_seed, process_index=process_index,
                          process_count=process_count) if train.eval_batches else [])
    info = summary(chain, data)
    if workdir is not None and process_index == 0:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(info, indent=2) + "\n")
    return Inputs(iterator, evals, chain, info)
