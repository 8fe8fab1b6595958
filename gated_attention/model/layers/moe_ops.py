"""Mixture-of-experts maths as plain functions of arrays: routing, balance losses, experts.

Nothing here knows Flax, configs or meshes. `layers/moe.py` wires these into a module and
`layers/moe_parallel.py` runs them per device under `shard_map` with expert parallelism.

Conventions: T tokens, D model width, E experts, F expert width, k experts per token.
Assignments (token, slot) are flattened slot-major (`a = slot * T + token`), so that when
experts have limited capacity every token's first choice is served before any second choice.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

MOE_IMPLS = ("auto", "ragged", "blocked", "dense")
GROUPED_IMPLS = ("ragged", "blocked")
MAX_BLOCK_ROWS = 256


class Routing(NamedTuple):
    weights: jax.Array  # [T, k] float32 combine weights, 0 where capacity dropped the assignment
    experts: jax.Array  # [T, k] int32 chosen experts, best first
    keep: jax.Array     # [T, k] bool: assignment fits its expert's capacity
    probs: jax.Array    # [T, E] float32 softmax router probabilities


class BalanceStats(NamedTuple):
    """Additive routing statistics: sum them over shards or micro-batches, then `moe_aux`.

    Keeping sums (not means) is what makes the load-balancing loss global: the loss of the
    combined statistics is the loss of the whole batch, however it was split.
    """

    counts: jax.Array    # [E] assignments routed to each expert (before capacity dropping)
    prob_sum: jax.Array  # [E] router probability of each expert, summed over tokens
    tokens: jax.Array    # [] number of tokens
    z_sum: jax.Array     # [] sum over tokens of logsumexp(router logits)^2
    dropped: jax.Array   # [] assignments dropped by capacity


def resolve_impl(impl: str, platform: str) -> str:
    """"auto" picks the grouped matmul that is fast on `platform`: ragged_dot on TPU (native),
    blocked elsewhere (XLA:CPU and XLA:GPU lower ragged_dot to a dense masked matmul)."""
    if impl != "auto":
        return impl
    return "ragged" if platform == "tpu" else "blocked"


def route(logits: jax.Array, top_k: int, renormalize: bool) -> tuple[jax.Array, ...]:
    """Softmax router: (weights [T, k], experts [T, k], probs [T, E]), all from float32 logits.

    `renormalize` rescales the k kept probabilities to sum to one (Qwen3-MoE's
    `norm_topk_prob`); otherwise the raw softmax probabilities weight the experts.
    """
    probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
    weights, experts = jax.lax.top_k(probs, top_k)
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, experts.astype(jnp.int32), probs


def expert_capacity(num_tokens: int, top_k: int, num_experts: int, factor: float) -> int:
    """Slots per expert: ceil(factor * T * k / E); 0 means dropless (no capacity limit)."""
    if factor <= 0:
        return 0
    return max(1, math.ceil(factor * num_tokens * top_k / num_experts))


def inverse_permutation(order: jax.Array) -> jax.Array:
    return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))


def sort_assignments(experts: jax.Array, num_experts: int) -> tuple[jax.Array, jax.Array]:
    """Stable sort of the slot-major assignments by expert: (order [A], group sizes [E]).

    Expert ids equal to `num_experts` (a sentinel for dropped assignments) sort last and are
    left out of the group sizes, so grouped matmuls never compute them.
    """
    order = jnp.argsort(experts, stable=True)
    sizes = jnp.bincount(experts, length=num_experts + 1)[:num_experts]
    return order, sizes.astype(jnp.int32)


def flatten_slots(a: jax.Array) -> jax.Array:
    """[T, k, ...] -> [k * T, ...] slot-major."""
    return jnp.swapaxes(a, 0, 1).reshape((-1,) + a.shape[2:])


def capacity_keep(experts: jax.Array, num_experts: int, capacity: int) -> jax.Array:
    """[T, k] bool: assignment's rank within its expert (slot-major order) is below capacity."""
    if capacity <= 0:
        return jnp.ones(experts.shape, bool)
    num_tokens, top_k = experts.shape
    flat = flatten_slots(experts)
    order, sizes = sort_assignments(flat, num_experts)
    starts = jnp.cumsum(sizes) - sizes
    rank_sorted = jnp.arange(flat.shape[0]) - starts[flat[order]]
    rank = rank_sorted[inverse_permutation(order)]
    return (rank < capacity).reshape(top_k, num_tokens).T


