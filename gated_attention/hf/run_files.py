"""What travels with a Hugging Face export besides the weights: the tokenizer and every setting
that changes the model's input, so an exported run imports back (or generates with `--hf`)
exactly as it ran.

- The tokenizer: a SentencePiece run's `tokenizer.model` (with a `tokenizer_config.json` naming
  its special pieces, as transformers' slow sentencepiece tokenizers read them), or a
  `tokenizer.json` run's file and its `tokenizer_config.json`. A byte tokenizer has no file.
- `gated_attention.json`: the data settings that shape the input (`data.tokenizer`,
  `data.add_bos`, `data.add_eos`, `data.seq_len`). `tokenizer_config.json` carries
  `add_bos_token` too, for other readers (never `add_eos_token`: a prompt has no EOS).

On import the file wins; without it a folder's tokenizer decides (`tokenizer.model`:
sentencepiece, `tokenizer.json`: hf) and `tokenizer_config.json`'s `add_bos_token` sets
`data.add_bos`.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import ml_collections

from gated_attention.core import paths

SETTINGS_FILE = "gated_attention.json"
SENTENCEPIECE_FILE = "tokenizer.model"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
SPECIAL_TOKENS_MAP = "special_tokens_map.json"
INPUT_FIELDS = ("tokenizer", "add_bos", "add_eos", "seq_len")
FILES = (SETTINGS_FILE, SENTENCEPIECE_FILE, TOKENIZER_JSON, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP)


def _sentencepiece_config(model_file: pathlib.Path, add_bos: bool
                          ) -> tuple[dict[str, Any], dict[str, str]]:
    """(tokenizer_config.json, special_tokens_map.json) naming the model's special pieces.

    add_eos_token stays False: data.add_eos ends training documents, a prompt has no EOS.
    """
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_proto=model_file.read_bytes())
    special = {}
    for role, index in (("bos_token", processor.bos_id()), ("eos_token", processor.eos_id()),
                        ("unk_token", processor.unk_id()), ("pad_token", processor.pad_id())):
        if 0 <= index < processor.vocab_size():
            special[role] = processor.id_to_piece(index)
    config = {"tokenizer_class": "LlamaTokenizer", "add_bos_token": add_bos,
              "add_eos_token": False, "legacy": True, "clean_up_tokenization_spaces": False,
              "model_max_length": None, **special}
    return config, special


def taken(out: pathlib.Path, root: pathlib.Path) -> list[str]:
    """The files an export of `root` would write that `out` already holds."""
    return [name for name in FILES
            if (out / name).exists() and (name == SETTINGS_FILE or (root / name).exists()
                                          or name in (TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP))]


def tokenizer_present(root: pathlib.Path, config: ml_collections.ConfigDict) -> None:
    """FileNotFoundError (one line) when the run's tokenizer file is not in its workdir."""
    kind = config.data.get("tokenizer", "sentencepiece")
    expected = SENTENCEPIECE_FILE if kind == "sentencepiece" else TOKENIZER_JSON
    if kind != "byte" and not (root / expected).exists():
        raise FileNotFoundError(f"{root} holds no {expected} for data.tokenizer={kind!r}; "
                                "the export needs the run's tokenizer")


def write(root: pathlib.Path, config: ml_collections.ConfigDict, out: pathlib.Path
          ) -> list[str]:
    """Copy the run's tokenizer and write its input settings into `out`; the names written."""
    data = config.data
    written = []
    kind = data.get("tokenizer", "sentencepiece")
    settings = {"data": {name: data.get(name) for name in INPUT_FIELDS if name in data}}
    if kind == "sentencepiece" and (root / SENTENCEPIECE_FILE).exists():
        paths.write_atomic(out / SENTENCEPIECE_FILE, (root / SENTENCEPIECE_FILE).read_bytes())
        tok_config, special = _sentencepiece_config(root / SENTENCEPIECE_FILE,
                                                    bool(data.get("add_bos", False)))
        paths.write_atomic(out / TOKENIZER_CONFIG, json.dumps(tok_config, indent=2) + "\n")
        paths.write_atomic(out / SPECIAL_TOKENS_MAP, json.dumps(special, indent=2) + "\n")
        written += [SENTENCEPIECE_FILE, TOKENIZER_CONFIG, SPECIAL_TOKENS_MAP]
    elif kind == "hf" and (root / TOKENIZER_JSON).exists():
        paths.write_atomic(out / TOKENIZER_JSON, (root / TOKENIZER_JSON).read_bytes())
        written.append(TOKENIZER_JSON)
        tok_config = (json.loads((root / TOKENIZER_CONFIG).read_text())
                      if (root / TOKENIZER_CONFIG).exists() else {})
        if data.get("add_bos", False) or "add_bos_token" in tok_config:
            tok_config["add_bos_token"] = bool(data.get("add_bos", False))
        paths.write_atomic(out / TOKENIZER_CONFIG, json.dumps(tok_config, indent=2) + "\n")
        written.append(TOKENIZER_CONFIG)
    else:
        tokenizer_present(root, config)
    paths.write_atomic(out / SETTINGS_FILE, json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return [*written, SETTINGS_FILE]


def input_settings(folder: pathlib.Path) -> dict[str, Any]:
    """The data settings a folder declares: its gated_attention.json, else what its tokenizer
    files imply (an empty dict when it has none)."""
    settings: dict[str, Any] = {}
    if (folder / SENTENCEPIECE_FILE).exists():
        settings.update(tokenizer="sentencepiece", tokenizer_path=SENTENCEPIECE_FILE)
    elif (folder / TOKENIZER_JSON).exists():
        settings.update(tokenizer="hf", tokenizer_path=TOKENIZER_JSON)
    if (folder / TOKENIZER_CONFIG).exists():
        tok_config = json.loads((folder / TOKENIZER_CONFIG).read_text())
        if isinstance(tok_config.get("add_bos_token"), bool):
            settings["add_bos"] = tok_config["add_bos_token"]
    if (folder / SETTINGS_FILE).exists():
        declared = json.loads((folder / SETTINGS_FILE).read_text()).get("data", {})
        unknown = sorted(set(declared) - set(INPUT_FIELDS))
        if unknown:
            raise ValueError(f"{folder / SETTINGS_FILE}: data.{unknown[0]} is not an input "
                             f"setting; allowed: {', '.join(INPUT_FIELDS)}")
        settings.update(declared)
        if declared.get("tokenizer") == "byte":
            settings.pop("tokenizer_path", None)
    return settings


def apply(folder: pathlib.Path, config: ml_collections.ConfigDict) -> bool:
    """Set config.data from the folder's input settings (tokenizer_path: the folder's file);
    False when the folder names no tokenizer at all."""
    settings = input_settings(folder)
    if "tokenizer_path" in settings:
        settings["tokenizer_path"] = str(folder / settings["tokenizer_path"])
    for name, value in settings.items():
        config.data[name] = value
    return "tokenizer" in settings


def tokenizer_files(folder: pathlib.Path) -> list[str]:
    """The tokenizer files of a folder, to copy into a run's workdir."""
    return [n for n in (SENTENCEPIECE_FILE, TOKENIZER_JSON, TOKENIZER_CONFIG)
            if (folder / n).exists()]
