"""Flash attention for TPUs in Pallas (Mosaic), with the G1 gate fused in.

Head-major layout [batch, heads, seq, head_dim] so every tile's last two dims are (rows,
head_dim), as the MXU wants. The kv axis is the innermost "arbitrary" grid axis with running
max/denominator/accumulator in VMEM scratch; `pl.when` skips tiles outside the [lo, hi)
range of kv blocks that hold a visible key (causal diagonal, sliding window, segment
ranges), and the k/v index maps clamp to that range so skipped tiles are not even copied in.
Under a causal sliding window of W keys the inner grid axis is shortened to the ceil((block
+ W - 1) / other block) + 1 blocks a window can touch, walked from each block's lo
(_flash_common.window_steps), so the grid's length no longer grows with the sequence.
Backward: a dq kernel over (q block, kv block) and a dk/dv kernel whose innermost axis walks
every query head of the kv head's GQA group and every q block, so k/v are never repeated.
The dk/dv kernel works on transposed tiles (keys on rows, queries on lanes), so per-query
statistics broadcast as rows and every matmul is a plain or right-transposed product.

Per-row vectors (lse, delta, segment ids, headwise gate) live in HBM lane-dense, one row per
tile ([..., S // block, 1, block], see `_rows`): a [..., S, 1] column would be padded to 128
lanes in TPU memory and copied 128x over. Kernels that need a column reshape the row
in-kernel, once per tile.

When compiled for a CPU (interpret=None) the kernels run in interpret mode.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from gated_attention.ops import _flash_common as fc

NAME = "pallas_tpu"
MIN_BLOCK = 8  # sublane tile; real TPUs want multiples of 128 (see ops/block_sizes.py)
# Block index 0 as an int32: a Python 0 becomes an int64 under jax_enable_x64, which Mosaic
# refuses in an index map.
_0 = np.int32(0)


def _mask(p: fc.Problem, i, j, bq: int, bkv: int, q_seg, k_seg, transposed: bool = False):
    """Visibility of tile (i, j): [bq, bkv] with q_seg [bq, 1] and k_seg [1, bkv], or, when
    transposed, [bkv, bq] with q_seg [1, bq] and k_seg [bkv, 1]."""
    shape, q_axis = ((bkv, bq), 1) if transposed else ((bq, bkv), 0)
    q_pos = i * bq + jax.lax.broadcasted_iota(jnp.int32, shape, q_axis)
    k_pos = j * bkv + jax.lax.broadcasted_iota(jnp.int32, shape, 1 - q_axis)
    mask = k_pos < p.seq
    if p.causal:
        mask = mask & (q_pos >= k_pos)
    if p.window:
        mask = mask & (q_pos - k_pos < p.window)
    if q_seg is not None:
        mask = mask & (q_seg == k_seg)
    return mask


def _nt(a, b):
    """a @ b^T with float32 accumulation."""
    return jax.lax.dot_general(a, b, (((1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _nn(a, b):
    return jax.lax.dot_general(a, b, (((1,), (0,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _rem(a, n: int):
    return jax.lax.rem(a, jnp.asarray(n, a.dtype))


def _clamp(j, lo, hi):
    """Block index to fetch: skipped steps re-use a neighbouring block (no new copy)."""
    return jnp.minimum(jnp.maximum(j, lo), jnp.maximum(hi - 1, lo))


def _kv_index(t, lo, steps: int, n: int):
    """Block index of grid step t along the inner axis: t itself over the full axis, or, on
    an axis shortened to the window's `steps` (fc.window_steps), the t-th block from lo."""
    return t if steps == n else lo + t


def _column(row: jax.Array) -> jax.Array:
    """A lane-dense [1, n] row as the [n, 1] column a q-major tile broadcasts against.

    Through float32 (ints stay int32): Mosaic reshapes 32-bit rows into columns on every
    generation, 16-bit ones not at every length.
    """
    if row.dtype.itemsize < 4:
        row = row.astype(jnp.float32)
    return row.reshape(row.shape[-1], 1)


def _weights_and_dlogits(p: fc.Problem, q, k, v, do, mask, lse, delta, transposed: bool):
    """A tile's weights recomputed from lse, and the logits' gradient: [bq, bkv] with lse and
    delta as [bq, 1] columns, or [bkv, bq] (keys on rows) with them as [1, bq] rows."""
    if transposed:
        x, dw = _nt(k, q), _nt(v, do)
    else:
        x, dw = _nt(q, k), _nt(do, v)
    return fc.weights_and_dlogits(x * p.scale2, mask, lse, dw, delta, p.normalizer)


