"""Flash attention for GPUs in Pallas (Triton lowering), with the G1 gate fused in.

Forward: one program per (q block, batch, head), the q block the fastest grid axis and the
heaviest causal blocks launched first, walks only the kv blocks that hold a visible key
(causal diagonal, sliding window and segment ranges bound the loop), keeps a running
max/denominator in registers, and multiplies by act(gate) before the single store (for
sigmoid gates the ungated output is never written: see _flash_common.OUTPUT_ONLY_GATES).
Backward: one dk/dv program per kv block loops over the query heads of its GQA group and
their q blocks, recomputing the weights from the saved per-row lse, and adds each tile's dq
into a float32 buffer with atomics: 5 matmuls per tile (DQ_BY_ATOMICS; False gives
FlashAttention-2's split with a dq kernel of its own, 7). Nothing S x S is stored, and k/v
are never repeated for GQA (the BlockSpec index maps a query head to its kv head).

When compiled for a CPU (interpret=None) the kernels run in Pallas interpret mode.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from gated_attention.ops import _flash_common as fc

NAME = "pallas_gpu"
MIN_BLOCK = 16  # tl.dot needs every tile dimension >= 16
# Backward with 5 matmuls per tile: the dk/dv kernel also adds each tile's dq into a float32
# buffer with atomics (as FlashAttention-3 does). False: FlashAttention-2's split, a dq kernel
# that recomputes the weights (7 matmuls). Atomic float sums make dq differ from run to run
# in the last bits.
DQ_BY_ATOMICS = True


def _heavy_first(p: fc.Problem, block, count: int):
    """Row block handled by grid step `block` of the fastest grid axis: under a causal mask
    the last q blocks see the most keys, so they are launched first (the GPU's tail then holds
    the short ones); without a mask the order is natural."""
    return count - 1 - block if p.causal else block


def _mask(p: fc.Problem, q_pos, k_pos, q_seg, k_seg):
    """[bq, bkv] visibility of keys to queries inside one tile."""
    mask = k_pos[None, :] < p.seq
    if p.causal:
        mask = mask & (q_pos[:, None] >= k_pos[None, :])
    if p.window:
        mask = mask & (q_pos[:, None] - k_pos[None, :] < p.window)
    if q_seg is not None:
        mask = mask & (q_seg[:, None] == k_seg[None, :])
    return mask


def _kv_tile(p: fc.Problem, q, k_ref, v_ref, seg_ref, j, bkv: int, q_pos, q_seg,
             masked: bool):
    """k and v of kv block j, q's scaled logits against it, and their mask (None: all seen)."""
    k = k_ref[pl.ds(j * bkv, bkv), :]
    v = v_ref[pl.ds(j * bkv, bkv), :]
    x = plgpu.dot(q, k, trans_b=True).astype(jnp.float32) * p.scale2
    mask = None
    if masked:
        k_seg = None if seg_ref is None else seg_ref[pl.ds(j * bkv, bkv)]
        mask = _mask(p, q_pos, j * bkv + jnp.arange(bkv), q_seg, k_seg)
    return k, v, x, mask


def _kv_loop(p: fc.Problem, body, init, lo, hi, i, bq: int, bkv: int):
    """Run body over kv blocks [lo, hi): the tiles cut by the window's left edge (masked),
    the mask-free ones, then those on the diagonal or padding (masked)."""
    if p.has_segments:
        return lax.fori_loop(lo, hi, functools.partial(body, masked=True), init)
    start = jnp.minimum(hi, fc.unmasked_kv_start(p, i, bq, bkv, lo))
    mid = jnp.maximum(start, fc.unmasked_kv_end(p, i, bq, bkv, hi))
    carry = init
    if p.window:
        carry = lax.fori_loop(lo, start, functools.partial(body, masked=True), carry)
    carry = lax.fori_loop(start, mid, functools.partial(body, masked=False), carry)
    return lax.fori_loop(mid, hi, functools.partial(body, masked=True), carry)


