"""Device meshes and logical-axis rules: the only module that names a mesh axis.

Every parameter carries logical axis names (`sharding_names` metadata: batch, length, embed,
heads, kv_heads, head_dim, mlp, vocab, expert, ...). `LOGICAL_RULES` maps each to mesh axes of
the mesh ("data", "fsdp", "tensor", "expert"); names without a rule are replicated.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gated_attention.layers.params import logical_axes

MESH_AXES = ("data", "fsdp", "tensor", "expert")

# logical name -> mesh axis (or axes). FSDP shards the embed dimension of weights; tensor
# parallelism splits heads and MLP columns; the batch is split over data x fsdp.
LOGICAL_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("embed", "fsdp"),
    ("embed_out", "tensor"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("vocab", "tensor"),
    ("expert", "expert"),
    ("switch_expert", None),
)


def mesh_shape(mesh_config: Mapping[str, int], num_devices: int) -> tuple[int, ...]:
    """Resolve one -1 entry so the product equals num_devices; validate the rest."""
    unknown = set(mesh_config) - set(MESH_AXES)
    if unknown:
        raise ValueError(f"mesh.{sorted(unknown)[0]} is not a mesh axis; axes: "
                         f"{', '.join(MESH_AXES)}")
    shape = [int(mesh_config.get(axis, 1)) for axis in MESH_AXES]
    if shape.count(-1) > 1:
        raise ValueError("mesh: at most one axis may be -1 (fill the remaining devices)")
    if any(s == 0 or s < -1 for s in shape):
        raise ValueError(f"mesh sizes must be positive or -1; got {dict(zip(MESH_AXES, shape))}")
    known = int(np.prod([s for s in shape if s != -1]))
    if -1 in shape:
        if num_devices % known:
            raise ValueError(f"mesh: {num_devices} devices do not divide by the fixed axes "
                             f"product {known}")
        shape[shape.index(-1)] = num_devices // known
    if int(np.prod(shape)) != num_devices:
        raise ValueError(f"mesh {dict(zip(MESH_AXES, shape))} needs {int(np.prod(shape))} "
                         f"devices; {num_devices} are available")
    return tuple(shape)


def create_mesh(mesh_config: Mapping[str, int], devices: Sequence[Any] | None = None) -> Mesh:
    devices = list(jax.devices() if devices is None else devices)
    shape = mesh_shape(mesh_config, len(devices))
    return jax.make_mesh(shape, MESH_AXES, axis_types=(jax.sharding.AxisType.Auto,) * len(shape),
                         devices=devices)


def logical_to_spec(names: Sequence[str | None] | None,
                    rules: Sequence[tuple[str, Any]] = LOGICAL_RULES) -> PartitionSpec:
    """PartitionSpec for logical names; a mesh axis is used at most once per array."""
    if not names:
        return PartitionSpec()
    table = dict(rules)
    used: set[str] = set()
    spec = []
    for name in names:
        axes = table.get(name) if name else None
        axes_tuple = (axes,) if isinstance(axes, str) else tuple(axes or ())
        axes_tuple = tuple(a for a in axes_tuple if a not in used)
        used.update(axes_tuple)
        spec.append(None if not axes_tuple else axes_tuple[0] if len(axes_tuple) == 1
                    else axes_tuple)
    return PartitionSpec(*spec)


def _fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Drop mesh axes that do not divide the dimension they would split (replicate instead)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = int(np.prod([mesh.shape[a] for a in names])) if names else 1
        out.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*out)


def state_shardings(state: Any, mesh: Mesh,
                    rules: Sequence[tuple[str, Any]] = LOGICAL_RULES) -> Any:
    """NamedShardings for an nnx.State (or any pytree of Variables) from their logical names."""

    def one(var: Any) -> NamedSharding:
        if isinstance(var, nnx.Variable):
            names = logical_axes(var)
            shape = var.get_value().shape
        else:
            names, shape = None, np.shape(var)
        return NamedSharding(mesh, _fit_spec(logical_to_spec(names, rules), shape, mesh))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules: Sequence[tuple[str, Any]] = LOGICAL_RULES) -> NamedSharding:
    """Sharding of [batch, length] arrays."""
    return NamedSharding(mesh, logical_to_spec(("batch", "length"), rules))
