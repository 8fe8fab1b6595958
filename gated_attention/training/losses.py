"""Language-model loss: token cross-entropy, optional z-loss, MoE auxiliary losses."""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Iterator

import jax
import jax.numpy as jnp

from gated_attention.parallel.sharding import constrain

# Logical axes of the output table [vocab, d_model] as a parameter (tied embedding, or lm_head
# transposed): where its gradient is kept.
TABLE_LAYOUT = ("vocab", "embed")

# Whether the chunked loss's tile loops are traced unrolled (see `unrolled_tiles`).
_UNROLL_TILES = contextvars.ContextVar("unroll_loss_tiles", default=False)


@contextlib.contextmanager
def unrolled_tiles() -> Iterator[None]:
    """Trace the chunked losses with their tiles (vocabulary or token) one after another
    instead of a loop.

    The same arithmetic; only for programs compiled to be costed (benchmarks/compiled_step.py):
    XLA's cost analysis counts a loop body once whatever its trip count, so a looped loss
    shows one tile. Unrolled, the compiler would see the vocabulary tiles' backward's
    recomputed logits equal to the forward's and compute them once (a program that keeps
    every tile's logits, unlike the looped one): an optimisation barrier on the backward's
    hidden states keeps the recomputation, so the unrolled program does the looped
    program's arithmetic. The token tiles recompute nothing and need no barrier."""
    token = _UNROLL_TILES.set(True)
    try:
        yield
    finally:
        _UNROLL_TILES.reset(token)


def stored_logits_dtype(name: str, compute_dtype: jnp.dtype) -> jnp.dtype:
    """train.logits_dtype ("float32" or "compute") as the dtype the logits matmul writes."""
    return jnp.dtype(compute_dtype if name == "compute" else jnp.float32)


def logits_matmul(x: jax.Array, table: jax.Array, stored: jnp.dtype | None = None
                  ) -> jax.Array:
    """x @ table.T, accumulated in float32 (float64 references: float64) and written in
    `stored` (None: the accumulator's dtype). Readers widen it themselves (`widened`)."""
    return jnp.einsum("bsd,vd->bsv", x, table,
                      preferred_element_type=stored or _accumulator(x, table))


def widened(logits: jax.Array) -> jax.Array:
    """Logits as float32 (float64 stay float64): the compiler fuses the widening into each
    reader, so a bfloat16 product stays the one copy in memory."""
    return logits.astype(jnp.promote_types(jnp.float32, logits.dtype))


