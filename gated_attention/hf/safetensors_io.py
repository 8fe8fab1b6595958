"""Read and write Hugging Face weight files with the `safetensors` package (numpy, no torch).

A folder holds `model.safetensors`, or shards listed in `model.safetensors.index.json`
(`{"weight_map": {tensor name: shard file}}`). bfloat16 tensors come back as numpy arrays of
ml_dtypes' bfloat16, so nothing is rounded on the way in or out.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from gated_attention.config.run_config import ConfigError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_BYTES = 5 * 1024**3  # transformers' default shard size


def weight_files(folder: pathlib.Path) -> list[pathlib.Path]:
    """The safetensors files of a folder, or a one-line error naming what is missing."""
    index = folder / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as err:
            raise ConfigError(f"{index}: not a safetensors index (needs a 'weight_map' of "
                              f"tensor name -> file): {err}") from None
        files = [folder / name for name in sorted(set(weight_map.values()))]
        missing = [f for f in files if not f.exists()]
        if missing:
            raise ConfigError(f"{index} lists {missing[0].name}, which is not in {folder}")
        return files
    if (folder / SINGLE_FILE).exists():
        return [folder / SINGLE_FILE]
    raise ConfigError(f"{folder} holds neither {SINGLE_FILE} nor {INDEX_FILE}")


def read_tensors(folder: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Every tensor of the folder's safetensors file(s), by name, in its stored dtype."""
    from safetensors.numpy import load_file

    tensors: dict[str, np.ndarray] = {}
    for file in weight_files(pathlib.Path(folder)):
        try:
            loaded = load_file(str(file))
        except Exception as err:  # safetensors raises its own error types
            raise ConfigError(f"{file}: not a readable safetensors file ({err})") from None
        for name, value in loaded.items():
            if name in tensors:
                raise ConfigError(f"{file}: tensor {name} appears in two files")
            tensors[name] = value
    return tensors


def _usual_mode(path: pathlib.Path) -> None:
    """The mode open() would give a new file (0666 less the umask): safetensors writes 0600."""
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


def write_tensors(folder: str | os.PathLike[str], tensors: dict[str, np.ndarray], *,
                  max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> list[str]:
    """Write tensors as one file, or as shards plus an index past `max_shard_bytes`."""
    from safetensors.numpy import save_file

    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        if shards[-1] and size + array.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = array
        size += array.nbytes
    metadata = {"format": "pt"}  # what transformers expects of a safetensors checkpoint
    if len(shards) == 1:
        save_file(shards[0], str(folder / SINGLE_FILE), metadata=metadata)
        _usual_mode(folder / SINGLE_FILE)
        return [SINGLE_FILE]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for name, shard in zip(names, shards):
        save_file(shard, str(folder / name), metadata=metadata)
        _usual_mode(folder / name)
        weight_map.update({tensor: name for tensor in shard})
    total = sum(a.nbytes for a in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return [*names, INDEX_FILE]
