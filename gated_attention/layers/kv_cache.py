"""A per-layer key/value cache for autoregressive decoding, and attention over it.

Decoding feeds the model the new tokens only (the whole prompt once, then one token per step)
and keeps every layer's post-RoPE keys and values in a fixed-size buffer, so a step costs one
token's work instead of the whole prefix's. Buffers have a static length (prompt + new tokens),
so the prefill and the decode step each compile once.

Slots are written left to right, the same slots for every row. Each slot remembers the
position of the token it holds (-1 when empty or padding), and a query sees exactly the keys
whose position is in [0, its own position]: the causal mask of a full forward pass. Prompts of
different lengths are left-padded and their pads get negative positions, so no one sees them.

`KVCache` is a pytree (jit takes and returns it) that the attention layer updates in place
during tracing; `attend` has the signature of `ops.attention`, so the layer swaps one for the
other and everything around SDPA (QK-norm, RoPE, gates, o_proj) stays one code path.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from gated_attention.ops import reference
from gated_attention.ops.gating import apply_output_gate


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class KVCache:
    keys: jax.Array       # [b, max_len, kv_heads, d]
    values: jax.Array     # [b, max_len, kv_heads, d]
    positions: jax.Array  # [b, max_len] int32: the position held by each slot, -1 if none
    length: jax.Array     # [] int32: slots filled so far

    @classmethod
    def empty(cls, batch: int, max_len: int, kv_heads: int, head_dim: int,
              dtype: Any = jnp.float32) -> KVCache:
        zeros = jnp.zeros((batch, max_len, kv_heads, head_dim), dtype)
        return cls(zeros, zeros, jnp.full((batch, max_len), -1, jnp.int32),
                   jnp.zeros((), jnp.int32))

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
               window: int = 0, **_kernel_options: Any) -> jax.Array:
        """Store k/v, then attend q [b, s, h, d] (at `positions` [b, s]) over the cache.

        Takes the keyword arguments of `ops.attention`; the kernel choices (impl, block sizes,
        segment ids, causal) do not apply: the mask comes from the slots' positions.
        """
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


def empty_caches(cfg: Any, batch: int, max_len: int) -> list[KVCache]:
    """One empty cache per layer of a model with ModelConfig `cfg`."""
    _, kv_heads = cfg.heads
    return [KVCache.empty(batch, max_len, kv_heads, cfg.head_dim, cfg.compute_dtype)
            for _ in range(cfg.num_layers)]
