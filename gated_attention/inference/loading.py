"""The model and tokenizer to evaluate: a trained run's workdir or a Hugging Face folder.

Every problem is found before anything compiles and reported as one UserError naming the flag
(--workdir, --hf_dir, --dtype): a workdir without a checkpoint, a folder `load_pretrained`
cannot read, a folder without a tokenizer.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

from gated_attention.core.errors import UserError
from gated_attention.evaluation.tokens import TextCodec
from gated_attention.model.transformer import Transformer

DTYPES = ("float32", "bfloat16")
DEFAULT_MAX_LENGTH = 2048  # lm-eval's hf backend when a config names no length


@dataclasses.dataclass
class Loaded:
    model: Transformer
    config: Any
    codec: TextCodec
    max_length: int          # the model's context: HF max_position_embeddings / data.seq_len
    name: str                # what lm-eval's results call the model
    chat_template: str | None


def _checkpoint_steps(workdir: pathlib.Path) -> list[int]:
    folder = workdir / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def _chat_template(folder: pathlib.Path) -> str | None:
    path = folder / "tokenizer_config.json"
    template = json.loads(path.read_text()).get("chat_template") if path.exists() else None
    if template is None and (folder / "chat_template.jinja").exists():
        template = (folder / "chat_template.jinja").read_text()
    return template if isinstance(template, str) else None


def check_source(workdir: str = "", hf_dir: str = "", dtype: str = "float32") -> None:
    """The cheap checks of the model flags (no weights read): run before the tasks load."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype={dtype!r} is not allowed; choose one of {', '.join(DTYPES)}")
    if bool(workdir) == bool(hf_dir):
        raise UserError("give exactly one of --workdir (a training run) and --hf_dir (a Hugging "
                        "Face folder)")
    if workdir:
        root = pathlib.Path(workdir)
        if not (root / "config.json").exists():
            raise UserError(f"--workdir={root} is not a training run (no config.json)")
        if not _checkpoint_steps(root):
            raise UserError(f"--workdir={root} holds no checkpoint (train it first, or pass a "
                            "Hugging Face folder with --hf_dir)")
        return
    from gated_attention import hf

    if not pathlib.Path(hf_dir).is_dir():
        raise UserError(f"--hf_dir={hf_dir} is not a folder")
    try:
        hf.read_hf_config(hf_dir)
    except UserError as err:
        raise UserError(f"--hf_dir={hf_dir}: {err}") from None


def load(workdir: str = "", hf_dir: str = "", dtype: str = "float32") -> Loaded:
    """The model (compute dtype `dtype`) and its tokenizer with lm-eval's conventions."""
    check_source(workdir, hf_dir, dtype)
    return _from_hf(pathlib.Path(hf_dir), dtype) if hf_dir else _from_run(
        pathlib.Path(workdir), dtype)


def _from_run(workdir: pathlib.Path, dtype: str) -> Loaded:
    from gated_attention.config import run_config
    from gated_attention.data.tokenizer import get_tokenizer
    from gated_attention.training import loop

    config = run_config.saved_config(json.loads((workdir / "config.json").read_text()))
    config.model.dtype = dtype
    try:
        tokenizer = get_tokenizer(config.data.tokenizer, config.model.vocab_size,
                                  workdir=str(workdir),
                                  model_path=config.data.get("tokenizer_path", ""))
    except (UserError, FileNotFoundError, OSError) as err:
        raise UserError(f"--workdir={workdir}: its tokenizer cannot be read: {err}") from None
    model, config = loop.load_params(workdir, config)
    codec = TextCodec(tokenizer, add_bos=bool(config.data.get("add_bos", False)))
    return Loaded(model, config, codec, int(config.data.seq_len), str(workdir),
                  _chat_template(workdir))


def _from_hf(folder: pathlib.Path, dtype: str) -> Loaded:
    from gated_attention import hf
    from gated_attention.data.tokenizer import get_tokenizer
    from gated_attention.hf import run_files

    try:
        hf_config = hf.read_hf_config(folder)
        model, config = hf.load_pretrained(folder, dtype=dtype)
        if not run_files.apply(folder, config):
            raise UserError("it holds no tokenizer (tokenizer.json or tokenizer.model beside "
                            "config.json)")
        tokenizer = get_tokenizer(config.data.tokenizer, config.model.vocab_size,
                                  model_path=config.data.get("tokenizer_path", ""))
    except (UserError, FileNotFoundError, OSError, ValueError) as err:
        raise UserError(f"--hf_dir={folder}: {str(err).splitlines()[0]}") from None
    text = hf_config.get("text_config") or hf_config
    length = text.get("max_position_embeddings") or hf_config.get("max_position_embeddings")
    # transformers adds to a tokenizer.json's text only what its post-processor adds (its
    # add_bos_token is not read for these); a SentencePiece folder's BOS follows add_bos_token
    add_bos = bool(config.data.get("add_bos", False)) and config.data.tokenizer != "hf"
    codec = TextCodec(tokenizer, add_bos=add_bos)
    return Loaded(model, config, codec, int(length or DEFAULT_MAX_LENGTH), str(folder),
                  _chat_template(folder))
