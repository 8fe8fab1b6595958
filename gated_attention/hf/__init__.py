"""Hugging Face checkpoints in and out: the paper's released models, Qwen3, Qwen3-MoE, and the
Qwen3-Next family (Qwen3-Next, Qwen3.5, Qwen3.5-MoE, the multimodal Qwen3.5 folders' text model)
whose layers are all full attention. hf/layouts.py names the layouts.

    model, config = load_pretrained("path/to/hf_folder")   # config.json + safetensors
    logits, aux = model(input_ids)
    save_pretrained(model, config, "path/to/out")          # loadable by the official code
    save_pretrained(model, config, "path/to/out", layout="qwen3_next")  # or qwen3_5, ...

No torch, no transformers: `safetensors` reads and writes the weights (hf/safetensors_io.py),
hf/config_map.py maps config.json, hf/tensor_map.py maps the tensors (the gate rows packed
into q_proj included). Errors are one line naming the file and the field.
"""

from __future__ import annotations

import json
import os
import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from gated_attention.config import run_config
from gated_attention.config.run_config import ConfigError
from gated_attention.hf import config_map, layouts, safetensors_io, tensor_map
from gated_attention.model.transformer import Transformer

CONFIG_FILE = "config.json"
TOKENIZER_FILE = "tokenizer.json"

__all__ = ["load_pretrained", "save_pretrained", "read_hf_config", "model_from_params",
           "flat_params", "ConfigError"]


def read_hf_config(folder: str | os.PathLike[str]) -> dict[str, Any]:
    path = pathlib.Path(folder) / CONFIG_FILE
    if not path.exists():
        raise ConfigError(f"{path} not found: a Hugging Face model folder needs {CONFIG_FILE}")
    try:
        hf = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return hf


def _key(path: tuple[Any, ...]) -> str:
    return ".".join(str(p) for p in path)


def model_from_params(cfg: Any, params: dict[str, np.ndarray]) -> Transformer:
    """A Transformer whose parameters are `params` (dotted paths), built without random init."""
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
    graphdef, state = nnx.split(abstract)
    flat = nnx.to_flat_state(state)
    wanted = {_key(path) for path, _ in flat}
    missing, extra = sorted(wanted - set(params)), sorted(set(params) - wanted)
    if missing or extra:
        raise ConfigError(f"parameters do not match the model: missing {missing[:3]}, "
                          f"unexpected {extra[:3]}")
    for path, variable in flat:
        value = params[_key(path)]
        if tuple(value.shape) != tuple(variable.get_value().shape):
            raise ConfigError(f"parameter {_key(path)} has shape {value.shape}, the model "
                              f"needs {variable.get_value().shape}")
        variable.set_value(jnp.asarray(value, jnp.float32))
    return nnx.merge(graphdef, nnx.from_flat_state(flat))


def flat_params(model: Transformer) -> dict[str, np.ndarray]:
    """The model's parameters as numpy arrays by dotted path (host copies)."""
    state = nnx.state(model, nnx.Param)
    return {_key(path): np.asarray(jax.device_get(v.get_value()))
            for path, v in nnx.to_flat_state(state)}


def load_pretrained(path: str | os.PathLike[str], dtype: str = "float32"
                    ) -> tuple[Transformer, ml_collections.ConfigDict]:
    """(model, run config) of a Hugging Face folder in any layout of hf/layouts.py (Qwen3,
    Qwen3-MoE, the gated release, the all-full-attention Qwen3-Next family).

    `dtype` is the compute dtype (model.dtype); weights are held in float32 as in training.
    The run config keeps the original config.json as `config.hf_config` for export.
    """
    folder = pathlib.Path(path)
    hf = read_hf_config(folder)
    where = str(folder / CONFIG_FILE)
    if dtype not in tensor_map.DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not allowed; choose one of "
                          f"{', '.join(tensor_map.DTYPES)}")
    config = config_map.to_run_config(hf, dtype=dtype, where=where)
    cfg = run_config.model_config(config)
    layout, _ = config_map.detect(hf, where)
    files = safetensors_io.weight_files(folder)
    tensors = text_tensors(safetensors_io.read_tensors(folder))
    tensor_map.check_tensors(tensors, cfg, ", ".join(str(f) for f in files),
                             layouts.LAYOUTS[layout])
    return (model_from_params(cfg, tensor_map.to_params(tensors, cfg, layouts.LAYOUTS[layout])),
            config)


def text_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A multimodal folder's text model under the causal LM's names (`model.language_model.X`
    -> `model.X`); the vision tower (`model.visual.*`) is left out."""
    if not any(name.startswith(layouts.TEXT_PREFIX) for name in tensors):
        return tensors
    out = {}
    for name, value in tensors.items():
        if name.startswith("model.visual."):
            continue
        if name.startswith(layouts.TEXT_PREFIX):
            name = "model." + name[len(layouts.TEXT_PREFIX):]
        out[name] = value
    return out


def convert_norms(params: dict[str, np.ndarray], zero_centred_from: bool, zero_centred_to: bool
                  ) -> dict[str, np.ndarray]:
    """RMSNorm scales between `x_hat * w` and the zero-centred `x_hat * (1 + w)` (w - 1 or
    w + 1, exact for scales in [0.5, 2]; float32 rounding elsewhere)."""
    if zero_centred_from == zero_centred_to:
        return params
    shift = np.float32(-1.0 if zero_centred_to else 1.0)
    return {name: (value + shift if name.endswith("norm.scale") else value)
            for name, value in params.items()}


def weights_dtype(config: ml_collections.ConfigDict) -> str:
    """The dtype an imported checkpoint stored its weights in (float32 for own runs)."""
    original = json.loads(config.get("hf_config") or "{}")
    name = original.get("torch_dtype") or original.get("dtype") or "float32"
    return name if name in tensor_map.DTYPES else "float32"


def save_pretrained(model: Transformer, config: ml_collections.ConfigDict,
                    path: str | os.PathLike[str], *, dtype: str | None = None,
                    layout: str | None = None,
                    max_shard_bytes: int = safetensors_io.DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write config.json + safetensors in a Hugging Face layout; returns the files written.

    dtype: of the written weights; default: the imported checkpoint's, else float32. layout:
    one of hf/layouts.py's (default: the one the run was imported from, else official); what
    it cannot express is refused in one line. Refuses a folder that already holds a
    config.json or weights (nothing saved is overwritten).
    """
    folder = pathlib.Path(path)
    dtype = dtype or weights_dtype(config)
    cfg = run_config.model_config(config)
    target = layouts.get_layout(layout or config_map.source_layout(config))
    hf = config_map.hf_config(config, dtype=dtype, layout=target.name)
    taken = [n for n in (CONFIG_FILE, safetensors_io.SINGLE_FILE, safetensors_io.INDEX_FILE)
             if (folder / n).exists()]
    if taken:
        raise ConfigError(f"{folder / taken[0]} exists; choose an empty --out folder "
                          "(nothing is overwritten)")
    params = convert_norms(flat_params(model), cfg.zero_centred_norm, target.zero_centred_norm)
    tensors = tensor_map.to_tensors(params, cfg, dtype, target)
    written = safetensors_io.write_tensors(folder, tensors, max_shard_bytes=max_shard_bytes)
    (folder / CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return [CONFIG_FILE, *written]
