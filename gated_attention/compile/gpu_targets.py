"""NVIDIA GPU nodes by name (h100-8, h200-8, b200-8, a100-80gb-8) -> XLA:GPU compile targets.

XLA compiles for a GPU it cannot see from a `GpuTargetConfigProto` (the device description the
CUDA runtime would report: compute capability, SMs, shared memory, registers, memory). The
text is written here from each GPU's published figures (NVIDIA's data sheets and CUDA's
per-architecture limits), so a node can be compiled for on any CPU:

    node = parse_accelerator("h200-8", hosts=2)   # 2 nodes of 8 H200s
    node.topology                                  # "1x2x8": slices x hosts x GPUs per host
    node.target_config()                           # the proto text jax's topology call takes

Device memory is what the driver reports for the part (nvidia-smi's memory.total); jax's GPU
allocator takes a fraction of it (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 unless set), which is
the budget a program must fit in.
"""

from __future__ import annotations

import dataclasses
import os
import re

from gated_attention.core.errors import UserError

MiB = 2**20
GiB = 2**30
DEFAULT_MEMORY_FRACTION = 0.75  # jax's GPU allocator default (XLA_PYTHON_CLIENT_MEM_FRACTION)


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU model's figures, as a CUDA runtime would describe it."""

    name: str                  # device kind, as jax.Device.device_kind spells it
    compute_capability: tuple[int, int]
    sms: int                   # streaming multiprocessors
    memory_bytes: int          # device memory the driver reports
    bandwidth_bytes: int       # memory bandwidth, bytes per second (data sheet)
    l2_bytes: int
    clock_ghz: float           # boost clock
    shared_per_sm: int         # shared memory per SM, bytes
    shared_per_block_optin: int  # largest shared memory a kernel may opt in to, bytes
    fp32_per_sm: int           # FP32 lanes per SM


# Hopper (H100 SXM5, H200 SXM) and Blackwell (B200): 228 KiB shared memory per SM, of which a
# block may opt in to 227 KiB; Ampere A100: 164 KiB and 163 KiB.
GPUS: dict[str, GpuSpec] = {
    "a100-80gb": GpuSpec("NVIDIA A100-SXM4-80GB", (8, 0), 108, 81920 * MiB, 2_039 * 10**9,
                         40 * MiB, 1.41, 164 * 1024, 163 * 1024, 64),
    "h100": GpuSpec("NVIDIA H100 80GB HBM3", (9, 0), 132, 81559 * MiB, 3_350 * 10**9,
                    50 * MiB, 1.98, 228 * 1024, 227 * 1024, 128),
    "h200": GpuSpec("NVIDIA H200", (9, 0), 132, 143771 * MiB, 4_800 * 10**9, 50 * MiB, 1.98,
                    228 * 1024, 227 * 1024, 128),
    "b200": GpuSpec("NVIDIA B200", (10, 0), 148, 183359 * MiB, 8_000 * 10**9, 126 * MiB,
                    1.965, 228 * 1024, 227 * 1024, 128),
}
GPUS_PER_HOST = (1, 2, 4, 8)  # 8: HGX / DGX nodes on NVLink; 1-4: smaller cloud shapes
_NAME = re.compile(r"(a100-80gb|h100|h200|b200)-(\d+)")


class GpuAcceleratorError(UserError):
    """A GPU node name this module does not describe."""


def known_accelerators() -> list[str]:
    return [f"{name}-{n}" for name in GPUS for n in GPUS_PER_HOST]


@dataclasses.dataclass(frozen=True)
class GpuNode:
    """`hosts` nodes of `gpus_per_host` GPUs of one kind."""

    accelerator: str
    spec: GpuSpec
    gpus_per_host: int
    hosts: int = 1

    @property
    def chips(self) -> int:
        return self.gpus_per_host * self.hosts

    @property
    def topology(self) -> str:
        """What jax's topology call takes for CUDA: slices x hosts x GPUs per host."""
        return f"1x{self.hosts}x{self.gpus_per_host}"

    @property
    def hbm_bytes(self) -> int:
        return self.spec.memory_bytes

    def memory_budget(self, fraction: float | None = None) -> int:
        """Bytes a program may use per GPU: jax's allocator share of the device memory."""
        return int(self.spec.memory_bytes * (memory_fraction() if fraction is None
                                             else fraction))

    def target_config(self) -> str:
        return target_config_text(self.spec)


def memory_fraction() -> float:
    """jax's GPU allocator share as the run will see it: XLA_PYTHON_CLIENT_MEM_FRACTION or 0.75."""
    raw = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "")
    try:
        value = float(raw) if raw else DEFAULT_MEMORY_FRACTION
    except ValueError:
        raise GpuAcceleratorError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw!r} must be a number "
                                  "in (0, 1]") from None
    if not 0 < value <= 1:
        raise GpuAcceleratorError(f"XLA_PYTHON_CLIENT_MEM_FRACTION={raw!r} must be in (0, 1]")
    return value


def is_gpu_accelerator(name: str) -> bool:
    return bool(_NAME.fullmatch(name.strip()))


def parse_accelerator(name: str, hosts: int = 1) -> GpuNode:
    """"h200-8" (one node of 8 H200s), with `hosts` such nodes."""
    match = _NAME.fullmatch(name.strip())
    if not match or int(match.group(2)) not in GPUS_PER_HOST:
        raise GpuAcceleratorError(f"accelerator {name!r} is not a GPU node this project "
                                  f"describes; known: {', '.join(known_accelerators())}")
    if not isinstance(hosts, int) or hosts < 1:
        raise GpuAcceleratorError(f"--hosts={hosts!r} must be a positive number of nodes")
    return GpuNode(f"{match.group(1)}-{match.group(2)}", GPUS[match.group(1)],
                   int(match.group(2)), hosts)


def target_config_text(spec: GpuSpec) -> str:
    """XLA's GpuTargetConfigProto (text format) for `spec`: the fields XLA:GPU compiles with.

    Limits common to every CUDA GPU since Volta: 1,024 threads and 64 Ki registers per block,
    2,048 threads and 64 Ki registers per SM, warps of 32, a 48 KiB default shared memory per
    block, grids of 2^31-1 x 65,535 x 65,535 blocks. The cuDNN version is the one the CUDA 12
    wheels ship (9.x); deviceless XLA builds no cuDNN graph, so it only names the API level.
    """
    major, minor = spec.compute_capability
    info = {
        "threads_per_block_limit": 1024,
        "threads_per_warp": 32,
        "shared_memory_per_block": 48 * 1024,
        "shared_memory_per_core": spec.shared_per_sm,
        "threads_per_core_limit": 2048,
        "core_count": spec.sms,
        "fpus_per_core": spec.fp32_per_sm,
        "block_dim_limit_x": 2**31 - 1,
        "block_dim_limit_y": 65535,
        "block_dim_limit_z": 65535,
        "memory_bandwidth": spec.bandwidth_bytes,
        "l2_cache_size": spec.l2_bytes,
        "clock_rate_ghz": spec.clock_ghz,
        "device_memory_size": spec.memory_bytes,
        "shared_memory_per_block_optin": spec.shared_per_block_optin,
    }
    lines = ["gpu_device_info {", *(f"  {k}: {v}" for k, v in info.items()),
             f"  cuda_compute_capability {{ major: {major} minor: {minor} }}",
             "  registers_per_core_limit: 65536", "  registers_per_block_limit: 65536", "}",
             'platform_name: "CUDA"', "dnn_version_info { major: 9 minor: 8 patch: 0 }",
             f'device_description_str: "{spec.name}"']
    return "\n".join(lines) + "\n"
