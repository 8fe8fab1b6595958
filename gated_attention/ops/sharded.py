"""Run a kernel per device under `shard_map`: XLA cannot partition a Pallas (Mosaic/Triton) call.

Without this, every device of a mesh would gather q/k/v and run the whole kernel (or the
compiler refuses: "Mosaic kernels cannot be automatically partitioned"). The caller says
which mesh axes split the batch and the heads (the model's layer reads them off its logical
rules; ops names no mesh axis itself); axes that do not divide their dimension are dropped,
and heads stay whole when the kv heads cannot be split the same way (GQA groups stay local).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import jax
from jax.sharding import PartitionSpec

Axes = str | Sequence[str] | None


def _names(axes: Axes) -> tuple[str, ...]:
    return (axes,) if isinstance(axes, str) else tuple(axes or ())


def fit_axes(axes: Axes, size: int, mesh_sizes: Mapping[str, int]) -> tuple[str, ...] | None:
    """`axes` (present in the mesh, more than one device) if together they divide `size`."""
    names = tuple(a for a in _names(axes) if mesh_sizes.get(a, 1) > 1)
    if not names or size % math.prod(mesh_sizes[a] for a in names):
        return None
    return names


def default_batch_axes(batch: int, mesh_sizes: Mapping[str, int]) -> tuple[str, ...] | None:
    """Without a caller's say: the batch over every mesh axis, in mesh order, that divides it."""
    names, product = [], 1
    for axis, n in mesh_sizes.items():
        if n > 1 and batch % (product * n) == 0:
            names.append(axis)
            product *= n
    return tuple(names) or None


def per_device(kernel: Callable[..., jax.Array], q: jax.Array, k: jax.Array, v: jax.Array,
               optional: Mapping[str, jax.Array | None],
               mesh_axes: Mapping[str, Axes] | None = None) -> jax.Array:
    """`kernel(q, k, v, **optional)` on each device's block when traced under a mesh.

    q [b, s, h, d]; k, v [b, t, kv_heads, d]; `optional` holds gate [b, s, h(, d)],
    segment_ids [b, s] and sink_logits [h], or None. mesh_axes: {"batch": axes, "heads": axes}
    (None: the batch over every dividing mesh axis, heads whole). Outside a mesh, inside a
    shard_map already, or on concrete arrays the kernel is called directly.
    """
    mesh = jax.sharding.get_abstract_mesh()
    traced = isinstance(q, jax.core.Tracer)
    if mesh.empty or not traced or jax.sharding.AxisType.Manual in mesh.axis_types:
        return kernel(q, k, v, **optional)
    sizes = dict(mesh.shape)
    if mesh_axes is None:
        batch_axes, heads_axes = default_batch_axes(q.shape[0], sizes), None
    else:
        batch_axes = fit_axes(mesh_axes.get("batch"), q.shape[0], sizes)
        heads_axes = fit_axes(mesh_axes.get("heads"), q.shape[2], sizes)
        if heads_axes != fit_axes(mesh_axes.get("heads"), k.shape[2], sizes):
            heads_axes = None
    qkv_spec = PartitionSpec(batch_axes, None, heads_axes, None)
    specs = {"gate": PartitionSpec(batch_axes, None, heads_axes),  # trailing head_dim whole
             "segment_ids": PartitionSpec(batch_axes, None),
             "sink_logits": PartitionSpec(heads_axes)}
    present = {name: x for name, x in optional.items() if x is not None}
    absent = {name: None for name, x in optional.items() if x is None}

    def local(q, k, v, present):
        return kernel(q, k, v, **present, **absent)

    in_specs = (qkv_spec, qkv_spec, qkv_spec, {n: specs[n] for n in present})
    return jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=qkv_spec,
                         check_vma=False)(q, k, v, present)
