"""A per-layer key/value cache for autoregressive decoding, and attention over it.

Decoding feeds the model the new tokens only (the whole prompt once, then one token per step)
and keeps every layer's post-RoPE keys and values in a fixed-size buffer, so a step costs one
token's work instead of the whole prefix's. Buffers have a static length (prompt + new tokens),
so the prefill and the decode step each compile once.

Slots are written left to right, the same slots for every row. Each slot remembers the
position of the token it holds (-1 when empty or padding), and a query sees exactly the keys
whose position is in [0, its own position]: the causal mask of a full forward pass. Prompts of
different lengths are left-padded and their pads get negative positions, so no one sees them.

Eviction (StreamingLLM, arXiv 2309.17453): with `evict_window=W` the buffer holds only the
first `keep_first=k` tokens and the last W (a ring of W slots after the k kept ones), and a
query sees exactly those. Positions are those inside the cache, as StreamingLLM assigns
them: once full, the cache holds positions 0..k+W-1 with the query last. RoPE depends only
on q-k distances, so a window key keeps its true distance and a kept key j < k sits at
distance min(i, k+W-1) - j from query i: the query is re-rotated for those logits alone.
New tokens attend over [cache; themselves] before they are written, so a prefill longer
than the ring is exact too; tokens a call would overwrite itself are never written.

`KVCache` is a pytree (jit takes and returns it) that the attention layer updates in place
during tracing; `attend` has the signature of `ops.attention`, so the layer swaps one for the
other and everything around SDPA (QK-norm, RoPE, gates, o_proj) stays one code path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from gated_attention.core.errors import UserError
from gated_attention.model.layers.rope import NO_SCALING, RopeScaling, apply_rope, attention_factor
from gated_attention.ops import reference
from gated_attention.ops.gating import apply_output_gate


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    keys: jax.Array       # [b, max_len, kv_heads, d]
    values: jax.Array     # [b, max_len, kv_heads, d]
    positions: jax.Array  # [b, max_len] int32: the position held by each slot, -1 if none
    length: jax.Array     # [] int32: slots filled so far
    evict_window: int = dataclasses.field(default=0, metadata=dict(static=True))
    keep_first: int = dataclasses.field(default=0, metadata=dict(static=True))

    @classmethod
    def empty(cls, batch: int, max_len: int, kv_heads: int, head_dim: int,
              dtype: Any = jnp.float32, *, evict_window: int = 0,
              keep_first: int = 0) -> KVCache:
        """max_len slots; with evict_window W the cache has keep_first + W slots instead."""
        if evict_window < 0 or keep_first < 0:
            raise UserError(f"evict_window={evict_window} and keep_first={keep_first} must "
                            "be >= 0")
        if keep_first and not evict_window:
            raise UserError(f"keep_first={keep_first} needs evict_window > 0 (without "
                            "eviction every token is kept)")
        if evict_window:
            max_len = keep_first + evict_window
        zeros = jnp.zeros((batch, max_len, kv_heads, head_dim), dtype)
        return cls(zeros, zeros, jnp.full((batch, max_len), -1, jnp.int32),
                   jnp.zeros((), jnp.int32), evict_window, keep_first)

    def append(self, k: jax.Array, v: jax.Array, positions: jax.Array) -> None:
        """Write the new tokens' keys/values [b, s, kv_heads, d] into the next s slots."""
        start, zero = self.length.astype(jnp.int32), jnp.zeros((), jnp.int32)
        self.keys = jax.lax.dynamic_update_slice(self.keys, k.astype(self.keys.dtype),
                                                 (zero, start, zero, zero))
        self.values = jax.lax.dynamic_update_slice(self.values, v.astype(self.values.dtype),
                                                   (zero, start, zero, zero))
        self.positions = jax.lax.dynamic_update_slice(
            self.positions, positions.astype(jnp.int32), (zero, start))
        self.length = start + k.shape[1]

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, *, positions: jax.Array,
               gate: jax.Array | None = None, gate_activation: str = "sigmoid",
               normalizer: str = "softmax", sink_logits: jax.Array | None = None,
               window: int = 0, rope_base: float = 10_000.0,
               rope_scaling: RopeScaling = NO_SCALING, **_kernel_options: Any) -> jax.Array:
        """Store k/v, then attend q [b, s, h, d] (at `positions` [b, s]) over the cache.

        Takes the keyword arguments of `ops.attention`; the kernel choices (impl, block sizes,
        segment ids, causal) do not apply: the mask comes from the slots' positions.
        rope_base / rope_scaling: the model's RoPE, used to re-rotate queries for kept keys.
        """
        if self.evict_window:
            return self._attend_evicting(q, k, v, positions, gate, gate_activation, normalizer,
                                         sink_logits, window, rope_base, rope_scaling)
        self.append(k, v, positions)
        b, s, h, d = q.shape
        logits = reference.attention_logits(q, self.keys)  # [b, n, g, s, max_len]
        key_pos = self.positions[:, None, :]                # [b, 1, max_len]
        query_pos = positions[:, :, None]                   # [b, s, 1]
        visible = (key_pos >= 0) & (key_pos <= query_pos)   # [b, s, max_len]
        if window:  # sliding-window attention: the last `window` positions, itself included
            visible = visible & (query_pos - key_pos < window)
        probs = reference.normalize(logits, visible[:, None, None], normalizer, sink_logits)
        # A padding query sees no key: give it zeros instead of 0/0.
        probs = jnp.where(visible.any(-1)[:, None, None, :, None], probs, 0.0)
        out = jnp.einsum("bngqk,bknd->bqngd", probs, self.values.astype(probs.dtype))
        out = out.reshape(b, s, h, d).astype(q.dtype)
        return apply_output_gate(out, gate, gate_activation)


    def _attend_evicting(self, q, k, v, positions, gate, gate_activation, normalizer,
                         sink_logits, window, rope_base, rope_scaling) -> jax.Array:
        """Attention over [kept keys; window ring; new tokens], then the ring update."""
        b, s, h, d = q.shape
        W, first = self.evict_window, self.keep_first
        keys = jnp.concatenate([self.keys, k.astype(self.keys.dtype)], axis=1)
        values = jnp.concatenate([self.values, v.astype(self.values.dtype)], axis=1)
        key_pos = jnp.concatenate([self.positions, positions.astype(jnp.int32)], axis=1)
        # Slots already holding a position the new tokens bring again are stale: none here,
        # since positions only grow. Visible: kept (< first) or within the last W positions.
        qp, kp = positions[:, :, None], key_pos[:, None, :]        # [b, s, 1], [b, 1, T]
        visible = (kp >= 0) & (kp <= qp) & ((kp < first) | (qp - kp < W))
        if window:
            visible = visible & (qp - kp < window)
        logits = reference.attention_logits(q, keys)               # [b, n, g, s, T]
        if first:  # StreamingLLM positions: kept keys seen from cache position min(i, k+W-1)
            shift = jnp.minimum(positions, first + W - 1) - positions
            q_kept = apply_rope(q, shift, rope_base, rope_scaling) / attention_factor(
                rope_scaling)
            kept_logits = reference.attention_logits(q_kept.astype(q.dtype), keys)
            logits = jnp.where((kp < first)[:, None, None], kept_logits, logits)
        probs = reference.normalize(logits, visible[:, None, None], normalizer, sink_logits)
        probs = jnp.where(visible.any(-1)[:, None, None, :, None], probs, 0.0)
        out = jnp.einsum("bngqk,bknd->bqngd", probs, values.astype(probs.dtype))
        out = out.reshape(b, s, h, d).astype(q.dtype)
        # Write the new tokens: kept ones to slot p, others to ring slot k + (p - k) % W;
        # padding and tokens this call overwrites itself go nowhere (dropped).
        p = positions.astype(jnp.int32)
        last = jnp.max(p, axis=1, keepdims=True)
        slot = jnp.where(p < first, p, first + (p - first) % W)
        slot = jnp.where((p < 0) | ((p >= first) & (last - p >= W)), first + W, slot)
        rows = jnp.arange(b)[:, None]
        self.keys = self.keys.at[rows, slot].set(k.astype(self.keys.dtype), mode="drop")
        self.values = self.values.at[rows, slot].set(v.astype(self.values.dtype), mode="drop")
        self.positions = self.positions.at[rows, slot].set(p, mode="drop")
        self.length = jnp.minimum(self.length + s, first + W)
        return apply_output_gate(out, gate, gate_activation)


def empty_caches(cfg: Any, batch: int, max_len: int, *, evict_window: int = 0,
                 keep_first: int = 0) -> list[KVCache]:
    """One empty cache per layer of a model with ModelConfig `cfg` (evicting: see above)."""
    _, kv_heads = cfg.heads
    return [KVCache.empty(batch, max_len, kv_heads, cfg.head_dim, cfg.compute_dtype,
                          evict_window=evict_window, keep_first=keep_first)
            for _ in range(cfg.num_layers)]