def _fwd_kernel(*refs, p: fc.Problem, bq: int, bkv: int, residuals: bool):
    refs = list(refs)
    q_ref, k_ref, v_ref, lo_ref, hi_ref = refs[:5]
    rest = refs[5:]
    seg_ref = rest.pop(0) if p.has_segments else None
    gate_ref = rest.pop(0) if p.gate_kind else None
    sink_ref = rest.pop(0) if p.normalizer == "learned_sink" else None
    out_ref, lse_ref, o_ref = (rest + [None, None])[:3]
    b, i = pl.program_id(1), _heavy_first(p, pl.program_id(0), pl.num_programs(0))

    q = q_ref[...]
    q_pos = i * bq + jnp.arange(bq)
    q_seg = None if seg_ref is None else seg_ref[pl.ds(i * bq, bq)]
    sink = None if sink_ref is None else jnp.max(sink_ref[...].astype(jnp.float32)) * fc.LOG2E
    m0 = fc.initial_max(p.normalizer, bq, sink)

    def body(j, carry, masked: bool):
        acc, m, mass_sum = carry
        k, v, x, mask = _kv_tile(p, q, k_ref, v_ref, seg_ref, j, bkv, q_pos, q_seg, masked)
        m, corr, weights, mass = fc.online_block(x, mask, m, p.normalizer)
        acc = acc * corr + plgpu.dot(weights.astype(v.dtype), v).astype(jnp.float32)
        return acc, m, mass_sum * corr + mass

    init = (jnp.zeros((bq, p.padded_dim), jnp.float32), m0, jnp.zeros((bq, 1), jnp.float32))
    acc, m, mass_sum = _kv_loop(p, body, init, lo_ref[b, i], hi_ref[b, i], i, bq, bkv)
    o, lse = fc.finalize(acc, m, mass_sum, p.normalizer, sink)
    out = o
    if gate_ref is not None:
        scores = fc.gate_scores(gate_ref[...], p.gate_activation)
        out = o * (scores if p.gate_kind == "elementwise" else scores[:, None])
    out_ref[...] = out.astype(out_ref.dtype)
    if residuals:
        lse_ref[...] = lse.reshape(bq)
        if o_ref is not None:
            o_ref[...] = o.astype(o_ref.dtype)


def _dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, lo_ref, hi_ref, *rest,
               p: fc.Problem, bq: int, bkv: int):
    rest = list(rest)
    seg_ref = rest.pop(0) if p.has_segments else None
    (dq_ref,) = rest
    b, i = pl.program_id(1), _heavy_first(p, pl.program_id(0), pl.num_programs(0))
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...][:, None], delta_ref[...][:, None]
    q_pos = i * bq + jnp.arange(bq)
    q_seg = None if seg_ref is None else seg_ref[pl.ds(i * bq, bq)]

    def body(j, dq, masked: bool):
        k, v, x, mask = _kv_tile(p, q, k_ref, v_ref, seg_ref, j, bkv, q_pos, q_seg, masked)
        dw = plgpu.dot(do, v, trans_b=True).astype(jnp.float32)
        _, dx = fc.weights_and_dlogits(x, mask, lse, dw, delta, p.normalizer)
        return dq + plgpu.dot(dx.astype(k.dtype), k).astype(jnp.float32)

    dq = _kv_loop(p, body, jnp.zeros((bq, p.padded_dim), jnp.float32), lo_ref[b, i],
                  hi_ref[b, i], i, bq, bkv)
    dq_ref[...] = (dq * p.scale).astype(dq_ref.dtype)


