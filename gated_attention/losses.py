"""Language-model loss: token cross-entropy, optional z-loss, MoE auxiliary losses."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from gated_attention.sharding import constrain

# Logical axes of the output table [vocab, d_model] as a parameter (tied embedding, or lm_head
# transposed): where its gradient is kept.
TABLE_LAYOUT = ("vocab", "embed")

# Whether the chunked loss's tile loops are traced unrolled (see `unrolled_tiles`).
_UNROLL_TILES = contextvars.ContextVar("unroll_loss_tiles", default=False)


@contextlib.contextmanager
def unrolled_tiles() -> Iterator[None]:
    """Trace the chunked loss with its vocabulary tiles one after another instead of a loop.

    The same arithmetic; only for programs compiled to be costed (benchmarks/compiled_step.py):
    XLA's cost analysis counts a loop body once whatever its trip count, so the looped loss
    shows one tile of its forward and one of its backward. Unrolled, the compiler would see
    the backward's recomputed tile logits equal to the forward's and compute them once (a
    program that keeps every tile's logits, unlike the looped one): an optimisation barrier
    on the backward's hidden states keeps the recomputation, so the unrolled program does
    the looped program's arithmetic."""
    token = _UNROLL_TILES.set(True)
    try:
        yield
    finally:
        _UNROLL_TILES.reset(token)


def cross_entropy(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                  z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross-entropy over positions where mask is true (float32).

    z_loss adds `z_loss * mean(logsumexp(logits)^2)`, which keeps the softmax normaliser near 1
    (as in PaLM); it is reported separately either way.
    """
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    weights = mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    nll = jnp.sum((lse - target_logit) * weights) / denom
    z = jnp.sum(jnp.square(lse) * weights) / denom
    loss = nll + z_loss * z
    return loss, {"nll": nll, "z_loss": z, "tokens": jnp.sum(weights)}


def chunked_cross_entropy(x: jax.Array, table: jax.Array, targets: jax.Array,
                          mask: jax.Array, z_loss: float = 0.0, chunk_size: int = 8192
                          ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy(x @ table.T, ...)` without the float32 logits [b, s, vocab] at once.

    x: the final hidden states [b, s, d]; table: the output projection as [vocab, d] (the tied
    embedding, or lm_head transposed). The vocabulary is cut into tiles of `chunk_size`
    entries: the forward keeps a running logsumexp over the tiles, the backward recomputes
    each tile's logits and writes that tile's part of the table's gradient whole (one
    rounding to the table's dtype, as the plain loss), while x's gradient adds up in float32
    ([b, s, d], small). Peak: one float32 [b, s, chunk_size] tile instead of [b, s, vocab].
    """
    vocab = table.shape[0]
    chunk = max(1, min(int(chunk_size), vocab))
    weights = mask.astype(_accumulator(x, table))
    nll_sum, z_sum = _tiled_sums(x, table, targets, weights, chunk)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    nll, z = nll_sum / denom, z_sum / denom
    return nll + z_loss * z, {"nll": nll, "z_loss": z, "tokens": jnp.sum(weights)}


def _accumulator(x: jax.Array, table: jax.Array) -> jnp.dtype:
    """float32 for bfloat16/float32 inputs; float64 ones (references) stay float64."""
    return jnp.promote_types(jnp.float32, jnp.result_type(x, table))


def _tiles(vocab: int, chunk: int) -> tuple[int, int]:
    return -(-vocab // chunk), chunk


def _tile(table: jax.Array, i: jax.Array, chunk: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Tile i of the table, its first column and which of its columns are its own.

    The last tile is clamped to end at the vocabulary's end (no padded copy of the table);
    the columns it shares with the tile before it are not its own.
    """
    vocab = table.shape[0]
    start = jnp.minimum(i * chunk, vocab - chunk)
    rows = jax.lax.dynamic_slice_in_dim(table, start, chunk, axis=0)
    columns = start + jnp.arange(chunk)
    return rows, start, columns >= i * chunk


def _tile_logits(x: jax.Array, rows: jax.Array) -> jax.Array:
    return jnp.einsum("bsd,vd->bsv", x, rows, preferred_element_type=_accumulator(x, rows))


def _forward_sums(x, table, targets, weights, chunk):
    tiles, _ = _tiles(table.shape[0], chunk)
    shape, acc = targets.shape, _accumulator(x, table)
    neg = jnp.full(shape, -jnp.inf, acc)

    def body(i, carry):
        running_max, running_sum, target_logit = carry
        rows, start, own = _tile(table, i, chunk)
        logits = jnp.where(own, _tile_logits(x, rows), -jnp.inf)
        new_max = jnp.maximum(running_max, jnp.max(logits, axis=-1))
        running_sum = (running_sum * jnp.exp(running_max - new_max)
                       + jnp.sum(jnp.exp(logits - new_max[..., None]), axis=-1))
        hit = (targets[..., None] - start) == jnp.arange(chunk)
        target_logit = target_logit + jnp.sum(jnp.where(hit & own, logits, 0.0), axis=-1)
        return new_max, running_sum, target_logit

    zeros = jnp.zeros(shape, acc)
    running_max, running_sum, target_logit = jax.lax.fori_loop(
        0, tiles, body, (neg, zeros, zeros), unroll=_UNROLL_TILES.get())
    lse = running_max + jnp.log(running_sum)
    nll_sum = jnp.sum((lse - target_logit) * weights)
    z_sum = jnp.sum(jnp.square(lse) * weights)
    return (nll_sum, z_sum), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _tiled_sums(x, table, targets, weights, chunk):
    return _forward_sums(x, table, targets, weights, chunk)[0]


def _tiled_sums_fwd(x, table, targets, weights, chunk):
    sums, lse = _forward_sums(x, table, targets, weights, chunk)
    return sums, (x, table, targets, weights, lse)


def _tiled_sums_bwd(chunk, residuals, cotangents):
    x, table, targets, weights, lse = residuals
    g_nll, g_z = cotangents
    tiles, _ = _tiles(table.shape[0], chunk)
    acc = _accumulator(x, table)
    # d nll_sum / d logit_v = w (p_v - [v = target]); d z_sum / d logit_v = w 2 lse p_v.
    scale_p = weights * (g_nll + 2.0 * g_z * lse)
    scale_t = weights * g_nll
    if _UNROLL_TILES.get():  # keep the recomputation when the tiles are unrolled (see there)
        x = jax.lax.optimization_barrier(x)

    def body(i, carry):
        dx, dtable = carry
        rows, start, own = _tile(table, i, chunk)
        logits = _tile_logits(x, rows)
        p = jnp.exp(logits - lse[..., None])
        hit = (targets[..., None] - start) == jnp.arange(chunk)
        dlogits = scale_p[..., None] * p - jnp.where(hit, scale_t[..., None], 0.0)
        dlogits = jnp.where(own, dlogits, 0.0)
        dx = dx + jnp.einsum("bsv,vd->bsd", dlogits.astype(rows.dtype), rows,
                             preferred_element_type=acc)
        # Summed over the batch in the table's dtype (float32 inside the matmul), in the
        # table parameter's sharded layout: the compiler reduce-scatters each tile's gradient
        # in that dtype instead of all-reducing it in float32.
        drows = constrain(jnp.einsum("bsv,bsd->vd", dlogits.astype(x.dtype), x,
                                     preferred_element_type=table.dtype), TABLE_LAYOUT)
        # The clamped last tile's shared columns carry 0 here: add, do not overwrite.
        drows = drows + jax.lax.dynamic_slice_in_dim(dtable, start, chunk, 0)
        dtable = jax.lax.dynamic_update_slice_in_dim(dtable, drows, start, axis=0)
        return dx, constrain(dtable, TABLE_LAYOUT)

    zeros = constrain(jnp.zeros_like(table), TABLE_LAYOUT)
    dx, dtable = jax.lax.fori_loop(0, tiles, body, (jnp.zeros(x.shape, acc), zeros),
                                   unroll=_UNROLL_TILES.get())
    return dx.astype(x.dtype), dtable, None, None


_tiled_sums.defvjp(_tiled_sums_fwd, _tiled_sums_bwd)
