"""Attention kernels behind one call, `ops.attention` (dispatch.py).

Kernels here are plain functions of arrays (no Flax, no configs): reference.py (XLA),
cudnn.py, pallas_gpu.py (Triton), pallas_tpu.py (Mosaic), splash.py (jax's splash attention).
`impl="auto"` picks the fastest that serves every feature asked for (choices.py), for the
platform being compiled for (target.py); sharded.py runs a kernel per device under a mesh.
arguments.py holds the checks every kernel's arguments pass: `ops.attention` runs them once,
then calls the kernel's `trusted_attention`.
"""

from __future__ import annotations

from gated_attention.ops.dispatch import (
    IMPLS,
    attention,
    resolve_impl,
    validate_attention_args,
)
from gated_attention.ops.gating import GATE_ACTIVATIONS, apply_output_gate, gate_activation
from gated_attention.ops.reference import NORMALIZERS
from gated_attention.ops.sharded import per_device
from gated_attention.ops.target import compiling_for, target_platform

__all__ = ["IMPLS", "NORMALIZERS", "GATE_ACTIVATIONS", "attention", "resolve_impl",
           "compiling_for", "target_platform", "per_device",
           "apply_output_gate", "gate_activation", "validate_attention_args"]
