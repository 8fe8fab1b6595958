"""The platform a program is compiled for, which need not be the host's.

A TPU program can be compiled on a CPU-only machine (deviceless, through libtpu). Every
choice that depends on the platform (which attention kernel `auto` takes, whether a Pallas
kernel runs in interpret mode, which grouped matmul MoE uses) must follow that target, not
`jax.default_backend()`: otherwise the TPU program silently holds the CPU's choices.
`compiling_for("tpu")` sets the target for the code traced inside it (an override: the
kernel choices also follow the platform a program is lowered for, through
`jax.lax.platform_dependent`, see dispatch.py); `compiling_for("gpu", device_kind="NVIDIA
H200")` also names the GPU, whose row of ops/block_sizes.py the kernels then take.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib.util
import os
import pkgutil
from collections.abc import Callable, Iterator
from typing import Any

import jax

from gated_attention.core.checks import choice
from gated_attention.core.errors import UserError

PLATFORMS = ("cpu", "gpu", "tpu")

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target_platform",
                                                                      default=None)
_KIND: contextvars.ContextVar[str | None] = contextvars.ContextVar("target_device_kind",
                                                                    default=None)
_IN_BRANCH: contextvars.ContextVar[bool] = contextvars.ContextVar("in_platform_branch",
                                                                  default=False)
# The names jax.lax.platform_dependent gives each of these platforms.
LOWERING_NAMES = {"cpu": ("cpu",), "gpu": ("cuda", "rocm"), "tpu": ("tpu",)}


# A process-wide override, for a process that only ever compiles for one platform (a CPU
# test run: one trace per call instead of one per platform). Same values as compiling_for.
ENV_TARGET = "GATED_ATTENTION_TARGET"


def target_platform() -> str:
    """The platform being compiled for: the one set by `compiling_for`, else the host's."""
    return target_override() or jax.default_backend()


def target_override() -> str | None:
    """The platform `compiling_for` (else GATED_ATTENTION_TARGET) set, or None: then the
    lowering platform decides."""
    platform = _TARGET.get() or os.environ.get(ENV_TARGET) or None
    if platform is not None:
        choice(ENV_TARGET, platform, PLATFORMS, UserError)
    return platform


def target_device_kind() -> str | None:
    """The device kind `compiling_for` named (e.g. "NVIDIA H200"), or None."""
    return _KIND.get()


def in_platform_branch() -> bool:
    """True while tracing one platform's branch of `per_platform` (no ordered host callbacks
    may be traced there: jax 0.10 cannot lower a platform choice whose other branch has them)."""
    return _IN_BRANCH.get()


@functools.cache
def lowerable_platforms() -> tuple[str, ...]:
    """The platforms this process can compile a program for: the CPU always, a TPU where
    libtpu is installed, a GPU where a jax CUDA or ROCm plugin is.

    A branch for a platform no installed compiler serves could never be lowered; tracing it
    anyway would only cost time (a CPU-only install traces each kernel choice once).
    """
    found = ["cpu"]
    try:
        import jax_plugins

        plugins = [m.name for m in pkgutil.iter_modules(jax_plugins.__path__)]
    except ImportError:
        plugins = []
    if any(name.startswith(("xla_cuda", "xla_rocm")) for name in plugins):
        found.append("gpu")
    if importlib.util.find_spec("libtpu") is not None or "xla_tpu" in plugins:
        found.append("tpu")
    return tuple(found)


def per_platform(fn: Callable[..., Any], *args: Any,
                 platforms: tuple[str, ...] = PLATFORMS) -> Any:
    """`fn(*args)` for the platform the program is lowered for, whatever the entry point.

    Traced once per platform (cpu, gpu, tpu), each time with that platform as the target, and
    joined by `jax.lax.platform_dependent`: a plain `jax.jit(f).lower(...)` over compile-only
    TPU or GPU devices, or `jax.export` for a platform, keeps that platform's branch. Every
    branch is traced on any host, so each must trace without its platform's hardware. Under
    `compiling_for` (an override) fn is traced once, for that platform. `platforms`: those
    fn can serve; lowering for another is refused by jax, naming the platform. Platforms no
    installed compiler serves (`lowerable_platforms`) get no branch; with one left, fn is
    traced once, for it.
    """
    if target_override() is not None:
        return fn(*args)
    platforms = tuple(p for p in platforms if p in lowerable_platforms()) or platforms
    if len(platforms) == 1:
        with compiling_for(platforms[0]):
            return fn(*args)

    def branch(platform: str) -> Callable[..., Any]:
        def traced(*inner: Any) -> Any:
            token = _IN_BRANCH.set(True)
            try:
                with compiling_for(platform):
                    return fn(*inner)
            finally:
                _IN_BRANCH.reset(token)
        return traced

    traced_once = {platform: branch(platform) for platform in platforms}
    branches = {name: traced_once[platform] for platform in platforms
                for name in LOWERING_NAMES[platform]}
    return jax.lax.platform_dependent(*args, **branches)


@contextlib.contextmanager
def compiling_for(platform: str | None, device_kind: str | None = None) -> Iterator[None]:
    """Trace the enclosed code for `platform` ("cpu", "gpu" or "tpu"); None keeps the host's.

    device_kind: the target device as jax names it ("NVIDIA H200", "TPU v5 lite"), which
    picks its tile sizes; None: the host's device when it is the target, else the platform's
    generic row."""
    if platform is not None:
        choice("platform", platform, PLATFORMS, UserError)
    token, kind_token = _TARGET.set(platform), _KIND.set(device_kind)
    try:
        yield
    finally:
        _KIND.reset(kind_token)
        _TARGET.reset(token)
