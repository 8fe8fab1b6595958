"""A Hugging Face `tokenizer.json` (e.g. the paper's Qwen-style byte-level BPE) through the
`tokenizers` library (no transformers, no torch).

The special ids come from the tokenizer's own definitions, first found wins:
1. a `tokenizer_config.json` beside the file (its `bos_token`, `eos_token`, `pad_token`);
2. the `tokenizer.json` itself: `padding.pad_token`, and the special tokens around `$A` in a
   TemplateProcessing post-processor (before it: BOS, after it: EOS);
3. a special added token with a conventional name (`<s>`, `</s>`, `<|endoftext|>`, ...).
A tokenizer without a BOS starts documents with its EOS (the GPT-2 / Qwen convention); one
without a pad token pads with EOS (padding is masked out of the loss anyway). One without an
EOS is refused. The model's embedding must cover every id of the tokenizer; it may be larger
(the paper pads 151,665 tokens to 151,936, a multiple of 128).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from gated_attention.core import paths
from gated_attention.core.checks import ConfigError

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG_JSON = "tokenizer_config.json"
CONVENTIONAL_NAMES = {
    "bos": ("<s>", "<|begin_of_text|>", "<|startoftext|>", "<bos>", "[BOS]", "<|bos|>"),
    "eos": ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[EOS]", "<|eos|>"),
    "pad": ("<pad>", "[PAD]", "<|pad|>", "<|padding|>"),
}


class HFTokenizerError(ConfigError):
    """The tokenizer file is missing, unreadable or does not fit the model."""


def _token_name(value: Any) -> str | None:
    """tokenizer_config.json writes a token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _template_specials(post_processor: dict[str, Any] | None) -> dict[str, str]:
    """BOS / EOS named by a TemplateProcessing (possibly inside a Sequence) around `$A`."""
    if not post_processor:
        return {}
    if post_processor.get("type") == "Sequence":
        found: dict[str, str] = {}
        for inner in post_processor.get("processors", []):
            found = {**_template_specials(inner), **found}
        return found
    if post_processor.get("type") != "TemplateProcessing":
        return {}
    pieces = post_processor.get("single", [])
    where = [i for i, p in enumerate(pieces) if "Sequence" in p]
    if not where:
        return {}
    specials = {}
    before = [p["SpecialToken"]["id"] for p in pieces[:where[0]] if "SpecialToken" in p]
    after = [p["SpecialToken"]["id"] for p in pieces[where[-1] + 1:] if "SpecialToken" in p]
    if before:
        specials["bos"] = before[-1]
    if after:
        specials["eos"] = after[0]
    return specials


def special_token_names(definition: dict[str, Any], config: dict[str, Any] | None
                        ) -> dict[str, str]:
    """{"bos"|"eos"|"pad": token text} from the tokenizer's own definitions (module doc)."""
    names: dict[str, str] = {}
    for role in ("bos", "eos", "pad"):
        name = _token_name((config or {}).get(f"{role}_token"))
        if name:
            names[role] = name
    padding = definition.get("padding") or {}
    if "pad" not in names and _token_name(padding.get("pad_token")):
        names["pad"] = padding["pad_token"]
    for role, name in _template_specials(definition.get("post_processor")).items():
        names.setdefault(role, name)
    added = {t["content"] for t in definition.get("added_tokens", []) if t.get("special")}
    for role, candidates in CONVENTIONAL_NAMES.items():
        if role not in names:
            found = [c for c in candidates if c in added]
            if found:
                names[role] = found[0]
    return names