def _dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, lo_ref, hi_ref, *rest,
                p: fc.Problem, bq: int, bkv: int, dq_atomic: bool):
    """dk, dv of one kv block; with dq_atomic also every dq contribution of its tiles, added
    atomically into a float32 dq (5 matmuls per tile in all, against 7 with a dq kernel)."""
    rest = list(rest)
    seg_ref = rest.pop(0) if p.has_segments else None
    if dq_atomic:
        rest.pop(0)  # the zero dq input, aliased to the dq output below
    dk_ref, dv_ref, *dq_out = rest
    b, j = pl.program_id(1), pl.program_id(0)  # the first kv blocks are seen by the most q
    k, v = k_ref[...], v_ref[...]
    k_pos = j * bkv + jnp.arange(bkv)
    k_seg = None if seg_ref is None else seg_ref[pl.ds(j * bkv, bkv)]
    dk = jnp.zeros((bkv, p.padded_dim), jnp.float32)
    dv = jnp.zeros((bkv, p.padded_dim), jnp.float32)

    for g in range(p.group):  # static: each query head of this kv head's group
        def body(i, carry, masked: bool, g=g):
            dk, dv = carry
            q = q_ref[pl.ds(i * bq, bq), g, :]
            do = do_ref[pl.ds(i * bq, bq), g, :]
            lse = lse_ref[g, pl.ds(i * bq, bq)][:, None]
            delta = delta_ref[g, pl.ds(i * bq, bq)][:, None]
            x = plgpu.dot(q, k, trans_b=True).astype(jnp.float32) * p.scale2
            mask = None
            if masked:
                q_seg = None if seg_ref is None else seg_ref[pl.ds(i * bq, bq)]
                mask = _mask(p, i * bq + jnp.arange(bq), k_pos, q_seg, k_seg)
            dw = plgpu.dot(do, v, trans_b=True).astype(jnp.float32)
            w, dx = fc.weights_and_dlogits(x, mask, lse, dw, delta, p.normalizer)
            dv = dv + plgpu.dot(w.astype(do.dtype), do, trans_a=True).astype(jnp.float32)
            dk = dk + plgpu.dot(dx.astype(q.dtype), q, trans_a=True).astype(jnp.float32)
            if dq_atomic:
                dq = plgpu.dot(dx.astype(k.dtype), k).astype(jnp.float32) * p.scale
                # dq is [S, group * D] here: two slices (int32 starts, as the interpreter
                # wants under x64) address query head g's rows of q block i
                D = p.padded_dim
                cols = pl.ds(np.int32(g * D), D)
                plgpu.atomic_add(dq_out[0], (pl.ds(i * bq, bq), cols), dq)
            return dk, dv

        lo, hi = lo_ref[b, j], hi_ref[b, j]
        if p.has_segments:
            dk, dv = lax.fori_loop(lo, hi, functools.partial(body, masked=True), (dk, dv))
        else:  # masked tiles near the diagonal first, then the q blocks that see every key,
            # then (with a window) those whose windows end inside this kv block
            mid = jnp.minimum(hi, fc.unmasked_q_start(p, j, bq, bkv, lo))
            end = jnp.maximum(mid, fc.unmasked_q_end(p, j, bq, bkv, hi))
            dk, dv = lax.fori_loop(lo, mid, functools.partial(body, masked=True), (dk, dv))
            dk, dv = lax.fori_loop(mid, end, functools.partial(body, masked=False), (dk, dv))
            if p.window:
                dk, dv = lax.fori_loop(end, hi, functools.partial(body, masked=True), (dk, dv))
    dk_ref[...] = (dk * p.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# ----------------------------------------------------------------------------- launchers


def _pad_inputs(p: fc.Problem, *arrays):
    """Pad [b, s, h, d] arrays to the padded sequence length and head_dim."""
    return [fc.pad_axis(fc.pad_axis(a, 1, p.padded), 3, p.padded_dim) for a in arrays]


def _padded_segments(p: fc.Problem, seg):
    return None if seg is None else fc.pad_axis(seg.astype(jnp.int32), 1, p.padded, -1)


def _params(static: fc.Static, backward: bool = False) -> plgpu.CompilerParams:
    suffix = "_bwd" if backward else ""
    return plgpu.CompilerParams(num_warps=static.size("num_warps" + suffix),
                                num_stages=static.size("num_stages" + suffix))


def _q_grid_specs(p: fc.Problem, bq: int, nq: int):
    """BlockSpecs of a grid (q block, batch, head), the q block fastest so consecutive programs
    share one head's k/v in L2, heaviest causal blocks first: (q rows of one head, that head's
    whole kv, a per-row statistic [b, h, S])."""
    g, S, D = p.group, p.padded, p.padded_dim

    def rows(q_block, b_, h_):
        return (b_, _heavy_first(p, q_block, nq), h_, 0)

    row = pl.BlockSpec((None, bq, None, D), rows)
    whole_kv = pl.BlockSpec((None, S, None, D), lambda i, b_, h_: (b_, 0, h_ // g, 0))
    stat = pl.BlockSpec((None, None, bq), lambda i, b_, h_: (b_, h_, _heavy_first(p, i, nq)))
    return row, whole_kv, stat


def _forward(static: fc.Static, q, k, v, seg, gate, sink, residuals: bool):
    p = static.problem
    bq, bkv = static.size("block_q"), static.size("block_kv")
    b, h, S, D = p.batch, p.heads, p.padded, p.padded_dim
    qp, kp, vp = _pad_inputs(p, q, k, v)
    segp = _padded_segments(p, seg)
    lo, hi, _, _ = fc.block_ranges(segp, b, S, p.seq, bq, bkv, p.causal, p.window)
    nq = S // bq

    row, whole_kv, by_head = _q_grid_specs(p, bq, nq)
    table = pl.BlockSpec((b, nq), lambda *_: (0, 0))
    in_specs = [row, whole_kv, whole_kv, table, table]
    args = [qp, kp, vp, lo, hi]
    if segp is not None:
        in_specs.append(pl.BlockSpec((None, S), lambda i, b_, h_: (b_, 0)))
        args.append(segp)
    if p.gate_kind == "elementwise":
        in_specs.append(row)
        args.append(_pad_inputs(p, gate)[0])
    elif p.gate_kind == "headwise":
        in_specs.append(by_head)
        args.append(fc.pad_axis(jnp.swapaxes(gate, 1, 2), 2, S))
    if p.normalizer == "learned_sink":
        in_specs.append(pl.BlockSpec((None, MIN_BLOCK), lambda i, b_, h_: (h_, 0)))
        args.append(jnp.broadcast_to(sink.astype(jnp.float32)[:, None], (h, MIN_BLOCK)))

    out_shapes = [jax.ShapeDtypeStruct((b, S, h, D), q.dtype)]
    out_specs = [row]
    if residuals:
        out_shapes.append(jax.ShapeDtypeStruct((b, h, S), jnp.float32))
        out_specs.append(by_head)
        if fc.stores_ungated(p):
            out_shapes.append(jax.ShapeDtypeStruct((b, S, h, D), q.dtype))
            out_specs.append(row)
    outs = pl.pallas_call(
        functools.partial(_fwd_kernel, p=p, bq=bq, bkv=bkv, residuals=residuals),
        out_shape=out_shapes, grid=(nq, b, h), in_specs=in_specs, out_specs=out_specs,
        compiler_params=_params(static), interpret=bool(static.interpret),
        name="gated_flash_fwd",
    )(*args)
    out = outs[0][:, :p.seq, :, :p.head_dim]
    if not residuals:
        return out, None, None
    lse = outs[1][:, :, :p.seq]
    o = outs[2][:, :p.seq, :, :p.head_dim] if fc.stores_ungated(p) else out
    return out, lse, o


def _backward(static: fc.Static, q, k, v, seg, sink, do, lse, delta):
    del sink  # its effect is inside lse
    p = static.problem
    b, h, n, S, D, g = p.batch, p.heads, p.kv_heads, p.padded, p.padded_dim, p.group
    qp, kp, vp, dop = _pad_inputs(p, q, k, v, do)
    segp = _padded_segments(p, seg)
    lsep = fc.pad_axis(lse, 2, S, fc.EMPTY_ROW_LSE)
    deltap = fc.pad_axis(delta, 2, S)
    seg_args = [] if segp is None else [segp]
    seg_specs = [] if segp is None else [pl.BlockSpec((None, S), lambda x_, b_, y_: (b_, 0))]

    dq = None
    if not DQ_BY_ATOMICS:  # FlashAttention-2's split: a dq kernel of its own
        bq, bkv = static.size("block_q_dq"), static.size("block_kv_dq")
        lo, hi, _, _ = fc.block_ranges(segp, b, S, p.seq, bq, bkv, p.causal, p.window)
        row, whole_kv, stat = _q_grid_specs(p, bq, S // bq)
        table = pl.BlockSpec((b, S // bq), lambda *_: (0, 0))
        dq = pl.pallas_call(
            functools.partial(_dq_kernel, p=p, bq=bq, bkv=bkv),
            out_shape=jax.ShapeDtypeStruct(qp.shape, q.dtype), grid=(S // bq, b, h),
            in_specs=[row, whole_kv, whole_kv, row, stat, stat, table, table, *seg_specs],
            out_specs=row, compiler_params=_params(static, backward=True),
            interpret=bool(static.interpret), name="gated_flash_dq",
        )(qp, kp, vp, dop, lsep, deltap, lo, hi, *seg_args)

    bq, bkv = static.size("block_q_dkv"), static.size("block_kv_dkv")
    _, _, qlo, qhi = fc.block_ranges(segp, b, S, p.seq, bq, bkv, p.causal, p.window)
    # grid (kv block, batch, kv head): the kv block is the fastest axis
    grouped = pl.BlockSpec((None, S, None, g, D), lambda j, b_, n_: (b_, 0, n_, 0, 0))
    grouped_stat = pl.BlockSpec((None, None, g, S), lambda j, b_, n_: (b_, n_, 0, 0))
    kv_row = pl.BlockSpec((None, bkv, None, D), lambda j, b_, n_: (b_, j, n_, 0))
    table = pl.BlockSpec((b, S // bkv), lambda *_: (0, 0))
    in_specs = [grouped, kv_row, kv_row, grouped, grouped_stat, grouped_stat, table, table,
                *seg_specs]
    args = [qp.reshape(b, S, n, g, D), kp, vp, dop.reshape(b, S, n, g, D),
            lsep.reshape(b, n, g, S), deltap.reshape(b, n, g, S), qlo, qhi, *seg_args]
    out_shape = [jax.ShapeDtypeStruct(kp.shape, k.dtype), jax.ShapeDtypeStruct(vp.shape, v.dtype)]
    out_specs = [kv_row, kv_row]
    aliases = {}
    if DQ_BY_ATOMICS:
        aliases = {len(args): 2}
        flat = pl.BlockSpec((None, S, None, g * D), lambda j, b_, n_: (b_, 0, n_, 0))
        in_specs.append(flat)
        args.append(jnp.zeros((b, S, n, g * D), jnp.float32))
        out_shape.append(jax.ShapeDtypeStruct((b, S, n, g * D), jnp.float32))
        out_specs.append(flat)
    outs = pl.pallas_call(
        functools.partial(_dkv_kernel, p=p, bq=bq, bkv=bkv, dq_atomic=DQ_BY_ATOMICS),
        out_shape=out_shape, grid=(S // bkv, b, n), in_specs=in_specs, out_specs=out_specs,
        input_output_aliases=aliases, compiler_params=_params(static, backward=True),
        interpret=bool(static.interpret), name="gated_flash_dkv",
    )(*args)
    dk, dv = outs[:2]
    if DQ_BY_ATOMICS:
        dq = outs[2].reshape(b, S, h, D).astype(q.dtype)
    unpad = lambda x: x[:, :p.seq, :, :p.head_dim]  # noqa: E731
    return unpad(dq), unpad(dk), unpad(dv)


# The one `ops.attention` interface over this module's launchers (see _flash_common).
attention, trusted_attention, _flash, _static = fc.make_kernel_attention(
    NAME, MIN_BLOCK, lambda d: max(MIN_BLOCK, fc.next_pow2(d)), _forward, _backward, platform="GPU")
