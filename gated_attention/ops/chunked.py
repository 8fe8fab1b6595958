"""Blockwise XLA attention: the reference's features in memory linear in the sequence length.

Queries are taken `block_q` at a time (`lax.map`); for each query block a `lax.scan` walks the
key/value blocks with an online softmax (running max m, running denominator, running
weighted sum acc), so no S x S matrix ever exists: the largest temporary is
block_q x block_kv logits per head. That lets long-context evaluation run 16k+ tokens on a CPU
with the plain XLA compiler, on any platform. Key blocks entirely in a query block's causal
future are skipped with `lax.cond`, and so, with a sliding window, are key blocks wholly
before every query's window.

Every normaliser of ops/reference.py fits the same running form:
- softmax: starts empty (m = -inf, denominator 0);
- softmax_off_by_one / learned_sink: start from one virtual key with logit 0 / sink_h and a
  zero value (m = that logit, denominator 1);
- softpick: accumulates relu(e^x - 1) in acc and |e^x - 1| in the denominator, both
  shifted by the same running max (m starts at 0), and adds eps e^-m to it at the end.
Gradients come from autodiff through the scan with each step rematerialised; the backward
pass keeps one carry per key block (not a flash backward), which is fine at training lengths.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gated_attention.core.errors import UserError
from gated_attention.ops.arguments import checked
from gated_attention.ops.gating import apply_output_gate
from gated_attention.ops.reference import SOFTPICK_EPS

DEFAULT_BLOCK = 512


def _blocks(x: jax.Array | None, block: int, pad_value: int = 0) -> jax.Array | None:
    """[b, s, ...] -> [s / block, b, block, ...], padding s up to a multiple of block."""
    if x is None:
        return None
    pad = (-x.shape[1]) % block
    widths = [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)
    x = jnp.pad(x, widths, constant_values=pad_value)
    x = x.reshape(x.shape[0], x.shape[1] // block, block, *x.shape[2:])
    return jnp.moveaxis(x, 1, 0)


def _initial_carry(normalizer: str, sink_logits: jax.Array | None, shape: tuple[int, ...],
                   d: int, dtype: jnp.dtype) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(m, denominator, acc) before any key: empty, or one zero-valued virtual key."""
    b, n, g, bq = shape
    acc = jnp.zeros((b, n, g, bq, d), dtype)
    if normalizer == "softmax":
        return jnp.full(shape, jnp.finfo(dtype).min, dtype), jnp.zeros(shape, dtype), acc
    if normalizer == "softmax_off_by_one":
        return jnp.zeros(shape, dtype), jnp.ones(shape, dtype), acc
    if normalizer == "learned_sink":
        sink = sink_logits.astype(dtype).reshape(1, n, g, 1)
        return jnp.broadcast_to(sink, shape), jnp.ones(shape, dtype), acc
    return jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), acc  # softpick


def trusted_attention(
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
    block_q: int = DEFAULT_BLOCK,
    block_kv: int = DEFAULT_BLOCK,
    window: int = 0,
) -> jax.Array:
    """Same contract as `reference.attention` ([b, s, h, d] -> [b, s, h, d]), blockwise.

    The arguments every kernel takes are trusted (ops.attention checked them; `attention`
    checks them for a direct call); the block sizes are checked here."""
    if block_q <= 0 or block_kv <= 0:
        raise UserError(f"block_q={block_q} and block_kv={block_kv} must be > 0")
    b, s, h, d = q.shape
    t, n = k.shape[1], k.shape[2]
    g = h // n
    dtype = jnp.float64 if jnp.float64 in (q.dtype, k.dtype, v.dtype) else jnp.float32
    scale = d**-0.5 if scale is None else scale
    bq, bk = min(block_q, s), min(block_kv, t)
    offset = t - s  # queries are the last s of the t positions
    q_blocks = _blocks(q.reshape(b, s, n, g, d), bq)  # [nq, b, bq, n, g, d]
    k_blocks, v_blocks = _blocks(k, bk), _blocks(v, bk)  # [nk, b, bk, n, d]
    q_segments = _blocks(segment_ids, bq, pad_value=-1)  # [nq, b, bq]
    kv_segments = _blocks(segment_ids, bk, pad_value=-2)  # self-attention: same ids
    neg = jnp.finfo(dtype).min

    def query_block(args):
        qi, q_blk, q_seg = args
        q_blk = q_blk.astype(dtype)
        q_pos = qi * bq + jnp.arange(bq) + offset

        def step(carry, xs):
            ki, k_blk, v_blk, kv_seg = xs

            def update(carry):
                m, denom, acc = carry
                logits = jnp.einsum("bqngd,bknd->bngqk", q_blk, k_blk.astype(dtype)) * scale
                k_pos = ki * bk + jnp.arange(bk)
                mask = jnp.broadcast_to(k_pos < t, (1, 1, 1, bq, bk))
                if causal:
                    mask = mask & (q_pos[:, None] >= k_pos[None, :])
                if window:
                    mask = mask & (q_pos[:, None] - k_pos[None, :] < window)
                if q_seg is not None:
                    mask = mask & (q_seg[:, :, None] == kv_seg[:, None, :])[:, None, None]
                masked = jnp.where(mask, logits, neg)
                m_new = jnp.maximum(m, jnp.max(masked, axis=-1))
                rescale = jnp.exp(m - m_new)
                shifted = jnp.exp(masked - m_new[..., None])
                if normalizer == "softpick":
                    z = jnp.where(mask, shifted - jnp.exp(-m_new)[..., None], 0.0)
                    weights, mass = jax.nn.relu(z), jnp.abs(z)
                else:
                    weights = mass = jnp.where(mask, shifted, 0.0)
                denom_new = denom * rescale + jnp.sum(mass, axis=-1)
                acc_new = acc * rescale[..., None] + jnp.einsum(
                    "bngqk,bknd->bngqd", weights, v_blk.astype(dtype))
                return m_new, denom_new, acc_new

            if not causal and not window:
                return update(carry), None
            skip = jnp.zeros((), bool)
            if causal:  # every key after every query
                skip = skip | (ki * bk > qi * bq + bq - 1 + offset)
            if window:  # every key before every query's window
                skip = skip | (qi * bq + offset - (ki * bk + bk - 1) >= window)
            return jax.lax.cond(skip, lambda c: c, update, carry), None

        carry = _initial_carry(normalizer, sink_logits, (b, n, g, bq), d, dtype)
        xs = (jnp.arange(k_blocks.shape[0]), k_blocks, v_blocks, kv_segments)
        (m, denom, acc), _ = jax.lax.scan(jax.checkpoint(step), carry, xs)
        if normalizer == "softpick":
            denom = denom + SOFTPICK_EPS * jnp.exp(-m)
        # [b, n, g, bq, d]; rows that see no key (padding) give 0, not 0 / 0
        return acc / jnp.where(denom == 0, 1.0, denom)[..., None]

    out = jax.lax.map(query_block, (jnp.arange(q_blocks.shape[0]), q_blocks, q_segments))
    out = jnp.einsum("cbngqd->bcqngd", out).reshape(b, -1, h, d)[:, :s]
    return apply_output_gate(out.astype(q.dtype), gate, gate_activation)


attention = checked(trusted_attention)