def make_routing(logits: jax.Array, top_k: int, renormalize: bool, capacity: int) -> Routing:
    weights, experts, probs = route(logits, top_k, renormalize)
    keep = capacity_keep(experts, probs.shape[-1], capacity)
    return Routing(jnp.where(keep, weights, 0.0), experts, keep, probs)


def balance_stats(logits: jax.Array, routing: Routing) -> BalanceStats:
    num_experts = routing.probs.shape[-1]
    counts = jnp.zeros((num_experts,), jnp.float32).at[routing.experts.reshape(-1)].add(1.0)
    lse = jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1)
    return BalanceStats(
        counts=counts,
        prob_sum=jnp.sum(routing.probs, axis=0),
        tokens=jnp.asarray(logits.shape[0], jnp.float32),
        z_sum=jnp.sum(jnp.square(lse)),
        dropped=jnp.sum(1.0 - routing.keep.astype(jnp.float32)),
    )


def combine_stats(*stats: BalanceStats) -> BalanceStats:
    """Statistics of the union of the batches (micro-batches, data shards) they came from."""
    return jax.tree.map(lambda *xs: sum(xs[1:], xs[0]), *stats)


def moe_aux(stats: BalanceStats, top_k: int) -> dict[str, jax.Array]:
    """Load-balancing loss, router z-loss and load metrics from (global) statistics.

    Load balance (Switch Transformer, Qwen's global-batch form): `E * sum_e f_e * P_e`, with
    f_e the fraction of the k*T assignments routed to expert e (a constant: it comes from the
    top-k choice) and P_e the mean router probability of e. It is 1 for perfect balance.
    Router z-loss (ST-MoE): mean over tokens of logsumexp(logits)^2.
    """
    num_experts = stats.counts.shape[0]
    assignments = top_k * stats.tokens
    load = jax.lax.stop_gradient(stats.counts) / assignments
    mean_prob = stats.prob_sum / stats.tokens
    return {
        "moe_load_balance_loss": num_experts * jnp.sum(load * mean_prob),
        "moe_z_loss": stats.z_sum / stats.tokens,
        "moe_dropped_fraction": stats.dropped / assignments,
        "moe_expert_load": load,
    }


def grouped_swiglu(xs: jax.Array, group_sizes: jax.Array, w_gate: jax.Array, w_up: jax.Array,
                   w_down: jax.Array, impl: str = "ragged") -> jax.Array:
    """SwiGLU of rows grouped by expert: rows [A, D] sorted by expert, weights [G, D, F].

    Rows past sum(group_sizes) come out as zeros, which is how dropped assignments cost
    nothing. impl "ragged": `jax.lax.ragged_dot` (native grouped matmul on TPU; XLA:CPU and
    XLA:GPU in jax 0.10-0.11 lower it to a dense masked matmul, G times the FLOPs and
    memory). impl "blocked": `blocked_swiglu`, plain batched matmuls on any backend.
    """
    if impl == "blocked":
        return blocked_swiglu(xs, group_sizes, w_gate, w_up, w_down)
    gate = jax.lax.ragged_dot(xs, w_gate, group_sizes)
    up = jax.lax.ragged_dot(xs, w_up, group_sizes)
    return jax.lax.ragged_dot(jax.nn.silu(gate) * up, w_down, group_sizes)


