"""What a run needs before its first step, checked without compiling anything.

`validate_run_config` checks each field on its own; this checks what the fields lead to:
the documents can be read, the tokenizer can be built (or is there) and has the model's
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

from gated_attention import config_lib, paths
from gated_attention.config_lib import ConfigError

LOCAL_SOURCES = ("cpython_docs", "python_source", "files")
# SentencePiece's own words when a corpus has fewer pieces than asked for.
_TOO_MANY_PIECES = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value "
                              r"<= (\d+)")


def check_run(config: Any, workdir: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Raise ConfigError (one line, naming the field) if the run cannot get to its first step;
    returns what was found (tokenizer, training tokens, epochs) for a report.

    `workdir`: the run's folder, when resuming; its saved tokenizer is then the one used.
    """
    data, vocab = config.data, int(config.model.vocab_size)
    saved = _saved_tokenizer(config, workdir)
    if saved is not None:
        _check_vocab(saved, vocab, f"the tokenizer saved in {workdir}")
        if data.source not in LOCAL_SOURCES:
            return {"tokenizer_vocab": saved}
    if data.source in LOCAL_SOURCES:
        return _check_local(config, vocab)
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


def _check_local(config: Any, vocab: int) -> dict[str, Any]:
    from gated_attention.data import pipeline

    data = config.data
    try:
        local = pipeline.load_local_data(data, vocab)
    except RuntimeError as err:  # SentencePiece's trainer
        raise ConfigError(_tokenizer_error(config, str(err))) from None
    except KeyError as err:  # a .jsonl record without data.text_key (the message says so)
        raise ConfigError(_one_line(str(err).strip("'\""))) from None
    except (OSError, ValueError) as err:
        field = "data.tokenizer_path" if data.tokenizer_path else "data.paths"
        if data.source != "files" and not data.tokenizer_path:
            field = "model.vocab_size"
        raise ConfigError(_one_line(f"{field}: {err}")) from None
    held_out = local.summary["held_out"]["documents"]
    if config.train.eval_every and not held_out:
        raise ConfigError(f"data.eval_fraction={data.eval_fraction} holds out no document of "
                          f"data.source={data.source!r} ({local.summary['corpus']['documents']}"
                          " documents); raise it, add documents, or set train.eval_every=0")
    epochs = config_lib.check_epochs(config, local.summary)
    return {"tokenizer_vocab": local.tokenizer.vocab_size,
            "train_tokens": local.summary["train"]["tokens"], "epochs": epochs}


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


def _saved_tokenizer(config: Any, workdir: str | os.PathLike[str] | None) -> int | None:
    """The vocabulary size of the SentencePiece tokenizer a resumed run reads, if any."""
    if workdir is None or config.data.tokenizer != "sentencepiece":
        return None
    from gated_attention.data.tokenizer import TOKENIZER_FILE, SentencePieceTokenizer

    path = paths.resolve(workdir) / TOKENIZER_FILE
    if not path.exists():
        return None
    return SentencePieceTokenizer(path).vocab_size


def _check_vocab(found: int, vocab: int, what: str) -> None:
    if found != vocab:
        raise ConfigError(f"model.vocab_size={vocab} disagrees with {what}, which has {found} "
                          f"tokens; set model.vocab_size={found} or use another tokenizer")


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return " ".join(lines[:1]) if lines else str(text)
