"""Tokenizers: SentencePiece trained on the training split at first use (cached), bytes, or a
Hugging Face `tokenizer.json` (e.g. the paper's 151,936-entry Qwen-style BPE).

SentencePiece and bytes reserve the same special ids: pad 0, bos 1, eos 2 (SentencePiece also
has unk 3). A `tokenizer.json` brings its own special tokens (see hf_tokenizer.py). The
SentencePiece model is cached under `<cache>/tokenizers/`, keyed by the corpus fingerprint,
the vocabulary size and the training options; the tokenizer file of a run is copied into its
workdir, which is authoritative on resume. Training reads at most `input_sentence_size` lines,
drawn by numpy's generator from a fixed seed (`training_sample`), with two threads, so it takes
seconds (it is on the demo's clock) and gives the same model in every process.
"""

from __future__ import annotations

import hashlib
import io
import os
import pathlib
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError, choice, require
from gated_attention.data.corpus import Document, cache_root, fingerprint

PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
BYTE_OFFSET = 3
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET  # pad, bos, eos + 256 byte values
TOKENIZER_FILE = "tokenizer.model"
MAX_SENTENCE_CHARS = 4096


class Tokenizer(Protocol):
    vocab_size: int
    pad_id: int
    bos_id: int
    eos_id: int

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes shifted past the three special ids; vocab_size may exceed 259 (unused ids)."""

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, vocab_size: int = BYTE_VOCAB_SIZE):
        if vocab_size < BYTE_VOCAB_SIZE:
            raise ConfigError(f"model.vocab_size={vocab_size} is too small for data.tokenizer="
                              f"'byte': needs >= {BYTE_VOCAB_SIZE} (256 bytes + pad, bos, eos)")
        self.vocab_size = vocab_size

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        return [np.frombuffer(t.encode("utf-8", "replace"), np.uint8).astype(np.int32)
                + BYTE_OFFSET for t in texts]

    def decode(self, ids: Sequence[int]) -> str:
        data = bytes(int(i) - BYTE_OFFSET for i in ids if int(i) >= BYTE_OFFSET)
        return data.decode("utf-8", "replace")


class SentencePieceTokenizer:
    def __init__(self, model_file: str | os.PathLike[str]):
        import sentencepiece as spm

        self.model_file = paths.resolve(model_file)  # local or gs://: read through epath
        self.processor = spm.SentencePieceProcessor(model_proto=self.model_file.read_bytes())
        self.vocab_size = self.processor.vocab_size()
        self.pad_id, self.bos_id = self.processor.pad_id(), self.processor.bos_id()
        self.eos_id = self.processor.eos_id()

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        ids = self.processor.encode(list(texts), num_threads=min(os.cpu_count() or 1, 4))
        return [np.asarray(x, np.int32) for x in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return self.processor.decode([int(i) for i in ids])


def _sentences(documents: Sequence[Document]) -> list[str]:
    """Non-empty lines, long ones cut: SentencePiece's unit of training input."""
    out = []
    for doc in documents:
        for line in doc.text.splitlines():
            line = line.strip()
            while line:
                out.append(line[:MAX_SENTENCE_CHARS])
                line = line[MAX_SENTENCE_CHARS:]
    return out


def training_sample(sentences: list[str], size: int, seed: int) -> list[str]:
    """At most `size` sentences, drawn without replacement from `seed`, in corpus order.

    SentencePiece's own sampler (`shuffle_input_sentence` over more lines than
    `input_sentence_size`) draws another sample in every process whatever its seed, so the
    same corpus gave another tokenizer on every fresh cache; the draw here repeats."""
    if size <= 0 or len(sentences) <= size:
        return sentences
    keep = np.sort(np.random.default_rng(seed).choice(len(sentences), size, replace=False))
    return [sentences[i] for i in keep]


