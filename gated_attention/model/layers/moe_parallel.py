"""Expert parallelism: the MoE layer per device under `shard_map`, tokens moved by all-to-all.

Layout inside `shard_map`: each device holds a slice of the tokens (split over the batch mesh
axes and, when the batch rule does not already use it, the expert axis) and E / ep experts.
A device routes its own tokens, sorts the assignments by expert (hence by owner device),
packs them into one fixed-size buffer per destination, exchanges the buffers with
`all_to_all`, runs grouped matmuls on the rows it received for its experts, and sends the
results back the same way. Routing statistics are summed over every token-splitting axis,
so the balance loss is the global-batch loss on any mesh.

Buffer size: dropless means a destination may receive all k*T_local assignments of a
source, so each of the ep buffers has k*T_local rows (ep times the rows actually sent).
With `moe_capacity_factor > 0` each buffer holds E_local * capacity rows instead. Capacity
is then counted per device (GShard's "group"), so it depends on the mesh; dropless does not.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from gated_attention.model.layers import moe_ops
from gated_attention.parallel import sharding


@dataclasses.dataclass(frozen=True)
class ParallelPlan:
    """Which mesh axes split the tokens and which one holds the experts."""

    mesh: jax.sharding.AbstractMesh
    token_axes: tuple[str, ...]  # axes splitting the flattened tokens, outermost first
    expert_axis: str | None      # axis splitting the experts (None: every device has all)
    expert_parallelism: int


def _axes(spec_entry: str | tuple[str, ...] | None) -> tuple[str, ...]:
    return (spec_entry,) if isinstance(spec_entry, str) else tuple(spec_entry or ())


def parallel_plan(num_tokens: int, num_experts: int) -> ParallelPlan | None:
    """The plan under the active `jax.set_mesh` mesh, or None (no mesh, or one device)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return None
    sizes = dict(mesh.shape)
    rules = sharding.active_rules()
    batch_axes = tuple(a for a in _axes(sharding.logical_to_spec(("batch",), rules)[0])
                       if sizes.get(a, 1) > 1)
    expert_axes = tuple(a for a in _axes(sharding.logical_to_spec(("expert",), rules)[0])
                        if sizes.get(a, 1) > 1)
    if len(expert_axes) > 1:
        raise ValueError(f"MoE: the 'expert' rule maps to several mesh axes {expert_axes}; "
                         "expert parallelism uses exactly one")
    expert_axis = expert_axes[0] if expert_axes else None
    ep = sizes[expert_axis] if expert_axis else 1
    token_axes = batch_axes + tuple(a for a in expert_axes if a not in batch_axes)
    if not token_axes:
        return None
    splits = math.prod(sizes[a] for a in token_axes)
    if num_tokens % splits:
        raise ValueError(f"MoE: {num_tokens} tokens (batch x length) do not split evenly over "
                         f"mesh axes {token_axes} of sizes "
                         f"{[sizes[a] for a in token_axes]}; pick a batch size divisible by "
                         f"{splits}")
    if num_experts % ep:
        raise ValueError(f"MoE: {num_experts} experts do not split evenly over the expert "
                         f"axis {expert_axis!r} of size {ep}; choose mesh.expert dividing it")
    return ParallelPlan(mesh, token_axes, expert_axis, ep)


def _exchange(x: jax.Array, axis: str) -> jax.Array:
    """Chunk i of the leading axis goes to device i of `axis`; chunk j received from j."""
    return jax.lax.all_to_all(x, axis, split_axis=0, concat_axis=0, tiled=True)


def experts_all_to_all(x: jax.Array, routing: moe_ops.Routing, w_gate: jax.Array,
                       w_up: jax.Array, w_down: jax.Array, *, num_experts: int, axis: str,
                       ep: int, capacity: int, impl: str = "ragged") -> jax.Array:
    """The MoE FFN on this device's tokens; w_* hold this device's E / ep experts."""
    num_tokens, top_k = routing.experts.shape
    local_experts = num_experts // ep
    flat = moe_ops.flatten_slots(jnp.where(routing.keep, routing.experts, num_experts))
    order, sizes = moe_ops.sort_assignments(flat, num_experts)
    sorted_experts = flat[order]
    rows = x[order % num_tokens]
    # Pack: assignment i goes to device dest = expert // local_experts, at its rank there.
    dest = sorted_experts // local_experts  # == ep for dropped assignments
    per_dest = jnp.sum(sizes.reshape(ep, local_experts), axis=1)
    starts = jnp.cumsum(per_dest) - per_dest
    rank = jnp.arange(flat.shape[0]) - starts[jnp.minimum(dest, ep - 1)]
    slots = top_k * num_tokens if capacity <= 0 else min(top_k * num_tokens,
                                                         local_experts * capacity)
    slot = jnp.where(dest < ep, dest * slots + rank, ep * slots)  # out of range: not sent
    send = jnp.zeros((ep * slots, x.shape[1]), x.dtype).at[slot].set(rows, mode="drop")
    send_ids = jnp.full((ep * slots,), local_experts, jnp.int32)
    send_ids = send_ids.at[slot].set(sorted_experts - dest * local_experts, mode="drop")
    received, received_ids = _exchange(send, axis), _exchange(send_ids, axis)
    # Compute: group the received rows by local expert (empty slots carry the sentinel id).
    local_order, local_sizes = moe_ops.sort_assignments(received_ids, local_experts)
    out = moe_ops.grouped_swiglu(received[local_order], local_sizes, w_gate, w_up, w_down,
                                 impl)
    returned = _exchange(out[moe_ops.inverse_permutation(local_order)], axis)
    per_assignment = returned.at[slot].get(mode="fill", fill_value=0)
    return moe_ops.combine_slots(per_assignment[moe_ops.inverse_permutation(order)], routing)


def sharded_moe(plan: ParallelPlan, local_fn: Callable, x: jax.Array, router: jax.Array,
                w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
                ) -> tuple[jax.Array, moe_ops.BalanceStats]:
    """Run `local_fn(x, router, w_gate, w_up, w_down, expert_axis, ep)` per device.

    `local_fn` returns (y, stats) for its tokens; the stats are summed over the token axes
    here, which makes every loss computed from them a global-batch loss.
    """
    tokens = PartitionSpec(plan.token_axes)
    experts = PartitionSpec(plan.expert_axis)

    def body(x, router, w_gate, w_up, w_down):
        y, stats = local_fn(x, router, w_gate, w_up, w_down, plan.expert_axis,
                            plan.expert_parallelism)
        return y, jax.tree.map(lambda s: jax.lax.psum(s, plan.token_axes), stats)

    stats_specs = moe_ops.BalanceStats(*([PartitionSpec()] * len(moe_ops.BalanceStats._fields)))
    return jax.shard_map(
        body, mesh=plan.mesh,
        in_specs=(tokens, PartitionSpec(), experts, experts, experts),
        out_specs=(tokens, stats_specs),
    )(x, router, w_gate, w_up, w_down)
