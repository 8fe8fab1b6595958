"""The CUDA compile pair, loaded only by processes that compile for an NVIDIA GPU target.

Compiling for a GPU on a machine without one needs jax's CUDA plugin (and ptxas). Installed
into the environment's site-packages, that plugin loads at every `import jax` and, with no
GPU driver present, prints "Could not find cuda drivers" lines on every CPU command. So
`make install-test` puts it in its own folder, `<venv>/cuda_compile`, and the processes that
compile for a GPU target (the pre-flight with a GPU `--accelerator`, the test suite) put that
folder on `sys.path` before jax is imported. A machine with a GPU installs jax's CUDA
packages as usual and needs none of this. No jax import here: this runs before jax's.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path

FOLDER_NAME = "cuda_compile"
ENV_FOLDER = "GATED_ATTENTION_CUDA_COMPILE"  # another folder holding the pair, if wanted


def folder() -> Path:
    """Where `make install-test` installs the pair: beside this environment's packages."""
    return Path(os.environ.get(ENV_FOLDER) or Path(sys.prefix) / FOLDER_NAME)


def enable() -> bool:
    """Put the pair's folder on sys.path (before jax's import: jax loads its plugins then);
    True when jax's CUDA plugin is importable afterwards."""
    path = folder()
    if path.is_dir() and str(path) not in sys.path:
        sys.path.append(str(path))
        importlib.invalidate_caches()
    return any(_has_module(f"jax_plugins.xla_cuda{major}") for major in (12, 13))


def _has_module(name: str) -> bool:
    """find_spec of a submodule raises when its namespace package is absent: that means no."""
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def wants_gpu_target(argv: Sequence[str]) -> bool:
    """Whether a pre-flight command line names a GPU node (`--accelerator=h200-8` etc.)."""
    from gated_attention.compile import gpu_targets

    for i, arg in enumerate(argv):
        value = None
        if arg.startswith("--accelerator="):
            value = arg.partition("=")[2]
        elif arg == "--accelerator" and i + 1 < len(argv):
            value = argv[i + 1]
        if value is not None and gpu_targets.is_gpu_accelerator(value):
            return True
    return False
