"""The data sources of a run (config.data.source), one module each, behind one table.

A source module holds everything about its source:
- `FIELDS`: the `config.data` fields it owns, with their defaults (base_config adds them to
  the data section; a field two sources share, e.g. data.paths, has one default);
- `check(config, cfg)` (optional): its fields, checked without reading a file, raising
  ConfigError naming the field and what is allowed (cfg is the run's ModelConfig);
- `check_files(config)` (optional): what it reads (datasets, shards, paths) exists and fits;
  its `build_inputs` calls it before opening them, and run_checks before a run starts;
- `build_inputs(config, workdir, *, process_index, process_count)`: the run's `Inputs`;
- `OWN_VOCABULARY = True` when the source makes its token ids itself (no text tokenizer to
  size), `TOKENIZER_IN_DATA = True` when its files carry the tokenizer (data.tokenizer_path
  may stay empty).

Adding a source is writing that module and one line in SOURCES. The fields every source
shares (seq_len, the tokenizer, packing, ...) are checked here, by `check_section`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any

from gated_attention.config_checks import ConfigError, choice, require
from gated_attention.data.inputs import Inputs
from gated_attention.data.streams import PACKINGS

# config.data.source -> the module that provides it.
SOURCES: dict[str, str] = {
    "cpython_docs": "gated_attention.data.local_source",
    "python_source": "gated_attention.data.local_source",
    "files": "gated_attention.data.local_source",
    "seqio": "gated_attention.data.seqio_source",
    "tfds": "gated_attention.data.tfds_source",
    "array_record": "gated_attention.data.array_record_source",
    "bigram_backcopy": "gated_attention.data.bigram_backcopy",
    "passkey": "gated_attention.data.passkey",
}
TOKENIZERS = ("sentencepiece", "byte", "hf")
SENTENCEPIECE_MODELS = ("unigram", "bpe")


def source_module(name: str) -> ModuleType:
    """The module of data.source=`name` (imported on first use)."""
    choice("data.source", name, SOURCES)
    return importlib.import_module(SOURCES[name])


def source_fields() -> dict[str, Any]:
    """Every source's own data fields with their defaults, in the order of SOURCES."""
    fields: dict[str, Any] = {}
    for name in SOURCES:
        for field, default in getattr(source_module(name), "FIELDS", {}).items():
            if field in fields and fields[field] != default:
                raise ValueError(f"data.{field} has two defaults ({fields[field]!r} and "
                                 f"{default!r}); sources that share a field share its default")
            fields[field] = default
    return fields


def check_section(config: Any, cfg: Any) -> None:
    """The data section's fields (no file is read): the shared ones, then the source's own."""
    data = config.data
    module = source_module(data.source)
    choice("data.tokenizer", data.tokenizer, TOKENIZERS)
    choice("data.sp_model_type", data.sp_model_type, SENTENCEPIECE_MODELS)
    require(data.seq_len >= 2, f"data.seq_len={data.seq_len} must be >= 2")
    require(0.0 < data.eval_fraction < 1.0,
            f"data.eval_fraction={data.eval_fraction} must be in (0, 1)")
    choice("data.packing", data.packing, PACKINGS)
    require(data.packing != "concat" or data.add_eos, "data.packing='concat' joins documents "
            "with EOS: it needs data.add_eos=True")
    require(data.max_epochs > 0, f"data.max_epochs={data.max_epochs} must be > 0")
    require(data.sp_input_sentence_size > 0,
            f"data.sp_input_sentence_size={data.sp_input_sentence_size} must be > 0")
    if data.tokenizer == "byte":
        from gated_attention.data.tokenizer import BYTE_VOCAB_SIZE

        require(cfg.vocab_size >= BYTE_VOCAB_SIZE,
                f"data.tokenizer='byte' needs model.vocab_size >= {BYTE_VOCAB_SIZE} (256 bytes "
                f"+ pad, bos, eos); got {cfg.vocab_size}")
    elif data.tokenizer == "hf":
        require(bool(data.tokenizer_path) or getattr(module, "TOKENIZER_IN_DATA", False),
                "data.tokenizer='hf' needs data.tokenizer_path (a tokenizer.json file)")
    elif not getattr(module, "OWN_VOCABULARY", False):
        require(cfg.vocab_size >= 64, f"model.vocab_size={cfg.vocab_size} must be >= 64 for a "
                "SentencePiece tokenizer")
    from gated_attention.paths import is_local

    require(is_local(data.cache_dir), f"data.cache_dir={data.cache_dir!r} must be a local "
            "folder (each host's own cache); the workdir and data.paths may be in a bucket")
    if hasattr(module, "check"):
        module.check(config, cfg)


def check_files(config: Any) -> None:
    """What the data settings name exists and fits (the tokenizer file, then the source's own
    files), read once, before anything is compiled; raises ConfigError naming the field."""
    data = config.data
    if data.tokenizer_path:
        from gated_attention.data.tokenizer import check_tokenizer_path

        check_tokenizer_path(data.tokenizer_path)
        if data.tokenizer == "hf":
            from gated_attention.data import hf_tokenizer

            try:  # the vocabulary must fit the model's
                hf_tokenizer.check_vocab(hf_tokenizer.HFTokenizer(data.tokenizer_path),
                                         int(config.model.vocab_size))
            except hf_tokenizer.HFTokenizerError as err:
                raise ConfigError(str(err)) from None
    check_source_files(config)


def check_source_files(config: Any) -> None:
    """The source's own check_files, its errors as one-line ConfigErrors."""
    module = source_module(config.data.source)
    if hasattr(module, "check_files"):
        try:
            module.check_files(config)
        except ConfigError:
            raise
        except ValueError as err:  # the source's own error, already naming the field
            raise ConfigError(str(err).strip().splitlines()[0]) from None


def build_inputs(config: Any, workdir: str | os.PathLike[str] | None = None, *,
                 process_index: int = 0, process_count: int = 1) -> Inputs:
    """The run's Inputs from its source. Each source's build_inputs checks what it opens (its
    check_files, the tokenizer file in data/tokenizer.py) before reading it."""
    return source_module(config.data.source).build_inputs(
        config, workdir, process_index=process_index, process_count=process_count)