def _when_kv_visible(p: fc.Problem, step, i, j, lo, hi, bq: int, bkv: int) -> None:
    """step(masked) on kv block j if it is in [lo, hi); tiles needing no mask skip it."""
    visible = (j >= lo) & (j < hi)
    if p.has_segments:
        pl.when(visible)(functools.partial(step, True))
        return
    start = fc.unmasked_kv_start(p, i, bq, bkv, lo)
    end = fc.unmasked_kv_end(p, i, bq, bkv, hi)
    free = (j >= start) & (j < end)
    pl.when(visible & free)(functools.partial(step, False))
    pl.when(visible & jnp.logical_not(free))(functools.partial(step, True))


def _fwd_kernel(lo_ref, hi_ref,  # scalar prefetch
                q_ref, k_ref, v_ref, qseg_ref, kseg_ref, gate_ref, sink_ref,  # inputs
                out_ref, lse_ref, o_ref,  # outputs
                m_ref, l_ref, acc_ref, qseg_col,  # scratch
                *, p: fc.Problem, bq: int, bkv: int, nq: int, nkv: int, steps: int):
    """A ref an option leaves out is None: segment ids, gate, sink; lse without residuals;
    o unless the ungated output is stored (fc.stores_ungated); qseg_col without segments."""
    b, h, i, t = (pl.program_id(a) for a in range(4))
    lo, hi = lo_ref[b * nq + i], hi_ref[b * nq + i]
    j = _kv_index(t, lo, steps, nkv)
    sink = None if sink_ref is None else sink_ref[h].astype(jnp.float32) * fc.LOG2E

    @pl.when(t == 0)
    def _init():
        m_ref[...] = fc.initial_max(p.normalizer, bq, sink)
        l_ref[...] = jnp.zeros_like(l_ref)
        acc_ref[...] = jnp.zeros_like(acc_ref)
        if qseg_col is not None:
            qseg_col[...] = _column(qseg_ref[...])

    def step(masked: bool):
        q, k, v = q_ref[...], k_ref[...], v_ref[...]
        x = _nt(q, k) * p.scale2
        mask = None
        if masked:
            q_seg = None if qseg_col is None else qseg_col[...]
            k_seg = None if kseg_ref is None else kseg_ref[...]
            mask = _mask(p, i, j, bq, bkv, q_seg, k_seg)
        m, corr, weights, mass = fc.online_block(x, mask, m_ref[...], p.normalizer)
        m_ref[...] = m
        l_ref[...] = l_ref[...] * corr + mass
        acc_ref[...] = acc_ref[...] * corr + _nn(weights.astype(v.dtype), v)

    _when_kv_visible(p, step, i, j, lo, hi, bq, bkv)

    @pl.when(t == steps - 1)
    def _write():
        o, lse = fc.finalize(acc_ref[...], m_ref[...], l_ref[...], p.normalizer, sink)
        out = o
        if p.gate_kind == "elementwise":
            out = o * fc.gate_scores(gate_ref[...], p.gate_activation)
        elif p.gate_kind == "headwise":  # one score per row: a [bq, 1] column
            out = o * fc.gate_scores(_column(gate_ref[...]), p.gate_activation)
        out_ref[...] = out.astype(out_ref.dtype)
        if lse_ref is not None:
            lse_ref[...] = lse.reshape(1, bq)
        if o_ref is not None:
            o_ref[...] = o.astype(o_ref.dtype)


def _dq_kernel(lo_ref, hi_ref,  # scalar prefetch
               q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref,  # inputs
               dq_ref,  # output
               acc_ref, lse_col, delta_col, qseg_col,  # scratch
               *, p: fc.Problem, bq: int, bkv: int, nq: int, nkv: int, steps: int):
    """Segment-id refs are None without segment ids."""
    b, i, t = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    lo, hi = lo_ref[b * nq + i], hi_ref[b * nq + i]
    j = _kv_index(t, lo, steps, nkv)

    @pl.when(t == 0)
    def _init():  # the q block's row statistics as columns, once for all its kv steps
        acc_ref[...] = jnp.zeros_like(acc_ref)
        lse_col[...] = _column(lse_ref[...])
        delta_col[...] = _column(delta_ref[...])
        if qseg_col is not None:
            qseg_col[...] = _column(qseg_ref[...])

    def step(masked: bool):
        k = k_ref[...]
        mask = None
        if masked:
            q_seg = None if qseg_col is None else qseg_col[...]
            k_seg = None if kseg_ref is None else kseg_ref[...]
            mask = _mask(p, i, j, bq, bkv, q_seg, k_seg)
        _, dx = _weights_and_dlogits(p, q_ref[...], k, v_ref[...], do_ref[...], mask,
                                     lse_col[...], delta_col[...], transposed=False)
        acc_ref[...] += _nn(dx.astype(k.dtype), k)

    _when_kv_visible(p, step, i, j, lo, hi, bq, bkv)

    @pl.when(t == steps - 1)
    def _write():
        dq_ref[...] = (acc_ref[...] * p.scale).astype(dq_ref.dtype)


