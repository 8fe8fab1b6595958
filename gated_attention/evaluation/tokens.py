"""Text <-> ids as lm-eval's `hf` backend sees them through transformers, without transformers.

lm-eval's numbers depend on three tokenizer conventions, taken here from the folder's own files:
- `encode(text)` applies the tokenizer's special-token template (a `tokenizer.json`
  post-processor; Qwen3's adds nothing) unless told `add_special_tokens=False`, and nothing
  else: transformers 5 reads no `add_bos_token` for such a folder. A SentencePiece folder
  with `add_bos_token` (transformers' LlamaTokenizer), and a run of ours trained with
  `data.add_bos` (`--workdir`), start their inputs with BOS, as the training documents did.
- The prefix token of empty contexts and rolling windows is BOS when the tokenizer declares one
  (transformers reads `bos_token` from tokenizer_config.json / special_tokens_map.json), else EOS.
- Generated text is decoded without special tokens; `clean_up_tokenization_spaces` as the
  folder's tokenizer_config.json says (transformers' default: off).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any

from gated_attention.data import hf_tokenizer

_CLEANUPS = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


def _declared_bos(folder: pathlib.Path) -> str | None:
    """The BOS text transformers would load for the folder (None: the tokenizer has none)."""
    for name in (hf_tokenizer.TOKENIZER_CONFIG_JSON, "special_tokens_map.json"):
        path = folder / name
        if path.exists():
            found = hf_tokenizer._token_name(json.loads(path.read_text()).get("bos_token"))
            if found:
                return found
    return None


class TextCodec:
    """A run's tokenizer (byte, SentencePiece or tokenizer.json) with lm-eval's conventions."""

    def __init__(self, tokenizer: Any, *, add_bos: bool = False):
        self.tokenizer = tokenizer
        self.add_bos = add_bos
        self.eos_id = int(tokenizer.eos_id)
        self.is_hf = isinstance(tokenizer, hf_tokenizer.HFTokenizer)
        self.cleanup = False
        bos_id: int | None = int(tokenizer.bos_id)
        if self.is_hf:
            folder = pathlib.Path(str(tokenizer.model_file)).parent
            bos_text = _declared_bos(folder)
            bos_id = tokenizer.processor.token_to_id(bos_text) if bos_text else None
            config = json.loads(tokenizer.config_text) if tokenizer.config_text else {}
            self.cleanup = bool(config.get("clean_up_tokenization_spaces", False))
        self.bos_id = bos_id
        self.prefix_id = bos_id if bos_id is not None else self.eos_id
        self.special_ids = {self.eos_id, int(tokenizer.pad_id), int(tokenizer.bos_id)}

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.is_hf:
            ids = list(self.tokenizer.processor.encode(
                text, add_special_tokens=add_special_tokens).ids)
        else:
            ids = [int(i) for i in self.tokenizer.encode([text])[0]]
        if add_special_tokens and self.add_bos and (not ids or ids[0] != self.tokenizer.bos_id):
            ids = [int(self.tokenizer.bos_id), *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        ids = [int(i) for i in ids]
        if self.is_hf:
            text = self.tokenizer.processor.decode(ids, skip_special_tokens=skip_special_tokens)
            if self.cleanup:
                for before, after in _CLEANUPS:
                    text = text.replace(before, after)
            return text
        if skip_special_tokens:
            ids = [i for i in ids if i not in self.special_ids]
        return self.tokenizer.decode(ids)

    def text_of(self, token_id: int) -> str:
        """One token's text with special tokens kept (how lm-eval spells EOS as a stop)."""
        return self.decode([token_id], skip_special_tokens=False)
