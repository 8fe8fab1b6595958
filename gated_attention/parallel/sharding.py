"""Device meshes and logical-axis rules: the only module that names a mesh axis.

Every parameter and activation carries logical axis names (batch, length, embed, heads,
kv_heads, head_dim, mlp, vocab, expert, ...). `LOGICAL_RULES` maps each to axes of the mesh
("data", "fsdp", "tensor", "expert"); names without a rule are replicated, and so is any
dimension a mesh axis does not divide. `config.mesh` sizes the mesh (one size may be -1: the
rest of the devices) and may override rules (`config.mesh.rules="vocab=,mlp=tensor"`).
On a multi-slice pod the `dcn_*` sizes say how many slices each axis spans; the mesh is then
built with `mesh_utils.create_hybrid_device_mesh` so only the outer axes cross the slow
data-centre network.

The rules are flax's logical partitioning rules: `logical_rules` enters flax's
`logical_axis_rules` context and `logical_to_spec` is flax's `logical_to_mesh_axes` (rules in
priority order; a rule whose mesh axis an earlier dimension already took is skipped). What
flax lacks is kept here: validation of names and axes, `mesh.rules` overrides from a string,
and dropping a mesh axis that does not divide a dimension (`fit_spec`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import linen as flax_linen
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gated_attention.core.errors import UserError

MESH_AXES = ("data", "fsdp", "tensor", "expert")
DCN_KEYS = tuple(f"dcn_{axis}" for axis in MESH_AXES)
LOGICAL_NAMES = ("batch", "length", "embed", "embed_out", "heads", "kv_heads", "head_dim",
                 "mlp", "vocab", "expert", "switch_expert", "layers")

Rules = Sequence[tuple[str, str | tuple[str, ...] | None]]

# logical name -> mesh axis (or axes). FSDP shards the embed dimension of weights; tensor
# parallelism splits heads and MLP columns; the batch is split over data x fsdp. An array uses
# each mesh axis at most once, so activations [batch, length, embed] keep embed whole (fsdp is
# already taken by the batch) while weights [embed, mlp] split embed over fsdp.
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
    ("layers", None),  # the stacked layer axis of scanned blocks: every device holds all
)



def logical_axes(var: nnx.Variable) -> tuple[str | None, ...]:
    """The logical axis names a parameter was created with (flax renamed the metadata key)."""
    meta = var.get_metadata()
    names = meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")
    return tuple(names or ())


# ----------------------------------------------------------------------------- mesh shape

def _sizes(mesh_config: Mapping[str, Any], keys: Sequence[str]) -> list[int]:
    return [int(mesh_config.get(key, 1)) for key in keys]


def _check_keys(mesh_config: Mapping[str, Any]) -> None:
    allowed = set(MESH_AXES) | set(DCN_KEYS) | {"rules"}
    unknown = set(mesh_config) - allowed
    if unknown:
        raise UserError(f"mesh.{sorted(unknown)[0]} is not a mesh setting; allowed: "
                        f"{', '.join(MESH_AXES + DCN_KEYS)}, rules")


def dcn_shape(mesh_config: Mapping[str, Any]) -> tuple[int, ...]:
    """Slices along each mesh axis (all 1 on a single slice or a GPU host)."""
    _check_keys(mesh_config)
    shape = _sizes(mesh_config, DCN_KEYS)
    if any(s < 1 for s in shape):
        raise UserError(f"mesh.dcn_* sizes must be >= 1; got {dict(zip(DCN_KEYS, shape))}")
    return tuple(shape)


def mesh_shape(mesh_config: Mapping[str, Any], num_devices: int) -> tuple[int, ...]:
    """Per-slice (ICI) mesh shape: resolve one -1 entry, validate the rest.

    With dcn_* sizes the devices are split into prod(dcn) slices first; the full mesh shape is
    this shape times `dcn_shape(mesh_config)` axis by axis.
    """
    _check_keys(mesh_config)
    num_slices = math.prod(dcn_shape(mesh_config))
    if num_devices % num_slices:
        raise UserError(f"mesh: {num_devices} devices do not split into {num_slices} slices "
                        f"(product of mesh.dcn_*)")
    per_slice = num_devices // num_slices
    shape = _sizes(mesh_config, MESH_AXES)
    if shape.count(-1) > 1:
        raise UserError("mesh: at most one axis may be -1 (fill the remaining devices)")
    if any(s == 0 or s < -1 for s in shape):
        raise UserError(f"mesh sizes must be positive or -1; got {dict(zip(MESH_AXES, shape))}")
    known = math.prod(s for s in shape if s != -1)
    if -1 in shape:
        if per_slice % known:
            raise UserError(f"mesh: {per_slice} devices per slice do not divide by the fixed "
                            f"axes product {known}")
        shape[shape.index(-1)] = per_slice // known
    if math.prod(shape) != per_slice:
        raise UserError(f"mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices "
                        f"per slice; {per_slice} are available")
    return tuple(shape)


def full_mesh_shape(mesh_config: Mapping[str, Any], num_devices: int) -> dict[str, int]:
    """Size of every mesh axis over all slices, e.g. {"data": 2, "fsdp": 4, ...}."""
    ici, dcn = mesh_shape(mesh_config, num_devices), dcn_shape(mesh_config)
    return {axis: i * d for axis, i, d in zip(MESH_AXES, ici, dcn)}


def device_grid(mesh_config: Mapping[str, Any], devices: Sequence[Any]) -> np.ndarray:
    """Devices arranged as the full mesh; with dcn_* > 1 only those axes cross slices."""
    devices = list(devices)
    ici, dcn = mesh_shape(mesh_config, len(devices)), dcn_shape(mesh_config)
    if math.prod(dcn) == 1:
        return mesh_utils.create_device_mesh(ici, devices, allow_split_physical_axes=True)
    # Slices are the DCN granules on TPU; elsewhere (GPU hosts, CPU tests) processes are.
    slices = {getattr(d, "slice_index", None) for d in devices}
    by_slice = None not in slices and len(slices) == math.prod(dcn)
    return mesh_utils.create_hybrid_device_mesh(
        ici, dcn, devices, process_is_granule=not by_slice, allow_split_physical_axes=True)


def create_mesh(mesh_config: Mapping[str, Any], devices: Sequence[Any] | None = None) -> Mesh:
    """The device mesh for `config.mesh` (automatic axis types, so jit propagates shardings)."""
    devices = list(jax.devices() if devices is None else devices)
    if math.prod(dcn_shape(mesh_config)) == 1:
        # make_mesh orders devices for the physical topology (TPU torus, GPU NVLink).
        return jax.make_mesh(mesh_shape(mesh_config, len(devices)), MESH_AXES,
                             axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES),
                             devices=devices)
    return Mesh(device_grid(mesh_config, devices), MESH_AXES,
                axis_types=(jax.sharding.AxisType.Auto,) * len(MESH_AXES))


# ----------------------------------------------------------------------------- rules

def parse_rules(text: str) -> tuple[tuple[str, tuple[str, ...] | None], ...]:
    """`"vocab=,mlp=tensor,batch=data+fsdp"` -> rule overrides ("name=" replicates)."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise UserError(f"mesh.rules part {part!r} must look like name=axis[+axis] "
                            f"(logical names: {', '.join(LOGICAL_NAMES)})")
        name, axes = (s.strip() for s in part.split("=", 1))
        out.append((name, tuple(a for a in axes.split("+") if a) or None))
    return tuple(out)


