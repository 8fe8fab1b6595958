"""Block sizes for the Pallas attention kernels: a small table per device kind, overridable.

Keys: block_q / block_kv (forward), block_q_dq / block_kv_dq (dq kernel), block_q_dkv /
block_kv_dkv (dk/dv kernel), num_warps / num_stages (Triton, forward) and num_warps_bwd /
num_stages_bwd (Triton, both backward kernels). A user override such as the model config's
`model.block_sizes = {"block_q": 64, "block_kv": 64}` sets the forward sizes and, unless given
separately, the matching backward ones too (num_warps sets num_warps_bwd the same way).
"""

from __future__ import annotations

import jax

from gated_attention.core.errors import UserError

BLOCK_KEYS = ("block_q", "block_kv", "block_q_dq", "block_kv_dq", "block_q_dkv",
              "block_kv_dkv", "num_warps", "num_stages", "num_warps_bwd", "num_stages_bwd")
# A forward key given alone also sets these backward keys.
FOLLOWS_FORWARD = {"block_q": ("block_q_dq", "block_q_dkv"),
                   "block_kv": ("block_kv_dq", "block_kv_dkv"),
                   "num_warps": ("num_warps_bwd",), "num_stages": ("num_stages_bwd",)}

# Triton on Hopper: 128x64 tiles for d<=128 keep registers in check at 4-8 warps; d=256 halves
# the q tile. Backward kernels use 64x64 (dq and dkv each hold two accumulators).
_GPU = {
    64: dict(block_q=128, block_kv=64, block_q_dq=64, block_kv_dq=64, block_q_dkv=64,
             block_kv_dkv=64, num_warps=4, num_stages=3),
    128: dict(block_q=128, block_kv=64, block_q_dq=64, block_kv_dq=64, block_q_dkv=64,
              block_kv_dkv=64, num_warps=8, num_stages=3),
    256: dict(block_q=64, block_kv=32, block_q_dq=32, block_kv_dq=32, block_q_dkv=32,
              block_kv_dkv=32, num_warps=8, num_stages=2),
}
_GPU = {d: dict(cfg, num_warps_bwd=cfg["num_warps"], num_stages_bwd=cfg["num_stages"])
        for d, cfg in _GPU.items()}
_GPU_SMALL = {  # pre-Hopper (A100 and similar): fewer stages fit in shared memory
    d: dict(cfg, num_stages=2, num_stages_bwd=2) for d, cfg in _GPU.items()
}
# Mosaic TPU: MXU-sized tiles (multiples of 128); larger kv tiles amortise the grid step.
# Backward tiles: benchmarks/tpu_tiles.py (2026-11-30), v5e, v5p and v6e alike, head_dim 64,
# 128 and 256 at B1 S4096 H16 KV8: every 128..512 candidate compiles; 512 x 512 moves the
# fewest HBM bytes (counted off the kernels' grids: 188 / 178 MiB for dq / dk-dv at d128,
# against 318 / 308 MiB for the 256 x 256 tiles before) and has a quarter of the grid steps.
# That is a cost model (compiler: legality; roofline from published chip figures), not a
# timing on a TPU: with no per-step overhead 128- or 256-wide tiles would be 6-8% cheaper
# on v5e / v5p (less work wasted on the causal diagonal). See docs/kernels_speed.md.
_TPU_BWD = dict(block_q_dq=512, block_kv_dq=512, block_q_dkv=512, block_kv_dkv=512)
_TPU = {
    d: dict(block_q=512 if d <= 128 else 256, block_kv=512 if d <= 128 else 256, **_TPU_BWD,
            num_warps=0, num_stages=0, num_warps_bwd=0, num_stages_bwd=0)
    for d in (64, 128, 256)
}
# CPU runs the kernels in interpret mode: small tiles, so tests see several blocks.
_CPU = {d: dict(block_q=32, block_kv=32, block_q_dq=32, block_kv_dq=32, block_q_dkv=32,
                block_kv_dkv=32, num_warps=4, num_stages=1, num_warps_bwd=4, num_stages_bwd=1)
        for d in (64, 128, 256)}

TABLE: dict[str, dict[int, dict[str, int]]] = {
    "h200": _GPU, "h100": _GPU, "gh200": _GPU, "b200": _GPU,
    "a100": _GPU_SMALL, "gpu": _GPU_SMALL,
    "tpu": _TPU,
    "cpu": _CPU,
}


def kind_key(device_kind: str, platform: str) -> str:
    """Row of TABLE for a device kind such as "NVIDIA H200": matched by name, else platform."""
    kind = device_kind.lower()
    if platform == "gpu":
        for key in ("gh200", "h200", "h100", "b200", "a100"):
            if key in kind:
                return key
    return {"gpu": "gpu", "tpu": "tpu"}.get(platform, "cpu")


def device_kind_key(device: jax.Device | None = None) -> str:
    """Row of TABLE for a device: its kind matched by name, else its platform."""
    device = device or jax.devices()[0]
    platform = "gpu" if device.platform in ("gpu", "cuda", "rocm") else device.platform
    return kind_key(device.device_kind, platform)


def target_kind(platform: str | None = None) -> str:
    """Row of TABLE for the compile target, not the host.

    `platform`: the platform the kernel is lowered for (a branch of a platform choice);
    None: ops.target's. A TPU program compiled on a CPU machine gets the TPU tiles (the CPU's
    32-wide tiles would be illegal for Mosaic). The device named by `compiling_for(...,
    device_kind=...)` picks the row, else the host's device when it is the target, else the
    platform's generic row.
    """
    from gated_attention.ops.target import target_device_kind, target_platform

    platform = platform or target_platform()
    if platform == "cpu":
        return "cpu"
    named = target_device_kind()
    if named is not None:
        return kind_key(named, platform)
    if jax.default_backend() == platform:
        return device_kind_key()
    return platform


def block_sizes_for(head_dim: int, overrides: dict[str, int] | None = None, *,
                    kind: str | None = None) -> dict[str, int]:
    """The tuned sizes for `kind` (default: the first device) and head_dim, then overrides."""
    kind = kind or device_kind_key()
    if kind not in TABLE:
        raise UserError(f"block sizes: unknown device kind {kind!r}; choose one of "
                        f"{', '.join(TABLE)}")
    row = TABLE[kind]
    nearest = min((d for d in row if d >= head_dim), default=max(row))
    sizes = dict(row[nearest])
    overrides = dict(overrides or {})
    unknown = set(overrides) - set(BLOCK_KEYS)
    if unknown:
        raise UserError(f"block_sizes has unknown key {sorted(unknown)[0]!r}; allowed: "
                        f"{', '.join(BLOCK_KEYS)}")
    for key, value in overrides.items():
        if not isinstance(value, int) or value <= 0:
            raise UserError(f"block_sizes[{key!r}]={value!r} must be a positive int")
        if key.startswith("block") and value & (value - 1):
            raise UserError(f"block_sizes[{key!r}]={value} must be a power of two")
    for fwd_key, bwd_keys in FOLLOWS_FORWARD.items():
        if fwd_key in overrides:
            for bwd_key in bwd_keys:
                sizes[bwd_key] = overrides.get(bwd_key, overrides[fwd_key])
    sizes.update(overrides)
    return sizes


def fit_to_length(sizes: dict[str, int], seq: int, minimum: int) -> dict[str, int]:
    """Shrink blocks longer than the (power-of-two rounded) sequence, never below `minimum`."""
    cap = max(minimum, 1 << max(0, (seq - 1).bit_length()))
    return {k: (min(v, cap) if k.startswith("block") else v) for k, v in sizes.items()}