class HFTokenizer:
    """Encode / decode with a `tokenizer.json`; no special tokens are added by encode (the
    pipeline adds BOS and EOS itself, per data.add_bos / data.add_eos)."""

    def __init__(self, model_file: str | os.PathLike[str], config_file: str | None = None):
        from tokenizers import Tokenizer as RustTokenizer

        self.model_file = paths.resolve(model_file)
        if not self.model_file.exists():
            raise HFTokenizerError(f"data.tokenizer_path={str(model_file)!r} does not exist "
                                   "(data.tokenizer='hf' needs a tokenizer.json)")
        text = self.model_file.read_text("utf-8")
        try:
            definition = json.loads(text)
            self.processor = RustTokenizer.from_str(text)
        except Exception as err:  # noqa: BLE001 - the library raises bare Exceptions
            raise HFTokenizerError(f"data.tokenizer_path={str(model_file)!r} is not a "
                                   f"tokenizer.json the tokenizers library reads: "
                                   f"{str(err).splitlines()[0] if str(err) else err!r}"
                                   ) from None
        # Documents are encoded whole: the file's batch padding and truncation would add
        # pad ids to, or cut, every document of a batch.
        self.processor.no_padding()
        self.processor.no_truncation()
        config_path = (paths.resolve(config_file) if config_file
                       else self.model_file.parent / TOKENIZER_CONFIG_JSON)
        self.config_text = config_path.read_text("utf-8") if config_path.exists() else ""
        names = special_token_names(definition,
                                    json.loads(self.config_text) if self.config_text else None)
        if "eos" not in names:
            raise HFTokenizerError(
                f"data.tokenizer_path={str(model_file)!r} defines no EOS token (looked in "
                f"{TOKENIZER_CONFIG_JSON}, the post-processor template and the special tokens "
                f"named {', '.join(CONVENTIONAL_NAMES['eos'])})")
        ids = {role: self.processor.token_to_id(name) for role, name in names.items()}
        missing = [f"{role}={names[role]!r}" for role, i in ids.items() if i is None]
        if missing:
            raise HFTokenizerError(f"data.tokenizer_path={str(model_file)!r} names special "
                                   f"tokens that are not in its vocabulary: {', '.join(missing)}")
        self.special_tokens = {role: names[role] for role in ids}
        self.eos_id = int(ids["eos"])
        self.bos_id = int(ids.get("bos", self.eos_id))
        self.pad_id = int(ids.get("pad", self.eos_id))
        # Every id the tokenizer can emit: the base vocabulary and its added tokens.
        all_ids = [*self.processor.get_vocab(with_added_tokens=True).values()]
        self.vocab_size = max(all_ids) + 1
        self.fingerprint = hashlib.sha256(
            f"{text}|{self.bos_id},{self.eos_id},{self.pad_id}".encode()).hexdigest()[:16]

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        # encode_batch_fast (tokenizers >= 0.20) skips the character offsets we never read.
        encode = getattr(self.processor, "encode_batch_fast", self.processor.encode_batch)
        encodings = encode(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self.processor.decode([int(i) for i in ids], skip_special_tokens=False)


def check_vocab(tokenizer: HFTokenizer, vocab_size: int) -> None:
    """The model's embedding must have a row for every id the tokenizer can emit."""
    if vocab_size < tokenizer.vocab_size:
        padded = -(-tokenizer.vocab_size // 128) * 128
        raise HFTokenizerError(
            f"model.vocab_size={vocab_size} is smaller than the tokenizer's "
            f"{tokenizer.vocab_size} ids (data.tokenizer_path={str(tokenizer.model_file)!r}); "
            f"set model.vocab_size >= {tokenizer.vocab_size}, e.g. {padded} (a multiple of 128)")


def load(model_path: str, vocab_size: int, *,
         workdir: str | os.PathLike[str] | None = None) -> HFTokenizer:
    """The run's tokenizer: the workdir's copy (authoritative on resume), else `model_path`,
    which is then copied into the workdir (with its tokenizer_config.json, if any)."""
    in_workdir = paths.resolve(workdir) / TOKENIZER_JSON if workdir else None
    if in_workdir is not None and in_workdir.exists():
        tokenizer = HFTokenizer(in_workdir)
    else:
        if not model_path:
            raise HFTokenizerError("data.tokenizer='hf' needs data.tokenizer_path (a "
                                   "tokenizer.json file)")
        tokenizer = HFTokenizer(model_path)
        check_vocab(tokenizer, vocab_size)  # before anything is written to the workdir
        if in_workdir is not None:
            if tokenizer.config_text:
                paths.write_atomic(in_workdir.parent / TOKENIZER_CONFIG_JSON,
                                   tokenizer.config_text)
            paths.write_atomic(in_workdir, tokenizer.model_file.read_text("utf-8"))
    check_vocab(tokenizer, vocab_size)
    return tokenizer
