"""The platform choice every entry point makes first, before jax starts.

A library import changes nothing; the commands call `keep_libtpu_out_of_cpu_runs()` first.
"""

import glob
import importlib.util
import os
import sys

# PCI vendor ids of the accelerators jax can drive: Google (TPU), NVIDIA, AMD.
_TPU_VENDOR = "0x1ae0"
_GPU_VENDORS = ("0x10de", "0x1002")


def _pci_devices() -> list[tuple[str, str]]:
    """(vendor, class) of every PCI device the machine shows (none outside Linux)."""
    found = []
    for folder in glob.glob("/sys/bus/pci/devices/*"):
        try:
            with open(f"{folder}/vendor") as vendor, open(f"{folder}/class") as kind:
                found.append((vendor.read().strip(), kind.read().strip()))
        except OSError:
            continue
    return found


def keep_libtpu_out_of_cpu_runs() -> bool:
    """On a machine with no accelerator, run jax on the CPU backend alone (JAX_PLATFORMS=cpu).

    With libtpu installed (`make test` installs it, to compile for TPU targets without a TPU),
    jax tries the TPU backend first on every start: libtpu then prints "Failed to find host
    bounds", "unexpected worker hostname" and a source trace before jax falls back to the CPU,
    so every CPU run looks like it errors. Nothing changes where JAX_PLATFORMS is set, a TPU or
    GPU is attached, or libtpu is absent; compiling for TPU or GPU targets (pre-flight) works on
    the CPU backend. Returns whether the backend was chosen here.
    """
    if "JAX_PLATFORMS" in os.environ or not sys.platform.startswith("linux"):
        return False
    if importlib.util.find_spec("libtpu") is None:
        return False
    for vendor, kind in _pci_devices():
        if vendor == _TPU_VENDOR or (vendor in _GPU_VENDORS and kind.startswith("0x03")):
            return False
    os.environ["JAX_PLATFORMS"] = "cpu"  # read by jax at import; children inherit it
    jax = sys.modules.get("jax")
    if jax is not None:  # imported before this package (a notebook): set it if still possible
        from jax._src import xla_bridge

        if not xla_bridge.backends_are_initialized():
            jax.config.update("jax_platforms", "cpu")
    return True


