"""Cloud TPU accelerator names (as gcloud spells them) -> chips, topology, HBM and VM image.

`v5p-64` names 64 TensorCores (32 chips, topology `v5p:2x4x4`); `v5litepod-16` and `v6e-16`
name chips (`v5e:4x4`, `v6e:4x4`). The topology string is what libtpu's deviceless
`get_topology_desc` takes, so a program can be compiled for the slice on any CPU.

Runtime images (the TPU VM software version per generation) follow Google's Cloud TPU
documentation page "TPU software versions" (the versions it lists for JAX and PyTorch).
"""

from __future__ import annotations

import dataclasses
import math
import re

GiB = 1024**3


@dataclasses.dataclass(frozen=True)
class Generation:
    name: str                 # topology prefix libtpu understands: "v5e", "v5p", ...
    gcloud_prefix: str        # accelerator type prefix: "v5litepod", "v5p", ...
    cores_per_name_unit: int  # 2 where the type counts TensorCores (v4, v5p), 1 for chips
    dims: int                 # 2-D torus (v5e, v6e) or 3-D (v4, v5p)
    hbm_bytes: int            # memory per chip
    runtime_version: str      # TPU VM image for JAX
    chip_counts: tuple[int, ...]  # slice sizes (chips) gcloud offers


GENERATIONS: dict[str, Generation] = {
    "v4": Generation("v4", "v4", 2, 3, 32 * GiB, "tpu-ubuntu2204-base",
                     tuple(2**k for k in range(2, 12))),
    "v5e": Generation("v5e", "v5litepod", 1, 2, 16 * GiB, "v2-alpha-tpuv5-lite",
                      (1, 4, 8, 16, 32, 64, 128, 256)),
    "v5p": Generation("v5p", "v5p", 2, 3, 95 * GiB, "v2-alpha-tpuv5",
                      tuple(2**k for k in range(2, 13))),
    "v6e": Generation("v6e", "v6e", 1, 2, 32 * GiB, "v2-alpha-tpuv6e",
                      (1, 4, 8, 16, 32, 64, 128, 256)),
}
_ALIASES = {"v5litepod": "v5e", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v4": "v4"}


class AcceleratorError(ValueError):
    """An accelerator name this module cannot map to a TPU topology."""


@dataclasses.dataclass(frozen=True)
class TpuSlice:
    accelerator: str   # gcloud accelerator type, e.g. "v5p-64"
    generation: Generation
    chips: int
    layout: tuple[int, ...]  # chips along each torus axis

    @property
    def topology(self) -> str:
        """The topology name libtpu compiles for, e.g. "v5p:2x4x4"."""
        return f"{self.generation.name}:{'x'.join(map(str, self.layout))}"

    @property
    def hbm_bytes(self) -> int:
        return self.generation.hbm_bytes

    @property
    def runtime_version(self) -> str:
        return self.generation.runtime_version


def torus_layout(chips: int, dims: int) -> tuple[int, ...]:
    """Google's slice shapes: start from one host's 2x2(x1) block, double the shortest axis
    (the last of equals): 8 -> 2x4 / 2x2x2, 32 -> 4x8 / 2x4x4, 64 -> 8x8 / 4x4x4."""
    if chips == 1:
        return (1,) * dims
    layout = [2, 2] + [1] * (dims - 2)
    while math.prod(layout) < chips:
        shortest = min(layout)
        last = max(i for i, n in enumerate(layout) if n == shortest)
        layout[last] *= 2
    return tuple(layout)


def known_accelerators() -> list[str]:
    """Every accelerator name accepted, smallest slice first per generation."""
    return [f"{g.gcloud_prefix}-{c * g.cores_per_name_unit}"
            for g in GENERATIONS.values() for c in g.chip_counts]


def parse_accelerator(name: str) -> TpuSlice:
    """`v5p-64` -> TpuSlice(chips=32, topology "v5p:2x4x4"); also `v5e-16` for `v5litepod-16`."""
    match = re.fullmatch(r"(v4|v5litepod|v5e|v5p|v6e)-(\d+)", name.strip())
    generation = GENERATIONS[_ALIASES[match.group(1)]] if match else None
    units = int(match.group(2)) if match else 0
    chips, remainder = divmod(units, generation.cores_per_name_unit) if generation else (0, 1)
    if generation is None or remainder or chips not in generation.chip_counts:
        raise AcceleratorError(
            f"accelerator {name!r} is not a Cloud TPU type this project maps to a topology; "
            f"known: {', '.join(known_accelerators())}")
    return TpuSlice(f"{generation.gcloud_prefix}-{units}", generation, chips,
                    torus_layout(chips, generation.dims))