def _validate_rules(rules: Rules) -> None:
    for name, axes in rules:
        if name not in LOGICAL_NAMES:
            raise UserError(f"mesh.rules: {name!r} is not a logical axis name; names: "
                            f"{', '.join(LOGICAL_NAMES)}")
        for axis in (axes,) if isinstance(axes, str) else tuple(axes or ()):
            if axis not in MESH_AXES:
                raise UserError(f"mesh.rules: {name}={axis!r} is not a mesh axis; axes: "
                                f"{', '.join(MESH_AXES)}")


def rules_from_config(mesh_config: Mapping[str, Any] | None) -> Rules:
    """LOGICAL_RULES with `mesh.rules` overrides (a "name=axis+axis,..." string or pairs)."""
    overrides = (mesh_config or {}).get("rules") or ()
    if isinstance(overrides, str):
        overrides = parse_rules(overrides)
    overrides = tuple((str(n), a if a is None or isinstance(a, str) else tuple(a))
                      for n, a in overrides)
    _validate_rules(overrides)
    table = dict(LOGICAL_RULES)
    table.update(dict(overrides))
    return tuple(table.items())


@contextlib.contextmanager
def logical_rules(rules: Rules) -> Iterator[None]:
    """Use `rules` for everything traced inside this block (flax's `logical_axis_rules`)."""
    _validate_rules(rules)
    with nnx.logical_axis_rules(tuple(rules)):
        yield


