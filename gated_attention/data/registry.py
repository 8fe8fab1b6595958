"""The data sources of a run (config.data.source), one module each, behind one table.

A source module holds everything about its source:
- `SECTION` and `FIELDS`: the name of its own section of `config.data` and that section's
  fields with their defaults (base_config adds `config.data.<SECTION>`, so a field is set as
  `--config.data.passkey.digits=4`); a source with no settings of its own has neither;
- `FLAT_ALIASES` (optional): `config.data` names of its fields from before sections
  (`seqio_task` for `seqio.task`), kept working as aliases (below);
- `check(config, cfg)` (optional): its fields, checked without reading a file, raising
  ConfigError naming the field as the user writes it and what is allowed (cfg is the run's
  ModelConfig);
- `check_files(config)` (optional): what it reads (datasets, shards, paths) exists and fits;
  its `build_inputs` calls it before opening them, and run_checks before a run starts;
- `build_inputs(config, workdir, *, process_index, process_count)`: the run's `Inputs`;
- `OWN_VOCABULARY = True` when the source makes its token ids itself (no text tokenizer to
  size), `TOKENIZER_IN_DATA = True` when its files carry the tokenizer (data.tokenizer_path
  may stay empty).

Adding a source is writing that module and one line in SOURCES. The fields every source
shares (seq_len, the tokenizer, packing, ...) are run_config's and are checked here, by
`check_section`. Three fields are read by several sources and so stay at the data level
(SHARED_FIELDS) rather than in one source's section: `paths` (the `files` source's paths
and globs, the `array_record` shard folder), `text_key` (the `files` source's .jsonl field,
the `tfds` source's text feature) and `tfds_data_dir` (where `tfds` finds its prepared
dataset, and the `seqio` C4 task its tfds data). Each means one thing whichever source
reads it: one field, not a copy in each section to keep in step.

Flat aliases: before sections, each source's fields sat in `config.data` with a prefix
(`data.seqio_task`, `data.backcopy_alpha`, ...). Those names still work on the command line,
in configs, grids and saved runs: `data.seqio_task` is one ml_collections FieldReference
with `data.seqio.task`, so setting either spelling sets both, and config.json (written with
`to_json_best_effort`) carries both. A run saved before sections has the flat names only;
`with_sections` (run_config.saved_config) rebuilds its sections from them, and
`nested_names` lets the workdir see such a run as the same config.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import ml_collections

from gated_attention.core.checks import ConfigError, choice, require
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
    "bigram_backcopy": "gated_attention.data.synthetic.bigram_backcopy",
    "passkey": "gated_attention.data.synthetic.passkey",
    "synthetic": "gated_attention.data.synthetic.source",
}
# Data-level fields read by several sources (see above), with their one default each.
SHARED_FIELDS: dict[str, Any] = dict(
    paths="",          # files: comma-separated paths or globs (.txt / .jsonl);
                       # array_record: the folder of prepared shards
    text_key="text",   # files: the text field of .jsonl records; tfds: the text feature
    tfds_data_dir="",  # a prepared tfds data_dir (local, gs://): tfds reads its dataset
                       # there, the seqio C4 task its tfds data
)
TOKENIZERS = ("sentencepiece", "byte", "hf")
SENTENCEPIECE_MODELS = ("unigram", "bpe")


def source_module(name: str) -> ModuleType:
    """The module of data.source=`name` (imported on first use)."""
    choice("data.source", name, SOURCES)
    return importlib.import_module(SOURCES[name])


def sections() -> dict[str, ModuleType]:
    """Each source's section name -> its module, in the order of SOURCES (several source names
    may share one module, hence one section). A name two modules claim, or one that is also a
    data-level field, is a bug in the sources and raises ValueError."""
    out: dict[str, ModuleType] = {}
    aliases: set[str] = set()
    for name in SOURCES:
        module = source_module(name)
        section = getattr(module, "SECTION", None)
        if section is None or out.get(section) is module:
            continue
        if section in out or section in SHARED_FIELDS:
            raise ValueError(f"data.{section} is claimed twice ({module.__name__} and "
                             f"{getattr(out.get(section), '__name__', 'SHARED_FIELDS')})")
        flat = getattr(module, "FLAT_ALIASES", {})
        if set(flat) & (aliases | set(SHARED_FIELDS)) or not set(flat.values()) <= set(
                module.FIELDS):
            raise ValueError(f"{module.__name__}.FLAT_ALIASES must name its own FIELDS, under "
                             "names no other source or shared field uses")
        aliases |= set(flat)
        out[section] = module
    return out


def nested_names() -> dict[str, str]:
    """Each flat alias's nested name, both in full: {"data.seqio_task": "data.seqio.task"}."""
    return {f"data.{alias}": f"data.{section}.{field}"
            for section, module in sections().items()
            for alias, field in getattr(module, "FLAT_ALIASES", {}).items()}


def with_sections(data: Mapping[str, Any]) -> ml_collections.ConfigDict:
    """`data` (data-level fields; or a saved run's data section, with its sources' fields under
    the nested names, the flat ones, or both) as a data section: each source's section, its
    defaults under the values `data` gives, and each flat alias one FieldReference with its
    nested field. Two spellings of one field that disagree raise ConfigError."""
    fields = dict(data)
    values: dict[str, dict[str, Any]] = {}
    for section, module in sections().items():
        given = dict(fields.pop(section, None) or {})
        for alias, field in getattr(module, "FLAT_ALIASES", {}).items():
            if alias not in fields:
                continue
            old = fields.pop(alias)
            if given.get(field, old) != old:
                raise ConfigError(f"data.{section}.{field}={given[field]!r} and its old "
                                  f"spelling data.{alias}={old!r} disagree; keep one")
            given[field] = old
        values[section] = {**module.FIELDS, **given}
    out = ml_collections.ConfigDict(fields)
    for section, module in sections().items():
        out[section] = ml_collections.ConfigDict(values[section])
        for alias, field in getattr(module, "FLAT_ALIASES", {}).items():
            out[alias] = out[section].get_ref(field)
    return out


def _old_spelling(message: str) -> str:
    """`message` with the flat name of the first nested field it names, for a user who wrote
    the old spelling."""
    for flat, nested in nested_names().items():
        if f"{nested}=" in message or f"{nested} " in message:
            return f"{message} ({flat} is its old spelling)"
    return message


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
    from gated_attention.core.paths import is_local

    require(is_local(data.cache_dir), f"data.cache_dir={data.cache_dir!r} must be a local "
            "folder (each host's own cache); the workdir and data.paths may be in a bucket")
    if hasattr(module, "check"):
        try:
            module.check(config, cfg)
        except ConfigError as err:
            raise type(err)(_old_spelling(str(err))) from None


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
