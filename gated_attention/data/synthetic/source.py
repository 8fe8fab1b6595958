"""Synthetic data: random token ids of the model's vocabulary in the config's shapes.

Nothing is read and no tokenizer is built, so a run, a benchmark or the pre-flight can start
before any data exist: the compiled step depends on the model, the mesh and the batch shapes,
not on the tokens. Every row is one segment of `data.seq_len` tokens (no padding), drawn
uniformly from the ids past the special ones (pad, bos, eos), from `data.shuffle_seed` and
the batch index: batch i is the same whatever came before, so a run resumes exactly.

What it does not check is the real run's data: its documents, tokenizer, vocabulary and epoch
budget are checked when the pre-flight (or `main`) is given the run's own data fields.
A model trained on it learns nothing beyond the uniform distribution (loss ln V).
"""

from __future__ import annotations

import json
import os
from typing import Any

import grain
import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import require
from gated_attention.data.inputs import Inputs
from gated_attention.data.synthetic import bigram_backcopy

OWN_VOCABULARY = True  # the ids are drawn directly: no tokenizer
FIRST_ID = 3  # ids 0..2 are pad, bos, eos in every tokenizer of the package
TRAIN_STREAM, EVAL_STREAM = bigram_backcopy.TRAIN_STREAM, bigram_backcopy.EVAL_STREAM


def check(config: Any, cfg: Any) -> None:
    require(cfg.vocab_size > FIRST_ID, f"data.source='synthetic' needs model.vocab_size > "
            f"{FIRST_ID} (ids past pad, bos, eos); got {cfg.vocab_size}")


class Vocabulary:
    """The ids a synthetic run draws, standing in for its tokenizer."""

    def __init__(self, vocab_size: int):
        self.vocab_size = vocab_size

    def label(self, token: int) -> str:
        return str(token)


class SyntheticSource(bigram_backcopy.BatchSource):
    """Random access to uniform random batches (a grain data source, resumable by index)."""

    def sequences(self, rng: np.random.Generator) -> np.ndarray:
        vocab = self.chain.vocab_size  # the Vocabulary in the chain's place
        return rng.integers(FIRST_ID, vocab,
                            (self.global_batch, self.seq_len + 1), dtype=np.int32)


def summary(config: Any) -> dict[str, Any]:
    """What the data were: their shapes, and that they are random."""
    return {"source": "synthetic", "vocab_size": int(config.model.vocab_size),
            "seq_len": int(config.data.seq_len), "seed": int(config.data.shuffle_seed),
            "tokens": f"uniform random ids {FIRST_ID}..{int(config.model.vocab_size) - 1}"}


def build_inputs(config: Any, workdir: str | os.PathLike[str] | None = None, *,
                 process_index: int = 0, process_count: int = 1) -> Inputs:
    """The data.Inputs of a `data.source=synthetic` run."""
    data, train = config.data, config.train
    vocabulary = Vocabulary(int(config.model.vocab_size))
    hosts = dict(seed=int(data.shuffle_seed), process_index=process_index,
                 process_count=process_count)
    source = SyntheticSource(vocabulary, int(data.seq_len), int(train.batch_size),
                             stream=TRAIN_STREAM, length=bigram_backcopy.ENDLESS, **hosts)
    iterator = iter(grain.MapDataset.source(source).to_iter_dataset(
        bigram_backcopy.READ_OPTIONS))
    held_out = SyntheticSource(vocabulary, int(data.seq_len), int(train.batch_size),
                               stream=EVAL_STREAM, length=int(train.eval_batches), **hosts)
    info = summary(config)
    if workdir is not None and process_index == 0:
        paths.write_atomic(paths.resolve(workdir) / "data_summary.json",
                           json.dumps(info, indent=2) + "\n")
    return Inputs(iterator, [held_out[i] for i in range(len(held_out))], vocabulary, info)
