"""The epoch guard: a run may not pass over its training split more than data.max_epochs
times (default 4). Repeating a small corpus hundreds of times (a `small` or paper-size model
on the 0.8M-token CPython text) silently measures memorisation instead of language modelling.

Tokens asked = train.steps x train.batch_size x data.seq_len. The training split's size is
exact for the local sources and the ArrayRecord shards (their manifest), and estimated for
tfds and seqio (documents in the split x mean tokens of its first documents).
"""

from __future__ import annotations

from typing import Any

from gated_attention.core.checks import ConfigError


class EpochBudgetError(ConfigError):
    """The run asks for more epochs of its training split than data.max_epochs (run_config
    turns it into a ConfigError)."""

LARGER = {
    "cpython_docs": "data.source=python_source (tens of millions of tokens), or C4 through "
                    "data.source=tfds / prepared ArrayRecord shards (data.source=array_record)",
    "python_source": "C4 through data.source=tfds, or prepared ArrayRecord shards "
                     "(data.source=array_record)",
}
OTHER = "a larger dataset (more data.paths files, a larger tfds dataset or seqio task, or " \
        "shards prepared from one)"


def train_tokens(summary: dict[str, Any]) -> tuple[int | None, bool]:
    """(tokens in the training split, whether that is an estimate) from a data summary."""
    train = summary.get("train") or {}
    if train.get("tokens"):
        return int(train["tokens"]), False
    if train.get("tokens_estimated"):
        return int(train["tokens_estimated"]), True
    return None, False


def check(config: Any, summary: dict[str, Any]) -> float | None:
    """Raise EpochBudgetError if the run asks for more than data.max_epochs epochs; returns
    the epochs asked (None if the split's size is unknown)."""
    tokens, estimated = train_tokens(summary)
    if not tokens:
        return None
    data, train = config.data, config.train
    asked = train.steps * train.batch_size * data.seq_len
    epochs = asked / tokens
    if epochs > data.max_epochs:
        source = data.source
        most = int(data.max_epochs * tokens // (train.batch_size * data.seq_len))
        size = f"{'about ' if estimated else ''}{tokens / 1e6:,.2f}M tokens"
        raise EpochBudgetError(
            f"train.steps={train.steps} x train.batch_size={train.batch_size} x data.seq_len="
            f"{data.seq_len} = {asked / 1e6:,.1f}M tokens is {epochs:,.1f} epochs of the "
            f"training split of data.source={source!r} ({size}), more than data.max_epochs="
            f"{data.max_epochs:g}; use {LARGER.get(source, OTHER)}, or train.steps <= {most}, "
            "or raise data.max_epochs")
    return epochs
