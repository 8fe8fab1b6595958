"""Cloud TPU accelerator names (as gcloud spells them) -> chips, topology, HBM and VM image.

`v5p-64` names 64 TensorCores (32 chips, topology `v5p:2x4x4`); `v5litepod-16` and `v6e-16`
name chips (`v5e:4x4`, `v6e:4x4`). The topology string is what libtpu's deviceless
`get_topology_desc` takes, so a program can be compiled for the slice on any CPU.

v4 and v5p slices of 64 chips and more are built from 4x4x4 cubes, in steps of one cube
(v4-384 = 4x4x12, v5p-12288 = 16x16x24): `cube_layout` picks the shape Google's tables give
(the published v5p table and the per-type tables of Google's MaxText / xpk agree with it).

Runtime images (the TPU VM software version per generation) follow Google's Cloud TPU
documentation page "TPU software versions" (the versions it lists for JAX and PyTorch).
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys

from gated_attention.core.errors import UserError

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
    megacore: bool = False    # one JAX device per chip (v4, v5p) rather than one per core


CUBE_SIDE = 4        # chips along each side of a v4 / v5p cube (64 chips)
MAX_CUBES_ALONG = 64  # no published shape is longer than this many cubes along one axis


def cube_layout(cubes: int) -> tuple[int, int, int] | None:
    """Chips along each axis of a slice of `cubes` 4x4x4 cubes: of the ways to stack them, the
    one with the shortest longest side, then the longest shortest side (12 cubes -> 8x8x12,
    72 -> 12x16x24, 96 -> 16x16x24); None where every way is longer than any published shape
    (67 cubes, a prime, would be 4x4x268)."""
    best: tuple[tuple[int, int], tuple[int, int, int]] | None = None
    for a in range(1, cubes + 1):
        for b in range(a, cubes // a + 1):
            c, rest = divmod(cubes, a * b)
            if rest or c < b:
                continue
            key = (c, -a)
            if best is None or key < best[0]:
                best = (key, (a, b, c))
    if best is None or best[1][2] > MAX_CUBES_ALONG:
        return None
    a, b, c = best[1]
    return (a * CUBE_SIDE, b * CUBE_SIDE, c * CUBE_SIDE)


def _cube_counts(max_cubes: int) -> tuple[int, ...]:
    """4, 8, 16 and 32 chips (one to eight hosts), then every whole number of cubes."""
    return (4, 8, 16, 32) + tuple(64 * k for k in range(1, max_cubes + 1) if cube_layout(k))


# v2 and v3 expose both TensorCores of a chip as devices (8 per 4-chip host); the HBM figure
# is per chip. Pod sizes: v2 256 chips, v3 1024, v4 4096 (64 cubes), v5p single slices up to
# 6144 chips (96 cubes, Google's "TPU v5p" page).
GENERATIONS: dict[str, Generation] = {
    "v4": Generation("v4", "v4", 2, 3, 32 * GiB, "tpu-ubuntu2204-base", _cube_counts(64),
                     megacore=True),
    "v5e": Generation("v5e", "v5litepod", 1, 2, 16 * GiB, "v2-alpha-tpuv5-lite",
                      (1, 4, 8, 16, 32, 64, 128, 256)),
    "v5p": Generation("v5p", "v5p", 2, 3, 95 * GiB, "v2-alpha-tpuv5", _cube_counts(96),
                      megacore=True),
    "v6e": Generation("v6e", "v6e", 1, 2, 32 * GiB, "v2-alpha-tpuv6e",
                      (1, 4, 8, 16, 32, 64, 128, 256)),
    # TPU7x (Ironwood, GKE only): 2 TensorCores per chip, each its own device; 192 GiB HBM.
    "tpu7x": Generation("tpu7x", "tpu7x", 2, 3, 192 * GiB, "", _cube_counts(96)),
    "v3": Generation("v3", "v3", 2, 2, 32 * GiB, "tpu-ubuntu2204-base",
                     (4, 16, 32, 64, 128, 256, 512, 1024)),
    "v2": Generation("v2", "v2", 2, 2, 16 * GiB, "tpu-ubuntu2204-base",
                     (4, 16, 32, 64, 128, 256)),
}
_ALIASES = {"v5litepod": "v5e", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e", "v4": "v4",
            "v3": "v3", "v2": "v2", "tpu7x": "tpu7x"}


class AcceleratorError(UserError):
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

    @property
    def hosts(self) -> int:
        """TPU VMs (workers) of the slice: 4 chips per host; v5e and v6e slices of up to 8
        chips are one 8-chip host."""
        single = 8 if self.generation.name in ("v5e", "v6e") else 4
        return 1 if self.chips <= single else self.chips // 4


def torus_layout(chips: int, dims: int) -> tuple[int, ...]:
    """Google's slice shapes: start from one host's 2x2(x1) block, double the shortest axis
    (the last of equals): 8 -> 2x4 / 2x2x2, 32 -> 4x8 / 2x4x4, 64 -> 8x8 / 4x4x4; 3-D slices
    of whole cubes follow `cube_layout` (192 chips -> 4x4x12)."""
    if chips == 1:
        return (1,) * dims
    if dims == 3 and chips >= 64 and chips % 64 == 0:
        layout = cube_layout(chips // 64)
        if layout is None:
            raise AcceleratorError(f"{chips} chips make no published 3-D slice shape")
        return layout
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


def _known_summary() -> str:
    """The accepted names, short: v4 and v5p have a size for every whole number of cubes."""
    parts = []
    for g in GENERATIONS.values():
        names = [f"{g.gcloud_prefix}-{c * g.cores_per_name_unit}" for c in g.chip_counts]
        if len(names) > 8:
            step = 64 * g.cores_per_name_unit
            names = names[:6] + [f"... (every {step} that stacks whole 4x4x4 cubes) ...",
                                 names[-1]]
        parts.extend(names)
    return ", ".join(parts)


def parse_accelerator(name: str) -> TpuSlice:
    """`v5p-64` -> TpuSlice(chips=32, topology "v5p:2x4x4"); also `v5e-16` for `v5litepod-16`."""
    match = re.fullmatch(r"(v2|v3|v4|v5litepod|v5e|v5p|v6e|tpu7x)-(\d+)", name.strip())
    generation = GENERATIONS[_ALIASES[match.group(1)]] if match else None
    units = int(match.group(2)) if match else 0
    chips, remainder = divmod(units, generation.cores_per_name_unit) if generation else (0, 1)
    if generation is None or remainder or chips not in generation.chip_counts:
        raise AcceleratorError(
            f"accelerator {name!r} is not a Cloud TPU type this project maps to a topology; "
            f"known: {_known_summary()}")
    return TpuSlice(f"{generation.gcloud_prefix}-{units}", generation, chips,
                    torus_layout(chips, generation.dims))


def main(argv: list[str]) -> int:
    """`python -m gated_attention.compile.tpu_topologies TYPE`: print TYPE's topology and hosts, or
    say in one line why no topology is known for it (exit 2). tpu_scripts/create.sh asks
    this before creating anything."""
    if len(argv) != 1:
        print("usage: python -m gated_attention.compile.tpu_topologies ACCELERATOR_TYPE",
              file=sys.stderr)
        return 2
    try:
        tpu = parse_accelerator(argv[0])
    except AcceleratorError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{tpu.accelerator} topology={tpu.topology} chips={tpu.chips} hosts={tpu.hosts}")
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main(sys.argv[1:]))