def cross_entropy(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                  z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross-entropy over positions where mask is true (float32).

    z_loss adds `z_loss * mean(logsumexp(logits)^2)`, which keeps the softmax normaliser near 1
    (as in PaLM); it is reported separately either way.
    """
    # The target logit picked from the logits as stored and then widened (exact): picked
    # from a widened copy, the compiler stores that float32 copy for the gather.
    target_logit = widened(jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0])
    logits = widened(logits)
    lse = jax.nn.logsumexp(logits, axis=-1)
    weights = mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    nll = jnp.sum((lse - target_logit) * weights) / denom
    z = jnp.sum(jnp.square(lse) * weights) / denom
    loss = nll + z_loss * z
    return loss, {"nll": nll, "z_loss": z, "tokens": jnp.sum(weights)}


def chunked_cross_entropy(x: jax.Array, table: jax.Array, targets: jax.Array,
                          mask: jax.Array, z_loss: float = 0.0, chunk_size: int = 8192,
                          logits_dtype: jnp.dtype | None = None
                          ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy(x @ table.T, ...)` without the float32 logits [b, s, vocab] at once.

    x: the final hidden states [b, s, d]; table: the output projection as [vocab, d] (the tied
    embedding, or lm_head transposed). The vocabulary is cut into tiles of `chunk_size`
    entries: the forward keeps a running logsumexp over the tiles, the backward recomputes
    each tile's logits and writes that tile's part of the table's gradient whole (one
    rounding to the table's dtype, as the plain loss), while x's gradient adds up in float32
    ([b, s, d], small). Peak: one float32 [b, s, chunk_size] tile instead of [b, s, vocab].
    logits_dtype: what each tile's logits matmul writes (`logits_matmul`; None: float32).
    """
    vocab = table.shape[0]
    chunk = max(1, min(int(chunk_size), vocab))
    weights = mask.astype(_accumulator(x, table))
    nll_sum, z_sum = _tiled_sums(x, table, targets, weights, chunk, logits_dtype)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    nll, z = nll_sum / denom, z_sum / denom
    return nll + z_loss * z, {"nll": nll, "z_loss": z, "tokens": jnp.sum(weights)}


def _accumulator(x: jax.Array, table: jax.Array) -> jnp.dtype:
    """float32 for bfloat16/float32 inputs; float64 ones (references) stay float64."""
    return jnp.promote_types(jnp.float32, jnp.result_type(x, table))


def _tiles(size: int, chunk: int) -> tuple[int, int]:
    return -(-size // chunk), chunk


def _tile(a: jax.Array, i: jax.Array, chunk: int, axis: int = 0
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Tile i of `a` along `axis` (the table's vocabulary rows, or the sequence), its first
    index and which of its entries are its own.

    The last tile is clamped to end at the axis's end (no padded copy); the entries it shares
    with the tile before it are not its own (counted there).
    """
    start = jnp.minimum(i * chunk, a.shape[axis] - chunk)
    part = jax.lax.dynamic_slice_in_dim(a, start, chunk, axis=axis)
    return part, start, start + jnp.arange(chunk) >= i * chunk


def _forward_sums(x, table, targets, weights, chunk, stored):
    tiles, _ = _tiles(table.shape[0], chunk)
    shape, acc = targets.shape, _accumulator(x, table)
    neg = jnp.full(shape, -jnp.inf, acc)

    def body(i, carry):
        running_max, running_sum, target_logit = carry
        rows, start, own = _tile(table, i, chunk)
        logits = jnp.where(own, widened(logits_matmul(x, rows, stored)), -jnp.inf)
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


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _tiled_sums(x, table, targets, weights, chunk, stored):
    return _forward_sums(x, table, targets, weights, chunk, stored)[0]


def _tiled_sums_fwd(x, table, targets, weights, chunk, stored):
    sums, lse = _forward_sums(x, table, targets, weights, chunk, stored)
    return sums, (x, table, targets, weights, lse)


def _tiled_sums_bwd(chunk, stored, residuals, cotangents):
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
        logits = widened(logits_matmul(x, rows, stored))
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


def token_tiled_cross_entropy(x: jax.Array, table: jax.Array, targets: jax.Array,
                              mask: jax.Array, z_loss: float = 0.0, chunk_size: int = 2048,
                              logits_dtype: jnp.dtype | None = None
                              ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """`cross_entropy(x @ table.T, ...)` a few sequence positions at a time, with the
    gradient computed in the forward pass (as Liger-Kernel's fused linear cross-entropy).

    The sequence is cut into tiles of `chunk_size` positions (every batch row in each tile,
    so a tile keeps the batch's sharding). One tile's float32 logits [b, chunk, vocab] hold
    whole rows of the softmax: its log-sum-exp, target logit and, for a unit cotangent of
    the summed loss, its dlogits at once. The forward then writes the tile's dx in x's dtype
    and adds the tile's table gradient (rounded to the table's dtype in the parameter's
    layout, added up in float32): no logits are recomputed, the logits matmul runs once and
    its two gradient matmuls once each, as in the plain loss. The backward only scales the
    stored gradients by the incoming cotangent. Without a gradient (eval), the forward
    computes the sums alone. nll and z_loss are reported with their gradient stopped; the
    returned loss carries it. logits_dtype: what each tile's logits matmul writes
    (`logits_matmul`; None: float32).
    """
    seq = x.shape[1]
    chunk = max(1, min(int(chunk_size), seq))
    weights = mask.astype(_accumulator(x, table))
    loss_sum, nll_sum, z_sum = _token_tiled_sums(x, table, targets, weights, chunk,
                                                 float(z_loss), logits_dtype)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    nll = jax.lax.stop_gradient(nll_sum) / denom
    z = jax.lax.stop_gradient(z_sum) / denom
    return loss_sum / denom, {"nll": nll, "z_loss": z, "tokens": jnp.sum(weights)}


def _token_tile_stats(x_tile: jax.Array, table: jax.Array, targets_tile: jax.Array,
                      stored: jnp.dtype | None
                      ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """A tile's float32 logits [b, chunk, vocab], their log-sum-exp, target logit and the
    one-hot mask of the targets.

    The target logit is a masked sum over the vocabulary (exact: one value and zeros), a
    reduction the compiler fuses with the log-sum-exp's, so the stored logits are read once
    for both; a gather of it would be a pass of its own over the whole tile."""
    logits = widened(logits_matmul(x_tile, table, stored))
    hit = targets_tile[..., None] == jnp.arange(table.shape[0])
    target_logit = jnp.sum(jnp.where(hit, logits, 0.0), axis=-1)
    lse = jax.nn.logsumexp(logits, axis=-1)
    return logits, lse, target_logit, hit


def _token_tiled_forward(x: jax.Array, table: jax.Array, targets: jax.Array,
                         weights: jax.Array, chunk: int, z_loss: float, with_grads: bool,
                         stored: jnp.dtype | None
                         ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(nll_sum, z_sum) and, with_grads, d(nll_sum + z_loss z_sum) / (dx, dtable)."""
    acc = _accumulator(x, table)
    tiles, _ = _tiles(x.shape[1], chunk)

    def body(i: jax.Array, carry: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        nll_sum, z_sum, dx, dtable = carry
        x_tile, start, own = _tile(x, i, chunk, axis=1)
        targets_tile = _tile(targets, i, chunk, axis=1)[0]
        w = jnp.where(own, _tile(weights, i, chunk, axis=1)[0], 0.0)  # each position once
        logits, lse, target_logit, hit = _token_tile_stats(x_tile, table, targets_tile,
                                                           stored)
        nll_sum = nll_sum + jnp.sum((lse - target_logit) * w)
        z_sum = z_sum + jnp.sum(jnp.square(lse) * w)
        if not with_grads:
            return nll_sum, z_sum, dx, dtable
        # d/dlogit_v of w (lse - logit_target) + z_loss w lse^2 = w ((1 + 2 z_loss lse) p_v
        # - [v = target]).
        p = jnp.exp(logits - lse[..., None])
        dlogits = (w * (1.0 + 2.0 * z_loss * lse))[..., None] * p - jnp.where(
            hit, w[..., None], 0.0)
        dlogits = dlogits.astype(x.dtype)
        dx_tile = jnp.einsum("bsv,vd->bsd", dlogits, table, preferred_element_type=acc)
        # The clamped last tile's shared positions carry 0 here: add, do not overwrite.
        dx_tile = dx_tile.astype(x.dtype) + jax.lax.dynamic_slice_in_dim(dx, start, chunk, 1)
        dx = jax.lax.dynamic_update_slice_in_dim(dx, dx_tile, start, axis=1)
        # Summed over the tile's tokens in the table's dtype (float32 inside the matmul), in
        # the table parameter's sharded layout: each tile's gradient is reduce-scattered in
        # that dtype, then added up in float32 on the shard.
        drows = constrain(jnp.einsum("bsv,bsd->vd", dlogits, x_tile,
                                     preferred_element_type=table.dtype), TABLE_LAYOUT)
        dtable = constrain(dtable + drows.astype(acc), TABLE_LAYOUT)
        return nll_sum, z_sum, dx, dtable

    zero = jnp.zeros((), acc)
    if with_grads:
        dx = jnp.zeros_like(x)
        dtable = constrain(jnp.zeros(table.shape, acc), TABLE_LAYOUT)
    else:
        dx = dtable = zero
    return jax.lax.fori_loop(0, tiles, body, (zero, zero, dx, dtable),
                             unroll=_UNROLL_TILES.get())


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _token_tiled_sums(x: jax.Array, table: jax.Array, targets: jax.Array, weights: jax.Array,
                      chunk: int, z_loss: float, stored: jnp.dtype | None
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(nll_sum + z_loss z_sum, nll_sum, z_sum); only the first is differentiable."""
    nll_sum, z_sum, _, _ = _token_tiled_forward(x, table, targets, weights, chunk, z_loss,
                                                with_grads=False, stored=stored)
    return nll_sum + z_loss * z_sum, nll_sum, z_sum


def _token_tiled_sums_fwd(x: jax.Array, table: jax.Array, targets: jax.Array,
                          weights: jax.Array, chunk: int, z_loss: float,
                          stored: jnp.dtype | None
                          ) -> tuple[tuple[jax.Array, ...], tuple[jax.Array, ...]]:
    nll_sum, z_sum, dx, dtable = _token_tiled_forward(x, table, targets, weights, chunk,
                                                      z_loss, with_grads=True, stored=stored)
    # A zero-size array of the table's dtype: residuals are arrays.
    return (nll_sum + z_loss * z_sum, nll_sum, z_sum), (dx, dtable, jnp.zeros(0, table.dtype))


def _token_tiled_sums_bwd(chunk: int, z_loss: float, stored: jnp.dtype | None,
                          residuals: tuple[jax.Array, ...],
                          cotangents: tuple[jax.Array, ...]) -> tuple[jax.Array | None, ...]:
    # nll_sum and z_sum are reported with their gradient stopped: their cotangents are 0.
    dx, dtable, table_dtype = residuals
    g = cotangents[0].astype(dtable.dtype)
    dx = (dx.astype(dtable.dtype) * g).astype(dx.dtype)
    dtable = constrain((dtable * g).astype(table_dtype.dtype), TABLE_LAYOUT)
    return dx, dtable, None, None


_token_tiled_sums.defvjp(_token_tiled_sums_fwd, _token_tiled_sums_bwd)