def active_rules() -> Rules:
    """The rules in force: those of the innermost `logical_rules` block, else LOGICAL_RULES.

    `constrain`, the attention kernels' shard_map and the MoE layer's read them here.
    """
    return tuple(flax_linen.get_logical_axis_rules()) or LOGICAL_RULES


def logical_to_spec(names: Sequence[str | None] | None,
                    rules: Rules = LOGICAL_RULES) -> PartitionSpec:
    """PartitionSpec for logical names; a mesh axis is used at most once per array."""
    if not names:
        return PartitionSpec()
    return flax_linen.logical_to_mesh_axes(tuple(names), tuple(rules))


def fit_spec(spec: PartitionSpec, shape: Sequence[int],
             axis_sizes: Mapping[str, int]) -> PartitionSpec:
    """Drop mesh axes that do not divide the dimension they would split (replicate instead)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = math.prod(axis_sizes[a] for a in names)
        out.append(axes if names and dim % size == 0 else None)
    return PartitionSpec(*out)


def _fit_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    return fit_spec(spec, shape, dict(mesh.shape))


def shard_factor(spec: PartitionSpec, axis_sizes: Mapping[str, int]) -> int:
    """Number of pieces an array with `spec` is cut into (its per-device share is 1 / this)."""
    factor = 1
    for axes in spec:
        for axis in (axes,) if isinstance(axes, str) else tuple(axes or ()):
            factor *= axis_sizes[axis]
    return factor


# ----------------------------------------------------------------------------- shardings

def state_shardings(state: Any, mesh: Mesh, rules: Rules = LOGICAL_RULES) -> Any:
    """NamedShardings for an nnx.State (or any pytree of Variables) from their logical names.

    Kept beside flax's `nnx.get_named_sharding`, which neither replicates dimensions a mesh
    axis does not divide nor uses a mesh axis at most once per array.

    Optimizer moments built by optax from an nnx.State of Params keep each Param's metadata,
    so they shard like their parameter; plain arrays (step counters) are replicated.
    """

    def one(var: Any) -> NamedSharding:
        if isinstance(var, nnx.Variable):
            names = logical_axes(var)
            shape = var.get_value().shape
        else:
            names, shape = None, np.shape(var)
        return NamedSharding(mesh, _fit_spec(logical_to_spec(names, rules), shape, mesh))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: Mesh, rules: Rules = LOGICAL_RULES) -> NamedSharding:
    """Sharding of [batch, length] arrays."""
    return NamedSharding(mesh, logical_to_spec(("batch", "length"), rules))


def constrain(x: jax.Array, logical_names: Sequence[str | None]) -> jax.Array:
    """Pin an activation's layout by its logical names when traced under `jax.set_mesh`.

    Kept beside flax's `with_logical_constraint`, which constrains eager arrays and shard_map
    bodies too and does not replicate dimensions a mesh axis does not divide.

    A no-op outside a mesh, inside shard_map, and for eager (untraced) arrays, so
    single-device code and notebooks run unchanged. Axes that do not divide a dimension are
    left replicated.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not isinstance(x, jax.core.Tracer):
        return x
    if jax.sharding.AxisType.Manual in mesh.axis_types:  # inside shard_map: layout is manual
        return x
    if len(logical_names) != x.ndim:
        raise ValueError(f"constrain: {len(logical_names)} logical names {tuple(logical_names)} "
                         f"for an array of rank {x.ndim}")
    spec = fit_spec(logical_to_spec(logical_names, active_rules()), x.shape,
                    dict(mesh.shape))
    return jax.lax.with_sharding_constraint(x, spec)