def train_sentencepiece(documents: Sequence[Document], vocab_size: int, path: pathlib.Path, *,
                        model_type: str = "bpe", input_sentence_size: int = 100_000,
                        seed: int = 0) -> None:
    import sentencepiece as spm

    spm.set_random_generator_seed(seed)
    model = io.BytesIO()
    sample = training_sample(_sentences(documents), input_sentence_size, seed)
    spm.SentencePieceTrainer.train(  # with the sample within the size it samples nothing
        sentence_iterator=iter(sample), model_writer=model,
        vocab_size=vocab_size, model_type=model_type, character_coverage=0.9995,
        byte_fallback=True, input_sentence_size=input_sentence_size,
        shuffle_input_sentence=True, num_threads=2, max_sentence_length=MAX_SENTENCE_CHARS * 4,
        pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID, unk_id=UNK_ID,
        split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", minloglevel=2,
    )
    paths.write_atomic(path, model.getvalue())


def sentencepiece_cache_key(documents: Sequence[Document], vocab_size: int, model_type: str,
                            input_sentence_size: int) -> str:
    options = f"{vocab_size}|{model_type}|{input_sentence_size}|v2"  # v2: training_sample
    return hashlib.sha256(f"{fingerprint(documents)}|{options}".encode()).hexdigest()[:20]


def check_tokenizer_path(model_path: str) -> None:
    """data.tokenizer_path names a file (checked where it is opened, before any compile)."""
    require(paths.resolve(model_path).exists(),
            f"data.tokenizer_path={model_path!r} does not exist (a tokenizer file: SentencePiece "
            ".model or tokenizer.json; leave it empty to train one)")


def get_tokenizer(kind: str, vocab_size: int, train_documents: Sequence[Document] | None = None,
                  *, workdir: str | os.PathLike[str] | None = None, cache_dir: str = "",
                  model_type: str = "bpe", input_sentence_size: int = 100_000,
                  model_path: str = "") -> Tokenizer:
    """The run's tokenizer: the workdir's copy, else `model_path`, else cached, else trained."""
    if kind == "byte":
        return ByteTokenizer(vocab_size)
    if kind == "hf":
        from gated_attention.data import hf_tokenizer

        return hf_tokenizer.load(model_path, vocab_size, workdir=workdir)
    choice("data.tokenizer", kind, ("sentencepiece", "byte", "hf"))
    in_workdir = paths.resolve(workdir) / TOKENIZER_FILE if workdir else None
    if in_workdir is not None and in_workdir.exists():
        tokenizer = SentencePieceTokenizer(in_workdir)
    elif model_path:
        check_tokenizer_path(model_path)
        if in_workdir is not None:
            paths.write_atomic(in_workdir, paths.resolve(model_path).read_bytes())
        tokenizer = SentencePieceTokenizer(in_workdir or model_path)
    else:
        if train_documents is None:
            where = f"{in_workdir} does not exist" if in_workdir is not None else "no workdir"
            raise ConfigError(f"data.tokenizer='sentencepiece' has no model: {where} and "
                              "data.tokenizer_path is empty (set it to a .model file, or to a "
                              "tokenizer.json with data.tokenizer='hf'; training one needs the "
                              "training documents)")
        key = sentencepiece_cache_key(train_documents, vocab_size, model_type,
                                      input_sentence_size)
        cached = cache_root(cache_dir) / "tokenizers" / f"sp-{key}.model"
        if not cached.exists():
            train_sentencepiece(train_documents, vocab_size, cached, model_type=model_type,
                                input_sentence_size=input_sentence_size)
        if in_workdir is not None:
            paths.write_atomic(in_workdir, cached.read_bytes())
        tokenizer = SentencePieceTokenizer(in_workdir or cached)
    if tokenizer.vocab_size != vocab_size:
        raise ConfigError(f"the tokenizer at {tokenizer.model_file} has {tokenizer.vocab_size} "
                          f"tokens but model.vocab_size={vocab_size}")
    return tokenizer
