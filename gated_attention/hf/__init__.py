"""Hugging Face checkpoints: the paper's released models, Qwen3 and Qwen3-MoE, in and out.

    model, config = load_pretrained("path/to/hf_folder")   # config.json + safetensors
    logits, aux = model(input_ids)
    save_pretrained(model, config, "path/to/out")          # loadable by the official code

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

from gated_attention import config_lib
from gated_attention.config_lib import ConfigError
from gated_attention.hf import config_map, safetensors_io, tensor_map
from gated_attention.model import Transformer

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
    """(model, run config) of a Hugging Face Qwen3 / Qwen3-MoE / gated-release folder.

    `dtype` is the compute dtype (model.dtype); weights are held in float32 as in training.
    The run config keeps the original config.json as `config.hf_config` for export.
    """
    folder = pathlib.Path(path)
    hf = read_hf_config(folder)
    where = str(folder / CONFIG_FILE)
    if dtype not in tensor_map.DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not allowed; choose one of "
                          f"{', '.join(tensor_map.DTYPES)}")
    config = config_map.run_config(hf, dtype=dtype, where=where)
    cfg = config_lib.model_config(config)
    files = safetensors_io.weight_files(folder)
    tensors = safetensors_io.read_tensors(folder)
    tensor_map.check_tensors(tensors, cfg, ", ".join(str(f) for f in files))
    return model_from_params(cfg, tensor_map.to_params(tensors, cfg)), config


def weights_dtype(config: ml_collections.ConfigDict) -> str:
    """The dtype an imported checkpoint stored its weights in (float32 for own runs)."""
    original = json.loads(config.get("hf_config") or "{}")
    name = original.get("torch_dtype") or original.get("dtype") or "float32"
    return name if name in tensor_map.DTYPES else "float32"


def save_pretrained(model: Transformer, config: ml_collections.ConfigDict,
                    path: str | os.PathLike[str], *, dtype: str | None = None,
                    max_shard_bytes: int = safetensors_io.DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write config.json + safetensors in the Hugging Face layout; returns the files written.

    dtype: of the written weights; default: the imported checkpoint's, else float32. Refuses
    a folder that already holds a config.json or weights (nothing saved is overwritten).
    """
    folder = pathlib.Path(path)
    dtype = dtype or weights_dtype(config)
    cfg = config_lib.model_config(config)
    hf = config_map.hf_config(config, dtype=dtype)
    taken = [n for n in (CONFIG_FILE, safetensors_io.SINGLE_FILE, safetensors_io.INDEX_FILE)
             if (folder / n).exists()]
    if taken:
        raise ConfigError(f"{folder / taken[0]} exists; choose an empty --out folder "
                          "(nothing is overwritten)")
    tensors = tensor_map.to_tensors(flat_params(model), cfg, dtype)
    written = safetensors_io.write_tensors(folder, tensors, max_shard_bytes=max_shard_bytes)
    (folder / CONFIG_FILE).write_text(json.dumps(hf, indent=2, sort_keys=True) + "\n")
    return [CONFIG_FILE, *written]
