"""The platform a program is compiled for, which need not be the host's.

A TPU program can be compiled on a CPU-only machine (deviceless, through libtpu). Every
choice that depends on the platform (which attention kernel `auto` takes, whether a Pallas
kernel runs in interpret mode, which grouped matmul MoE uses) must follow that target, not
`jax.default_backend()`: otherwise the TPU program silently holds the CPU's choices.
`compiling_for("tpu")` sets the target for the code traced inside it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

PLATFORMS = ("cpu", "gpu", "tpu")

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target_platform",
                                                                      default=None)


def target_platform() -> str:
    """The platform being compiled for: the one set by `compiling_for`, else the host's."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str | None) -> Iterator[None]:
    """Trace the enclosed code for `platform` ("cpu", "gpu" or "tpu"); None keeps the host's."""
    if platform is not None and platform not in PLATFORMS:
        raise ValueError(f"platform={platform!r} is not allowed; choose one of "
                         f"{', '.join(PLATFORMS)}")
    token = _TARGET.set(platform)
    try:
        yield
    finally:
        _TARGET.reset(token)