def _dkv_kernel(lo_ref, hi_ref,  # scalar prefetch
                q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, qseg_ref, kseg_ref,  # inputs
                dk_ref, dv_ref,  # outputs
                dk_acc, dv_acc, kseg_col,  # scratch
                *, p: fc.Problem, bq: int, bkv: int, nq: int, nkv: int, steps: int):
    """Transposed tiles [bkv, bq]: lse, delta and the q segment ids broadcast as rows.
    Segment-id refs are None without segment ids."""
    b, j, r = pl.program_id(0), pl.program_id(2), pl.program_id(3)
    lo, hi = lo_ref[b * nkv + j], hi_ref[b * nkv + j]
    i = _kv_index(_rem(r, steps), lo, steps, nq)  # the q block of this step

    @pl.when(r == 0)
    def _init():
        dk_acc[...] = jnp.zeros_like(dk_acc)
        dv_acc[...] = jnp.zeros_like(dv_acc)
        if kseg_col is not None:
            kseg_col[...] = _column(kseg_ref[...])

    def step(masked: bool):
        q, do = q_ref[...], do_ref[...]
        mask = None
        if masked:
            q_seg = None if qseg_ref is None else qseg_ref[...]
            k_seg = None if kseg_col is None else kseg_col[...]
            mask = _mask(p, i, j, bq, bkv, q_seg, k_seg, transposed=True)
        w, dx = _weights_and_dlogits(p, q, k_ref[...], v_ref[...], do, mask, lse_ref[...],
                                     delta_ref[...], transposed=True)
        dv_acc[...] += _nn(w.astype(do.dtype), do)
        dk_acc[...] += _nn(dx.astype(q.dtype), q)

    visible = (i >= lo) & (i < hi)
    if p.has_segments:
        pl.when(visible)(functools.partial(step, True))
    else:  # q blocks from `start` on see every key of this kv block
        start = fc.unmasked_q_start(p, j, bq, bkv, lo)
        end = fc.unmasked_q_end(p, j, bq, bkv, hi)
        free = (i >= start) & (i < end)
        pl.when(visible & jnp.logical_not(free))(functools.partial(step, True))
        pl.when(visible & free)(functools.partial(step, False))

    @pl.when(r == p.group * steps - 1)
    def _write():
        dk_ref[...] = (dk_acc[...] * p.scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_acc[...].astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- launchers


def _head_major(p: fc.Problem, x):
    """[b, s, h, d] -> padded [b, h, S, D]."""
    return fc.pad_axis(fc.pad_axis(jnp.swapaxes(x, 1, 2), 2, p.padded), 3, p.padded_dim)


def _seq_major(p: fc.Problem, x):
    return jnp.swapaxes(x[:, :, :p.seq, :p.head_dim], 1, 2)


def _rows(x: jax.Array, block: int) -> jax.Array:
    """[..., S] -> [..., S // block, 1, block]: one lane-dense row per tile.

    A (1, block) block is then the whole of its array's last two dims, which Mosaic accepts
    for any block size (a (1, block) slice of a [..., 1, S] row needs block % 128 == 0).
    """
    return x.reshape(*x.shape[:-1], x.shape[-1] // block, 1, block)


def _stats(p: fc.Problem, x: jax.Array, block: int, pad_value=0.0) -> jax.Array:
    """A per-row statistic [b, h, s] as the kernels read it: padded to S, float32 rows."""
    return _rows(fc.pad_axis(x.astype(jnp.float32), 2, p.padded, pad_value), block)


def _segments(p: fc.Problem, seg, bq: int, bkv: int):
    """(padded ids [b, S], q rows [b, S // bq, 1, bq], kv rows [b, S // bkv, 1, bkv]) or
    Nones."""
    if seg is None:
        return None, None, None
    segp = fc.pad_axis(seg.astype(jnp.int32), 1, p.padded, -1)
    return segp, _rows(segp, bq), _rows(segp, bkv)


def _call(kernel, static: fc.Static, grid, in_specs, out_specs, out_shape, scratch, name):
    def run(*args):
        return pl.pallas_call(
            kernel,
            grid_spec=pltpu.PrefetchScalarGridSpec(
                num_scalar_prefetch=2, grid=grid, in_specs=in_specs, out_specs=out_specs,
                scratch_shapes=scratch),
            out_shape=out_shape,
            compiler_params=pltpu.CompilerParams(
                dimension_semantics=(pltpu.PARALLEL,) * 3 + (pltpu.ARBITRARY,)),
            interpret=(pltpu.InterpretParams() if static.interpret is True
                       else bool(static.interpret)),
            cost_estimate=fc.cost_estimate(static.problem, name),
            name=name,
        )(*args)

    return run


def _q_major_specs(p: fc.Problem, bq: int, bkv: int, nq: int, steps: int, nkv: int):
    """BlockSpecs of a grid (b, h, q block, kv block), as the forward and dq kernels use it:
    q rows, per-row statistics (one lane-dense row per q block), kv blocks (clamped into the
    visible range, so skipped steps copy nothing new) and, with segment ids, the q and kv
    blocks' ids (rows; Nones without them, as the kernels take them)."""
    g, D = p.group, p.padded_dim

    def kv_block(b_, h_, i, t, lo_, hi_):
        lo, hi = lo_[b_ * nq + i], hi_[b_ * nq + i]
        return (b_, fc.index_div(h_, g), _clamp(_kv_index(t, lo, steps, nkv), lo, hi), _0)

    row = pl.BlockSpec((None, None, bq, D), lambda b_, h_, i, j, *_: (b_, h_, i, _0))
    stat = pl.BlockSpec((None, None, None, 1, bq),
                        lambda b_, h_, i, j, *_: (b_, h_, i, _0, _0))
    kv = pl.BlockSpec((None, None, bkv, D), kv_block)
    seg = [None, None]
    if p.has_segments:
        seg = [pl.BlockSpec((None, None, 1, bq), lambda b_, h_, i, j, *_: (b_, i, _0, _0)),
               pl.BlockSpec((None, None, 1, bkv), lambda *a: (a[0], kv_block(*a)[2], _0, _0))]
    return row, stat, kv, seg


def _forward(static: fc.Static, q, k, v, seg, gate, sink, residuals: bool):
    p = static.problem
    bq, bkv = static.size("block_q"), static.size("block_kv")
    b, h, S, D = p.batch, p.heads, p.padded, p.padded_dim
    nq, nkv = S // bq, S // bkv
    segp, qseg, kseg = _segments(p, seg, bq, bkv)
    lo, hi, _, _ = fc.block_ranges(segp, b, S, p.seq, bq, bkv, p.causal, p.window)
    steps = fc.window_steps(p, bq, bkv, nkv)
    row, stat, kv, seg_specs = _q_major_specs(p, bq, bkv, nq, steps, nkv)
    gate_spec = gate_arg = sink_spec = sink_arg = None
    if p.gate_kind == "elementwise":
        gate_spec, gate_arg = row, _head_major(p, gate)
    elif p.gate_kind == "headwise":
        gate_spec, gate_arg = stat, _rows(fc.pad_axis(jnp.swapaxes(gate, 1, 2), 2, S), bq)
    if p.normalizer == "learned_sink":
        sink_spec = pl.BlockSpec((h,), lambda *_: (_0,), memory_space=pltpu.SMEM)
        sink_arg = sink.astype(jnp.float32)
    in_specs = [row, kv, kv, *seg_specs, gate_spec, sink_spec]
    args = [_head_major(p, q), _head_major(p, k), _head_major(p, v), qseg, kseg, gate_arg,
            sink_arg]

    ungated = residuals and fc.stores_ungated(p)
    out_shape = [jax.ShapeDtypeStruct((b, h, S, D), q.dtype),
                 jax.ShapeDtypeStruct((b, h, nq, 1, bq), jnp.float32) if residuals else None,
                 jax.ShapeDtypeStruct((b, h, S, D), q.dtype) if ungated else None]
    out_specs = [row, stat if residuals else None, row if ungated else None]
    scratch = [pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
               pltpu.VMEM((bq, D), jnp.float32),
               pltpu.VMEM((bq, 1), jnp.int32) if segp is not None else None]
    kernel = functools.partial(_fwd_kernel, p=p, bq=bq, bkv=bkv, nq=nq, nkv=nkv, steps=steps)
    outs = _call(kernel, static, (b, h, nq, steps), in_specs, out_specs, out_shape, scratch,
                 "gated_flash_fwd")(lo.reshape(-1), hi.reshape(-1), *args)
    out = _seq_major(p, outs[0])
    if not residuals:
        return out, None, None
    lse = outs[1].reshape(b, h, S)[:, :, :p.seq]
    o = _seq_major(p, outs[2]) if ungated else out
    return out, lse, o


def _backward(static: fc.Static, q, k, v, seg, sink, do, lse, delta):
    del sink  # its effect is inside lse
    p = static.problem
    b, h, n, S, D, g = p.batch, p.heads, p.kv_heads, p.padded, p.padded_dim, p.group
    qh, kh, vh, doh = (_head_major(p, x) for x in (q, k, v, do))

    # dq: grid (b, h, q block, kv block)
    bq, bkv = static.size("block_q_dq"), static.size("block_kv_dq")
    nq, nkv = S // bq, S // bkv
    segp, qseg, kseg = _segments(p, seg, bq, bkv)
    lo, hi, _, _ = fc.block_ranges(segp, b, S, p.seq, bq, bkv, p.causal, p.window)
    steps = fc.window_steps(p, bq, bkv, nkv)
    row, stat, kv, seg_specs = _q_major_specs(p, bq, bkv, nq, steps, nkv)
    scratch = [pltpu.VMEM((bq, D), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
               pltpu.VMEM((bq, 1), jnp.float32),
               pltpu.VMEM((bq, 1), jnp.int32) if segp is not None else None]
    kernel = functools.partial(_dq_kernel, p=p, bq=bq, bkv=bkv, nq=nq, nkv=nkv, steps=steps)
    dq = _call(kernel, static, (b, h, nq, steps), [row, kv, kv, row, stat, stat, *seg_specs], row,
               jax.ShapeDtypeStruct((b, h, S, D), q.dtype), scratch, "gated_flash_dq")(
                   lo.reshape(-1), hi.reshape(-1), qh, kh, vh, doh,
                   _stats(p, lse, bq, fc.EMPTY_ROW_LSE), _stats(p, delta, bq), qseg, kseg)

    # dk, dv: grid (b, kv head, kv block, group member x q block), tiles transposed
    bq, bkv = static.size("block_q_dkv"), static.size("block_kv_dkv")
    nq, nkv = S // bq, S // bkv
    segp, qseg, kseg = _segments(p, seg, bq, bkv)
    _, _, qlo, qhi = fc.block_ranges(segp, b, S, p.seq, bq, bkv, p.causal, p.window)
    steps = fc.window_steps(p, bkv, bq, nq)

    def q_block(b_, n_, j, r, lo_, hi_):
        lo, hi = lo_[b_ * nkv + j], hi_[b_ * nkv + j]
        i = _clamp(_kv_index(_rem(r, steps), lo, steps, nq), lo, hi)
        return (b_, n_ * g + fc.index_div(r, steps), i, _0)

    qrow = pl.BlockSpec((None, None, bq, D), q_block)
    qstat = pl.BlockSpec((None, None, None, 1, bq), lambda *a: (*q_block(*a), _0))
    kvrow = pl.BlockSpec((None, None, bkv, D), lambda b_, n_, j, r, *_: (b_, n_, j, _0))
    seg_specs = [None, None]
    scratch = [pltpu.VMEM((bkv, D), jnp.float32), pltpu.VMEM((bkv, D), jnp.float32), None]
    if segp is not None:
        seg_specs = [pl.BlockSpec((None, None, 1, bq),
                                  lambda *a: (a[0], q_block(*a)[2], _0, _0)),
                     pl.BlockSpec((None, None, 1, bkv), lambda b_, n_, j, r, *_: (b_, j, _0, _0))]
        scratch[2] = pltpu.VMEM((bkv, 1), jnp.int32)
    kernel = functools.partial(_dkv_kernel, p=p, bq=bq, bkv=bkv, nq=nq, nkv=nkv, steps=steps)
    dk, dv = _call(
        kernel, static, (b, n, nkv, g * steps),
        [qrow, kvrow, kvrow, qrow, qstat, qstat, *seg_specs], [kvrow, kvrow],
        [jax.ShapeDtypeStruct(kh.shape, k.dtype), jax.ShapeDtypeStruct(vh.shape, v.dtype)],
        scratch, "gated_flash_dkv",
    )(qlo.reshape(-1), qhi.reshape(-1), qh, kh, vh, doh, _stats(p, lse, bq, fc.EMPTY_ROW_LSE),
      _stats(p, delta, bq), qseg, kseg)
    return _seq_major(p, dq), _seq_major(p, dk), _seq_major(p, dv)


# The one `ops.attention` interface over this module's launchers (see _flash_common).
attention, trusted_attention, _flash, _static = fc.make_kernel_attention(
    NAME, MIN_BLOCK, lambda d: d, _forward, _backward, platform="TPU")
