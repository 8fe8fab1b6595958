"""What a run needs before its first step, checked without compiling anything.

`validate_run_config` checks each field on its own; this checks what the fields lead to:
the files they name exist (data.registry.check_files, init_from.check_source), the
documents can be read, the tokenizer can be built (or is there) and has the model's
vocabulary, and the training split is large enough for the run. The pre-flight calls it
before compiling for a pod, `main` before training, so a run that would fail on its data
fails here, in one line naming the field.

For a local source (the embedded corpora, data.source=files) this does what the run does
first: collect the documents, train the SentencePiece tokenizer if there is none, tokenise.
All of it goes to the shared cache (data.cache_dir), so the run itself then starts at once;
nothing is written to a workdir.
"""

from __future__ import annotations

import os
import re
from typing import Any

from gated_attention.config import run_config
from gated_attention.config.run_config import ConfigError
from gated_attention.core import paths
from gated_attention.data import epochs
from gated_attention.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer

LOCAL_SOURCES = ("cpython_docs", "python_source", "files")
# SentencePiece's own words when a corpus has fewer pieces than asked for.
_TOO_MANY_PIECES = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value "
                              r"<= (\d+)")


def check_run(config: Any, workdir: str | os.PathLike[str] | None = None, *,
              inputs: bool = True) -> dict[str, Any]:
    """Raise ConfigError (one line, naming the field) if the run cannot get to its first step;
    returns what was found (tokenizer, training tokens, epochs) for a report.

    `workdir`: the run's folder, when resuming; its saved tokenizer is then the one used.
    `inputs=False` checks the tokenizer alone (what `main` asks before training, which then
    checks the held-out split and the epoch budget itself, after the workdir).
    """
    from gated_attention.data import registry

    registry.check_files(config)  # the tokenizer file and the source's own files
    if config.train.get("init_from"):  # the source run's parameters fit this model
        from gated_attention.training.init_from import check_source

        check_source(config, run_config.model_config(config))
    data, vocab = config.data, int(config.model.vocab_size)
    saved = _saved_tokenizer(config, workdir)
    if saved is not None:
        saved_vocab = SentencePieceTokenizer(saved).vocab_size
        _check_vocab(saved_vocab, vocab, f"the tokenizer saved in {workdir} (by the run there; "
                     "--overwrite moves it aside)")
        if data.source not in LOCAL_SOURCES:
            return {"tokenizer_vocab": saved_vocab}
    if data.source in LOCAL_SOURCES:
        return _check_local(config, vocab, saved, inputs)
    if data.tokenizer_path and data.tokenizer in ("sentencepiece", "byte"):
        from gated_attention.data.inputs import stream_tokenizer

        try:  # the streamed sources read data.tokenizer_path as it is: its size must match
            tokenizer = stream_tokenizer(config)
        except (OSError, RuntimeError, ValueError) as err:
            raise ConfigError(_one_line(f"data.tokenizer_path={data.tokenizer_path!r}: {err}")
                              ) from None
        _check_vocab(tokenizer.vocab_size, vocab, f"data.tokenizer_path={data.tokenizer_path!r}")
        return {"tokenizer_vocab": tokenizer.vocab_size}
    return {}


def _check_local(config: Any, vocab: int, saved: Any, inputs: bool) -> dict[str, Any]:
    import ml_collections

    from gated_attention.data import pipeline

    data = config.data
    if saved is not None:  # a resumed run reads its own tokenizer: nothing to train
        data = ml_collections.ConfigDict(data.to_dict())
        data.tokenizer_path = os.fspath(saved)
    try:
        if not inputs:
            return {"tokenizer_vocab": _local_tokenizer(data, vocab).vocab_size}
        local = pipeline.load_local_data(data, vocab)
    except RuntimeError as err:  # SentencePiece's trainer
        raise ConfigError(_tokenizer_error(config, str(err))) from None
    except (OSError, ValueError) as err:
        field = "data.tokenizer_path" if data.tokenizer_path else "data.paths"
        if data.source != "files" and not data.tokenizer_path:
            field = "model.vocab_size"
        raise ConfigError(_one_line(f"{field}: {err}")) from None
    # The checks training makes once its inputs are built, in its order and words.
    train, seq_len = config.train, data.seq_len
    held_out = local.summary["held_out"]["tokens"]
    if train.eval_batches and held_out < seq_len + 1:
        raise ConfigError(f"data.seq_len={seq_len} is longer than the whole held-out split "
                          f"({held_out} tokens): lower data.seq_len, raise data.eval_fraction, "
                          "or set train.eval_batches=0")
    if train.eval_batches:
        pipeline.eval_batches(local, data, train.batch_size, 1)  # ConfigError if none fills
    epochs_asked = epochs.check(config, local.summary)
    return {"tokenizer_vocab": local.tokenizer.vocab_size,
            "train_tokens": local.summary["train"]["tokens"], "epochs": epochs_asked}


def _local_tokenizer(data: Any, vocab: int) -> Any:
    """The tokenizer a run on a local source starts from (trained into the cache if new)."""
    from gated_attention.data import corpus
    from gated_attention.data.tokenizer import get_tokenizer

    documents = corpus.load_documents(data.source, paths=data.paths, text_key=data.text_key,
                                      cache_dir=data.cache_dir)
    train_docs, _ = corpus.split_documents(documents, data.eval_fraction)
    return get_tokenizer(data.tokenizer, vocab, train_docs, cache_dir=data.cache_dir,
                         model_type=data.sp_model_type,
                         input_sentence_size=data.sp_input_sentence_size,
                         model_path=data.get("tokenizer_path", ""))


def _tokenizer_error(config: Any, message: str) -> str:
    data, vocab = config.data, config.model.vocab_size
    match = _TOO_MANY_PIECES.search(message)
    if match:
        return (f"model.vocab_size={vocab} is more pieces than a SentencePiece "
                f"{data.sp_model_type} tokenizer can learn from data.source={data.source!r} "
                f"(at most {match.group(2)}); set data.tokenizer_path to a tokenizer with "
                f"{vocab} pieces, choose a larger corpus (data.source, data.paths), or lower "
                "model.vocab_size")
    return _one_line(f"data.tokenizer={data.tokenizer!r}: SentencePiece cannot be trained on "
                     f"data.source={data.source!r} with model.vocab_size={vocab}: {message}")


def _saved_tokenizer(config: Any, workdir: str | os.PathLike[str] | None) -> Any:
    """The SentencePiece tokenizer file a resumed run reads, if there is one."""
    if workdir is None or config.data.tokenizer != "sentencepiece":
        return None
    path = paths.resolve(workdir) / TOKENIZER_FILE
    return path if path.exists() else None


def _check_vocab(found: int, vocab: int, what: str) -> None:
    if found != vocab:
        raise ConfigError(f"model.vocab_size={vocab} disagrees with {what}, which has {found} "
                          f"tokens; set model.vocab_size={found} or use another tokenizer")


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(lines[:1]) if lines else str(text)
