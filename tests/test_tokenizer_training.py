"""A SentencePiece model trained on a sample of a corpus is the same in every process: the
sample is drawn here, not by SentencePiece's sampler, which draws another in each process."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from gated_attention.data import tokenizer

REPO = pathlib.Path(__file__).resolve().parents[1]
# Trains on 10,000 lines of 8 words each with room for 2,000 (argv: model path, room).
TRAIN = """
import pathlib, sys
import numpy as np
from gated_attention.data import corpus, tokenizer
rng = np.random.default_rng(1)
words = ["alpha", "beta", "gamma", "delta", "def", "return", "self", "(", ")", ":", "x1", "y22"]
docs = [corpus.Document(str(d), "\\n".join(" ".join(rng.choice(words, 8)) for _ in range(200)))
        for d in range(50)]
tokenizer.train_sentencepiece(docs, 300, pathlib.Path(sys.argv[1]),
                              input_sentence_size=int(sys.argv[2]))
"""


def _train_in_a_new_process(path: pathlib.Path, room: int) -> str:
    subprocess.run([sys.executable, "-c", TRAIN, str(path), str(room)], check=True, cwd=REPO)
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.slow  # three trainings, each in a new process
def test_a_sampled_tokenizer_is_the_same_model_in_every_process(tmp_path):
    models = {_train_in_a_new_process(tmp_path / f"{i}.model", 2000) for i in range(3)}
    assert len(models) == 1


def test_the_sample_is_a_seeded_draw_kept_in_corpus_order():
    sentences = [f"line {i}" for i in range(1000)]
    sample = tokenizer.training_sample(sentences, 100, seed=0)
    numbers = [int(s.split()[1]) for s in sample]
    assert len(numbers) == len(set(numbers)) == 100
    assert numbers == sorted(numbers)
    assert sample == tokenizer.training_sample(sentences, 100, seed=0)
    assert sample != tokenizer.training_sample(sentences, 100, seed=1)
    # a spread draw, not the first 100 lines: about a tenth of each tenth of the corpus
    per_tenth = np.bincount(np.asarray(numbers) // 100, minlength=10)
    assert per_tenth.min() >= 2 and per_tenth.max() <= 25


def test_a_corpus_within_the_room_is_read_whole():
    sentences = [f"line {i}" for i in range(50)]
    assert tokenizer.training_sample(sentences, 50, seed=0) == sentences
    assert tokenizer.training_sample(sentences, 0, seed=0) == sentences