def block_rows(num_rows: int, num_groups: int) -> int:
    """Rows per block: a power of two near the mean group size, 8..MAX_BLOCK_ROWS."""
    mean = max(1, -(-num_rows // num_groups))
    return int(min(MAX_BLOCK_ROWS, max(8, 1 << (mean - 1).bit_length())))


def blocked_swiglu(xs: jax.Array, group_sizes: jax.Array, w_gate: jax.Array, w_up: jax.Array,
                   w_down: jax.Array) -> jax.Array:
    """Grouped SwiGLU as block-sparse batched matmuls (dropless, static shapes).

    Each group is padded to a whole number of blocks, so every block of rows belongs to one
    expert; blocks are multiplied by their expert's weights with one batched einsum. Work is
    at most A + G * (block - 1) rows (not G * A), at the cost of gathering one weight matrix
    per block.
    """
    num_rows, num_groups = xs.shape[0], group_sizes.shape[0]
    block = block_rows(num_rows, num_groups)
    num_blocks = -(-(num_rows + num_groups * (block - 1)) // block)
    ends = jnp.cumsum(group_sizes)
    padded_sizes = -(-group_sizes // block) * block
    padded_ends = jnp.cumsum(padded_sizes)
    row = jnp.arange(num_rows)
    group = jnp.searchsorted(ends, row, side="right")  # == num_groups past the last group
    safe = jnp.minimum(group, num_groups - 1)
    dest = padded_ends[safe] - padded_sizes[safe] + row - (ends[safe] - group_sizes[safe])
    dest = jnp.where(group < num_groups, dest, num_blocks * block)  # out of range: dropped
    padded = jnp.zeros((num_blocks * block, xs.shape[1]), xs.dtype).at[dest].set(xs, mode="drop")
    blocks = padded.reshape(num_blocks, block, -1)
    owner = jnp.minimum(jnp.searchsorted(padded_ends, jnp.arange(num_blocks) * block,
                                         side="right"), num_groups - 1)
    hidden = (jax.nn.silu(jnp.einsum("nbD,nDF->nbF", blocks, w_gate[owner]))
              * jnp.einsum("nbD,nDF->nbF", blocks, w_up[owner]))
    out = jnp.einsum("nbF,nFD->nbD", hidden, w_down[owner]).reshape(num_blocks * block, -1)
    return out.at[dest].get(mode="fill", fill_value=0)


def combine_slots(per_assignment: jax.Array, routing: Routing) -> jax.Array:
    """Weighted sum over each token's k expert outputs: [k*T, D] slot-major -> [T, D]."""
    num_tokens, top_k = routing.experts.shape
    outputs = per_assignment.reshape(top_k, num_tokens, -1)
    return jnp.einsum("ktD,tk->tD", outputs, routing.weights.astype(outputs.dtype))


def experts_grouped(x: jax.Array, routing: Routing, w_gate: jax.Array, w_up: jax.Array,
                    w_down: jax.Array, impl: str = "ragged") -> jax.Array:
    """Dropless (or capacity-limited) MoE on one device: sort, grouped matmuls, unsort."""
    num_tokens = x.shape[0]
    num_experts = w_gate.shape[0]
    flat = flatten_slots(jnp.where(routing.keep, routing.experts, num_experts))
    order, sizes = sort_assignments(flat, num_experts)
    rows = x[order % num_tokens]
    out = grouped_swiglu(rows, sizes, w_gate, w_up, w_down, impl)
    return combine_slots(out[inverse_permutation(order)], routing)


def experts_dense(x: jax.Array, routing: Routing, w_gate: jax.Array, w_up: jax.Array,
                  w_down: jax.Array) -> jax.Array:
    """Reference path: every expert on every token, combined with a [T, E] gate matrix."""
    num_tokens = x.shape[0]
    gates = jnp.zeros((num_tokens, w_gate.shape[0]), jnp.float32)
    gates = gates.at[jnp.arange(num_tokens)[:, None], routing.experts].add(routing.weights)
    hidden = (jax.nn.silu(jnp.einsum("TD,EDF->TEF", x, w_gate))
              * jnp.einsum("TD,EDF->TEF", x, w_up))
    return jnp.einsum("TEF,EFD,TE->TD", hidden, w_down, gates.astype(x.dtype))
