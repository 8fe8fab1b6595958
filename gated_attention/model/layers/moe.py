"""Mixture-of-experts SwiGLU FFN: softmax top-k router, dropless grouped matmuls, aux losses.

The paper's 15A2B model (docs/moe.md): 128 fine-grained experts of width 768, top-8, softmax
routing, a global-batch load-balancing loss and a router z-loss. `__call__` returns
(y, aux); the model sums aux over layers and the trainer weights the two losses with
`train.moe_aux_weight` and `train.moe_z_loss_weight`.

aux (every value is per layer; the model sums them over layers, so divide the metrics by
num_layers for a per-layer mean):
- "moe_load_balance_loss": E * sum_e f_e P_e over the global batch (1 when balanced)
- "moe_z_loss":            mean over tokens of logsumexp(router logits)^2
- "moe_dropped_fraction":  assignments dropped by capacity (0 when dropless)
- "moe_expert_load":       [E] fraction of assignments routed to each expert

Implementations (`model.moe_impl`): "ragged" sorts assignments by expert and runs
`jax.lax.ragged_dot` (no capacity padding; fast where XLA has a native grouped matmul, i.e.
TPU); "blocked" sorts the same way and pads each expert's rows to whole blocks for ordinary
batched matmuls (fast on CPU and GPU, where XLA lowers ragged_dot densely); "dense" runs
every expert on every token (a reference); "auto" (the MoE archs' setting) picks ragged on
TPU and blocked elsewhere. Under `jax.set_mesh(mesh)` the sorted paths run per
device in `shard_map`, with experts split over the mesh axis the "expert" rule names and
tokens exchanged by all-to-all (layers/moe_parallel.py); without a mesh it runs as is.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.model.layers import moe_ops, moe_parallel
from gated_attention.model.layers.params import cast, param
from gated_attention.model.model_config import ModelConfig
from gated_attention.ops.target import target_platform
from gated_attention.parallel.sharding import constrain


class MoEFeedForward(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        # cfg.moe_impl and cfg.moe_capacity_factor were checked when ModelConfig was built.
        self.num_experts, self.top_k = cfg.experts
        self.renormalize = cfg.moe_renormalize
        self.capacity_factor = cfg.moe_capacity_factor
        self.impl = moe_ops.resolve_impl(cfg.moe_impl, target_platform())
        self.dtype = cfg.compute_dtype
        E, D, F = self.num_experts, cfg.d_model, cfg.expert_mlp_dim
        # The router is used whole by every token, so it is not tagged "expert" (which
        # accounting.active_params counts at top_k / E) and stays replicated.
        self.router = param(rngs, (D, E), ("embed", None))
        self.gate_proj = param(rngs, (E, D, F), ("expert", "embed", "mlp"))
        self.up_proj = param(rngs, (E, D, F), ("expert", "embed", "mlp"))
        self.down_proj = param(rngs, (E, F, D), ("expert", "mlp", "embed"))

    def _local(self, x: jax.Array, router: jax.Array, w_gate: jax.Array, w_up: jax.Array,
               w_down: jax.Array, expert_axis: str | None = None, ep: int = 1,
               ) -> tuple[jax.Array, moe_ops.BalanceStats]:
        """The layer on one device's tokens [T, D]; w_* hold this device's experts."""
        logits = jnp.einsum("TD,DE->TE", x.astype(jnp.float32), router)
        capacity = moe_ops.expert_capacity(x.shape[0], self.top_k, self.num_experts,
                                           self.capacity_factor)
        routing = moe_ops.make_routing(logits, self.top_k, self.renormalize, capacity)
        if self.impl == "dense":
            y = moe_ops.experts_dense(x, routing, w_gate, w_up, w_down)
        elif expert_axis is None or ep == 1:
            y = moe_ops.experts_grouped(x, routing, w_gate, w_up, w_down, self.impl)
        else:
            y = moe_parallel.experts_all_to_all(
                x, routing, w_gate, w_up, w_down, num_experts=self.num_experts,
                axis=expert_axis, ep=ep, capacity=capacity, impl=self.impl)
        return y, moe_ops.balance_stats(logits, routing)

    def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
        batch, length, d_model = x.shape
        tokens = x.reshape(batch * length, d_model).astype(self.dtype)
        weights = (self.router[...].astype(jnp.float32), cast(self.gate_proj, self.dtype),
                   cast(self.up_proj, self.dtype), cast(self.down_proj, self.dtype))
        plan = (moe_parallel.parallel_plan(tokens.shape[0], self.num_experts)
                if self.impl in moe_ops.GROUPED_IMPLS else None)
        if plan is None:
            y, stats = self._local(tokens, *weights)
        else:
            y, stats = moe_parallel.sharded_moe(plan, self._local, tokens, *weights)
        # Back to the activation layout (the token split over the expert axis ends here).
        y = constrain(y.reshape(batch, length, d_model), ("batch", "length", "embed"))
        return y, moe_ops.moe_aux(stats, self.top_k)
