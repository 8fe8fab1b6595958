"""Plain XLA attention: the reference every kernel is checked against.

Layout [batch, seq, heads, head_dim]; GQA by head count (query heads are grouped onto kv heads
with a reshape, never by repeating k/v). Logits, normalisation and the weighted sum run in
float32 (or float64 when the inputs are float64, which the tests use as ground truth).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gated_attention.core.errors import UserError
from gated_attention.ops.gating import apply_output_gate

NORMALIZERS = ("softmax", "softmax_off_by_one", "learned_sink", "softpick")
SOFTPICK_EPS = 1e-6


def _compute_dtype(*arrays: jax.Array) -> jnp.dtype:
    return jnp.float64 if any(a.dtype == jnp.float64 for a in arrays) else jnp.float32


def attention_mask(
    q_len: int,
    k_len: int,
    *,
    causal: bool,
    q_segment_ids: jax.Array | None = None,
    kv_segment_ids: jax.Array | None = None,
    window: int = 0,
) -> jax.Array:
    """Boolean mask [batch or 1, 1, q_len, k_len]: True where a query may see a key.

    window > 0 (sliding-window attention): a query sees only the `window` keys ending at its
    own position, i.e. key j is visible from query i when 0 <= i - j < window.
    """
    mask = jnp.ones((1, 1, q_len, k_len), dtype=bool)
    # Queries are the last q_len positions of the k_len keys (equal lengths in training).
    q_pos = jnp.arange(q_len)[:, None] + (k_len - q_len)
    if causal:
        mask = mask & (q_pos >= jnp.arange(k_len)[None, :])[None, None]
    if window:
        mask = mask & (q_pos - jnp.arange(k_len)[None, :] < window)[None, None]
    if q_segment_ids is not None:
        kv_segment_ids = q_segment_ids if kv_segment_ids is None else kv_segment_ids
        same = q_segment_ids[:, :, None] == kv_segment_ids[:, None, :]
        mask = mask & same[:, None]
    return mask


def attention_logits(q: jax.Array, k: jax.Array, scale: float | None = None) -> jax.Array:
    """Scaled q.k logits [b, kv_heads, group, q_len, k_len] in the compute dtype."""
    b, s, h, d = q.shape
    kv_heads = k.shape[2]
    dtype = _compute_dtype(q, k)
    scale = d**-0.5 if scale is None else scale
    q = q.reshape(b, s, kv_heads, h // kv_heads, d).astype(dtype)
    return jnp.einsum("bqngd,bknd->bngqk", q, k.astype(dtype)) * scale


def normalize(
    logits: jax.Array,
    mask: jax.Array,
    normalizer: str = "softmax",
    sink_logits: jax.Array | None = None,
) -> jax.Array:
    """Turn masked logits [b, n, g, q, k] into attention weights with the chosen normaliser.

    softmax_off_by_one adds exp(0) to the denominator, learned_sink adds exp(sink_h) with one
    logit per query head, softpick is relu(e^x - 1) / sum |e^x - 1| over visible keys.
    Every form subtracts a running max m, so exp never overflows.
    """
    neg = jnp.finfo(logits.dtype).min
    masked = jnp.where(mask, logits, neg)
    m = jnp.max(masked, axis=-1, keepdims=True)
    if normalizer == "softmax":
        e = jnp.where(mask, jnp.exp(masked - m), 0.0)
        return e / jnp.sum(e, axis=-1, keepdims=True)
    if normalizer == "softmax_off_by_one":
        m = jnp.maximum(m, 0.0)
        e = jnp.where(mask, jnp.exp(masked - m), 0.0)
        return e / (jnp.exp(-m) + jnp.sum(e, axis=-1, keepdims=True))
    if normalizer == "learned_sink":
        if sink_logits is None:
            raise UserError("normalizer='learned_sink' needs sink_logits of shape [heads]")
        n, g = logits.shape[1], logits.shape[2]
        sink = sink_logits.astype(logits.dtype).reshape(1, n, g, 1, 1)
        m = jnp.maximum(m, sink)
        e = jnp.where(mask, jnp.exp(masked - m), 0.0)
        return e / (jnp.exp(sink - m) + jnp.sum(e, axis=-1, keepdims=True))
    if normalizer == "softpick":
        m = jnp.maximum(m, 0.0)
        shifted = jnp.where(mask, jnp.exp(masked - m) - jnp.exp(-m), 0.0)
        denom = jnp.sum(jnp.abs(shifted), axis=-1, keepdims=True) + SOFTPICK_EPS * jnp.exp(-m)
        return jax.nn.relu(shifted) / denom
    raise UserError(f"normalizer={normalizer!r} is not allowed; choose one of {NORMALIZERS}")


def attention_weights(
    q: jax.Array,
    k: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    normalizer: str = "softmax",
    sink_logits: jax.Array | None = None,
    scale: float | None = None,
    window: int = 0,
) -> jax.Array:
    """Attention probabilities [b, heads, q_len, k_len]: S x S, so for short inputs only."""
    b, s, h, _ = q.shape
    logits = attention_logits(q, k, scale)
    mask = attention_mask(s, k.shape[1], causal=causal, q_segment_ids=segment_ids,
                          window=window)[:, :, None]
    probs = normalize(logits, mask, normalizer, sink_logits)
    return probs.reshape(b, h, s, k.shape[1])


def first_token_weights(
    q: jax.Array,
    k: jax.Array,
    *,
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    normalizer: str = "softmax",
    sink_logits: jax.Array | None = None,
    scale: float | None = None,
    chunk: int = 256,
    window: int = 0,
) -> jax.Array:
    """Weight each query puts on key 0, [b, heads, q_len], one query chunk at a time.

    The same as `attention_weights(...)[..., 0]` but keeps only chunk x k_len logits alive,
    so the attention-sink metric is cheap at long lengths.
    """
    b, s, h, d = q.shape
    t = k.shape[1]
    chunk = min(chunk, s)
    pad = (-s) % chunk
    q_pad = jnp.pad(q, ((0, 0), (0, pad), (0, 0), (0, 0)))
    seg_pad = None if segment_ids is None else jnp.pad(segment_ids, ((0, 0), (0, pad)))
    n_chunks = (s + pad) // chunk

    def one_chunk(i: jax.Array) -> jax.Array:
        start = i * chunk
        q_c = jax.lax.dynamic_slice_in_dim(q_pad, start, chunk, axis=1)
        logits = attention_logits(q_c, k, scale)
        q_pos = start + jnp.arange(chunk) + (t - s)
        mask = jnp.ones((1, 1, chunk, t), dtype=bool)
        if causal:
            mask = mask & (q_pos[:, None] >= jnp.arange(t)[None, :])[None, None]
        if window:
            mask = mask & (q_pos[:, None] - jnp.arange(t)[None, :] < window)[None, None]
        if seg_pad is not None:
            seg_c = jax.lax.dynamic_slice_in_dim(seg_pad, start, chunk, axis=1)
            mask = mask & (seg_c[:, :, None] == segment_ids[:, None, :])[:, None]
        probs = normalize(logits, mask[:, :, None], normalizer, sink_logits)
        return probs[..., 0].reshape(b, h, chunk)

    per_chunk = jax.lax.map(one_chunk, jnp.arange(n_chunks))  # [n_chunks, b, h, chunk]
    return jnp.moveaxis(per_chunk, 0, 2).reshape(b, h, n_chunks * chunk)[:, :, :s]


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    gate: jax.Array | None = None,
    gate_activation: str = "sigmoid",
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    normalizer: str = "softmax",
    sink_logits: jax.Array | None = None,
    scale: float | None = None,
    window: int = 0,
) -> jax.Array:
    """Reference attention [b, s, h, d] -> [b, s, h, d] with an optional output gate."""
    b, s, h, d = q.shape
    kv_heads = k.shape[2]
    probs = attention_weights(
        q, k, segment_ids=segment_ids, causal=causal, normalizer=normalizer,
        sink_logits=sink_logits, scale=scale, window=window,
    ).reshape(b, kv_heads, h // kv_heads, s, k.shape[1])
    out = jnp.einsum("bngqk,bknd->bqngd", probs, v.astype(probs.dtype)).reshape(b, s, h, d)
    out = out.astype(q.dtype)
    return apply_output_gate(out, gate, gate_activation)
