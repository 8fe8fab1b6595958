"""Cheap XLA:CPU compiles, for programs compiled often and run briefly.

The kernels' interpret-mode checks (ops/testing.py) compile large programs to run them once,
and some test helpers start processes that compile many small ones: there, compiling costs
more than running. (A training is the opposite: its step runs many times, so the suite runs
trainings with XLA's defaults.) Three XLA settings cut that cost and keep the numerics
contract (float32 and float64 as asked, no fast-math): optimisation level 0, LLVM without its
expensive passes, and the legacy elemental code generator instead of XLA:CPU's newer MLIR
fusion emitters (those compile a 1-layer train step in 5.3 s, the legacy generator in 2.9 s).
The last flag is offered only by jaxlib releases that still carry the legacy generator, and
XLA aborts on a flag it does not know, so it is set only where this jaxlib names it.

Two forms: XLA_FLAGS text, for a process before it imports jax (one a test starts), and
per-compile options (`jit(...).lower(...).compile(options)`).
No jax import here: this runs before jax's.
"""

from __future__ import annotations

import functools
import importlib.util
import mmap
from pathlib import Path

LEGACY_EMITTER_FLAG = "xla_cpu_use_fusion_emitters"


@functools.cache
def jaxlib_knows(flag: str) -> bool:
    """Whether the installed jaxlib's XLA defines `flag` (its name is in jaxlib's libraries;
    a scan of the mapped files takes some 20 ms)."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return False
    needle = flag.encode()
    for folder in spec.submodule_search_locations:
        for library in Path(folder).glob("*.so"):
            with open(library, "rb") as file:
                if library.stat().st_size == 0:
                    continue
                with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                    if mapped.find(needle) >= 0:
                        return True
    return False


def fusion_emitters(on: bool) -> dict[str, bool]:
    """The per-compile option choosing XLA:CPU's MLIR fusion emitters (on: XLA's default) or
    its legacy generator; empty where this jaxlib has no such choice."""
    return {LEGACY_EMITTER_FLAG: on} if jaxlib_knows(LEGACY_EMITTER_FLAG) else {}


def options() -> dict[str, int | bool]:
    """The cheap settings as per-compile options."""
    return {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True,
            **fusion_emitters(False)}


def xla_flags(host_devices: int | None = None) -> str:
    """The cheap settings as XLA_FLAGS text, with `host_devices` fake CPU devices if given."""
    flags = [f"--{name}={str(value).lower()}" for name, value in options().items()]
    if host_devices is not None:
        flags.insert(0, f"--xla_force_host_platform_device_count={host_devices}")
    return " ".join(flags)
