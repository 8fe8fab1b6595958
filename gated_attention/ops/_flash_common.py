"""Math and plumbing shared by the Pallas GPU and TPU flash-attention kernels.

The kernels keep, per query row, a running max `m`, a running denominator `l` and an
accumulator; at the end they store one statistic, `lse`, such that every normaliser's weight
can be recomputed in the backward pass from the logit alone:

  softmax family  w_j = exp(x_j - lse),                      lse = m + log(l + exp(c - m))
  softpick        w_j = relu(exp(x_j - lse) - exp(-lse)),    lse = m + log(l + eps exp(-m))

with c = -inf (softmax), 0 (off-by-one) or the head's sink logit. Inside the kernels every
logit, max and lse is kept in base 2 (x2 = x log2 e, so e^(x - m) = 2^(x2 - m2)): exp2 is
the GPU's native instruction where exp costs a multiply more. Functions here are written
with plain jnp ops that both the Triton and the Mosaic lowerings accept (no lax.logistic, no
sign, no inf arithmetic), so one copy of the maths serves both kernels.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

from gated_attention.core.errors import UserError
from gated_attention.ops.arguments import checked
from gated_attention.ops.gating import apply_output_gate
from gated_attention.ops.reference import SOFTPICK_EPS

# Finite stand-ins for -inf/+inf: exp() of anything minus them underflows cleanly to 0 and
# their differences never produce NaN.
MASK_VALUE = -1e30
LOG2E = math.log2(math.e)
EMPTY_ROW_LSE = 1e30


def _f32(value: float) -> np.float32:
    """A float32 constant: a Python float given to jnp.where becomes float64 under
    jax_enable_x64, which Mosaic cannot lower inside a kernel."""
    return np.float32(value)


def initial_max(normalizer: str, block_q: int, sink: jax.Array | None = None) -> jax.Array:
    """Running max before any key: the extra denominator term's logit is always included.

    `sink` is the head's sink logit in base 2 (sink * LOG2E)."""
    if normalizer == "softmax":
        return jnp.full((block_q, 1), MASK_VALUE, jnp.float32)
    if normalizer == "learned_sink":
        return jnp.zeros((block_q, 1), jnp.float32) + sink
    return jnp.zeros((block_q, 1), jnp.float32)  # off-by-one and softpick: exp(0) / the "-1"


def online_block(x: jax.Array, mask: jax.Array, m_prev: jax.Array, normalizer: str):
    """One kv block of the online normaliser.

    x [bq, bkv] float32 scaled base-2 logits, mask [bq, bkv] (None: all visible), m_prev
    [bq, 1]. Returns (m_next,
    correction, numerator weights [bq, bkv] for the value sum, denominator mass), row
    statistics as [bq, 1] columns.
    """
    masked = x if mask is None else jnp.where(mask, x, _f32(MASK_VALUE))
    m_next = jnp.maximum(m_prev, jnp.max(masked, axis=-1, keepdims=True))
    correction = jnp.exp2(m_prev - m_next)
    e = jnp.exp2(masked - m_next)
    if normalizer == "softpick":
        shifted = _where(mask, e - jnp.exp2(-m_next))
        mass = jnp.sum(jnp.abs(shifted), axis=-1, keepdims=True)
        return m_next, correction, jnp.maximum(shifted, 0.0), mass
    p = _where(mask, e)
    return m_next, correction, p, jnp.sum(p, axis=-1, keepdims=True)


def _where(mask: jax.Array | None, x: jax.Array) -> jax.Array:
    """x where visible, else 0; mask None means a tile with every key visible."""
    return x if mask is None else jnp.where(mask, x, _f32(0.0))


def finalize(acc: jax.Array, m: jax.Array, denom_sum: jax.Array, normalizer: str,
             sink: jax.Array | None = None):
    """(acc / denominator [bq, d], lse [bq, 1]) once every visible key has been folded in."""
    if normalizer == "softmax":
        empty = denom_sum <= 0.0
        denom = jnp.where(empty, _f32(1.0), denom_sum)
        lse = jnp.where(empty, _f32(EMPTY_ROW_LSE), m + jnp.log2(denom))
        return acc / denom, lse
    if normalizer == "softmax_off_by_one":
        denom = denom_sum + jnp.exp2(-m)
    elif normalizer == "learned_sink":
        denom = denom_sum + jnp.exp2(sink - m)
    else:
        denom = denom_sum + SOFTPICK_EPS * jnp.exp2(-m)
    return acc / denom, m + jnp.log2(denom)


def weights_and_dlogits(x: jax.Array, mask: jax.Array, lse: jax.Array, dw: jax.Array | None,
                        delta: jax.Array, normalizer: str):
    """Recompute attention weights [bq, bkv] from lse and the gradient w.r.t. the logits.

    lse, delta [bq, 1] (or [1, bq] rows against a transposed [bkv, bq] tile: every op here is
    elementwise); dw = dO . V^T; delta = rowsum(dO * O). Softmax family:
    dx = w (dw - delta). Softpick (w = relu(u)/N, u = e^x - 1):
    dx = e^x/N (1[x>0] dw - sign(x) delta).
    """
    e = _where(mask, jnp.exp2(x - lse))
    if normalizer != "softpick":
        if dw is None:
            return e, None
        return e, e * (dw - delta)
    positive = x > 0.0 if mask is None else mask & (x > 0.0)
    w = jnp.where(positive, e - jnp.exp2(-lse), _f32(0.0))
    if dw is None:
        return w, None
    sign = jnp.where(x > 0.0, _f32(1.0), jnp.where(x < 0.0, _f32(-1.0), _f32(0.0)))
    return w, e * (jnp.where(positive, dw, _f32(0.0)) - sign * delta)


def sigmoid(x: jax.Array) -> jax.Array:
    return 1.0 / (1.0 + jnp.exp(-x))


def gate_scores(g: jax.Array, activation: str) -> jax.Array:
    """act(g) in float32 from exp/divide only, so it lowers inside Triton and Mosaic kernels."""
    g = g.astype(jnp.float32)
    if activation == "sigmoid":
        return sigmoid(g)
    if activation == "silu":
        return g * sigmoid(g)
    if activation == "ns_sigmoid":
        return 0.5 + 0.5 * sigmoid(g)
    return g


# ----------------------------------------------------------------------------- plumbing


@dataclasses.dataclass(frozen=True)
class Problem:
    """Static facts of one call: sizes after padding and which features are on."""

    batch: int
    seq: int  # true length
    padded: int
    heads: int
    kv_heads: int
    head_dim: int  # true head_dim (sets the scale)
    padded_dim: int
    causal: bool
    normalizer: str
    gate_kind: str | None  # None, "elementwise" or "headwise"
    gate_activation: str
    has_segments: bool
    window: int = 0  # > 0: query i sees key j only when i - j < window (sliding window)

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def scale(self) -> float:
        return self.head_dim ** -0.5

    @property
    def scale2(self) -> float:
        """Logit scale into base 2: the kernels compute 2^(x log2 e) = e^x."""
        return self.scale * LOG2E


def check_kernel_args(name: str, q: jax.Array, k: jax.Array) -> None:
    """What only the flash kernels refuse (the arguments every kernel takes are checked by
    ops/arguments.py), named for the user."""
    if k.shape[1] != q.shape[1]:
        raise UserError(f"impl={name!r} needs equal query and key lengths (self-attention); got "
                        f"{q.shape[1]} and {k.shape[1]}. Use impl='xla' for cross lengths")
    for dt, what in ((q.dtype, "q"), (k.dtype, "k")):
        if dt not in (jnp.float32, jnp.bfloat16, jnp.float16, jnp.float64):
            raise UserError(f"{what}.dtype={dt} is not supported by impl={name!r}; use "
                            "float32, bfloat16 or float16")


def round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def pad_axis(x: jax.Array, axis: int, size: int, value=0) -> jax.Array:
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths, constant_values=value)


def block_ranges(q_seg: jax.Array | None, batch: int, padded: int, seq: int, block_q: int,
                 block_kv: int, causal: bool, window: int = 0):
    """Per (batch, q block): the [lo, hi) kv blocks that hold any visible key, and per
    (batch, kv block): the [lo, hi) q blocks that see any of its keys.

    Built from each block's min/max segment id, the causal diagonal and the sliding window's
    left edge (a kv block whose last key is `window` or more before the q block's first query
    is seen by none of it); blocks outside a range are skipped by the kernels' loops and
    index maps, blocks inside are masked element by element where needed.
    """
    nq, nkv = padded // block_q, padded // block_kv
    q_idx = jnp.arange(nq)[:, None]
    kv_idx = jnp.arange(nkv)[None, :]
    ok = jnp.broadcast_to(kv_idx * block_kv < seq, (nq, nkv))[None]
    if causal:
        ok = ok & ((kv_idx * block_kv) <= (q_idx + 1) * block_q - 1)[None]
    if window:
        ok = ok & (q_idx * block_q - ((kv_idx + 1) * block_kv - 1) < window)[None]
    if q_seg is not None:
        qb = q_seg.reshape(batch, nq, block_q)
        kb = q_seg.reshape(batch, nkv, block_kv)
        ok = ok & ((qb.min(-1)[:, :, None] <= kb.max(-1)[:, None, :])
                   & (kb.min(-1)[:, None, :] <= qb.max(-1)[:, :, None]))
    ok = jnp.broadcast_to(ok, (batch, nq, nkv))

    def span(table: jax.Array):
        n = table.shape[-1]
        any_ = table.any(-1)
        lo = jnp.argmax(table, axis=-1)
        hi = n - jnp.argmax(table[..., ::-1], axis=-1)
        return (jnp.where(any_, lo, 0).astype(jnp.int32),
                jnp.where(any_, hi, 0).astype(jnp.int32))

    kv_lo, kv_hi = span(ok)
    q_lo, q_hi = span(jnp.swapaxes(ok, 1, 2))
    return kv_lo, kv_hi, q_lo, q_hi


def window_steps(p: Problem, block: int, other_block: int, n_other: int) -> int:
    """Most blocks of the other axis one block of `block` rows can touch: under a causal
    window of W a q block's keys span block + W - 1 positions (and a kv block's queries
    likewise), so at most ceil((block + W - 1) / other_block) + 1 blocks; otherwise all."""
    if not (p.window and p.causal):
        return n_other
    return min(n_other, -(-(block + p.window - 1) // other_block) + 1)


def index_div(a: jax.Array, n: int) -> jax.Array:
    """a // n for a non-negative traced index: lax.div lowers in Triton and Mosaic alike."""
    return jax.lax.div(a, jnp.asarray(n, a.dtype))


def unmasked_kv_end(p: Problem, i, bq: int, bkv: int, hi):
    """For q block i: kv blocks below this index (and >= unmasked_kv_start) need no mask.

    Without segment ids (with them every tile is masked), a block is mask-free when it holds
    no padded key and, if causal, lies wholly at or below the diagonal.
    """
    end = jnp.minimum(hi, p.seq // bkv)
    if p.causal:
        end = jnp.minimum(end, index_div(i * bq + 1, bkv))
    return end


def unmasked_kv_start(p: Problem, i, bq: int, bkv: int, lo):
    """For q block i: kv blocks from this index on lie wholly inside every query's window.

    Tile (i, j) needs no window mask when its last query minus its first key is below the
    window: j * bkv >= (i + 1) * bq - window. Without a window: lo.
    """
    if not p.window:
        return lo
    reach = jnp.maximum((i + 1) * bq - p.window, 0)
    return jnp.maximum(lo, index_div(reach + bkv - 1, bkv))


def unmasked_q_start(p: Problem, j, bq: int, bkv: int, lo):
    """For kv block j: q blocks from this index on (and < unmasked_q_end) see all its keys.

    Without segment ids only. Padded keys need no mask here: they only change their own
    dk/dv rows, which are cut off.
    """
    if not p.causal:
        return lo
    return jnp.maximum(lo, index_div((j + 1) * bkv - 1 + bq - 1, bq))


def unmasked_q_end(p: Problem, j, bq: int, bkv: int, hi):
    """For kv block j: q blocks below this index have every query within the window of
    every key of the block ((i + 1) * bq <= j * bkv + window). Without a window: hi."""
    if not p.window:
        return hi
    return jnp.minimum(hi, index_div(j * bkv + p.window, bq))


def gate_kind(gate: jax.Array | None, q: jax.Array) -> str | None:
    if gate is None:
        return None
    return "elementwise" if gate.ndim == q.ndim else "headwise"


# Gates whose act'(g) / act(g) is bounded: their backward needs only the gated output (which
# the next layer keeps anyway), so the forward never writes the ungated one to memory. SiLU
# and identity gates pass zero, where that ratio has a pole, and keep the ungated output.
OUTPUT_ONLY_GATES = ("sigmoid", "ns_sigmoid")


def stores_ungated(p: Problem) -> bool:
    """Whether the forward must also write the ungated output for the backward pass."""
    return bool(p.gate_kind) and p.gate_activation not in OUTPUT_ONLY_GATES


def gate_backward(dout: jax.Array, o: jax.Array, gate: jax.Array | None, activation: str):
    """XLA-fused pre-pass of the backward from the ungated o: (dO before the gate, d gate).

    out = o * act(g); d o = d out * act(g); d g = d out * o * act'(g) (summed over head_dim for
    a headwise gate). XLA fuses this into one elementwise pass with the delta row sum.
    """
    if gate is None:
        return dout, None
    o32 = o.astype(jnp.float32)
    _, vjp = jax.vjp(lambda o_, g_: apply_output_gate(o_, g_, activation),
                     o32, gate.astype(jnp.float32))
    do, dg = vjp(dout.astype(jnp.float32))
    return do.astype(o.dtype), dg.astype(gate.dtype)


def _score_log_derivative(g: jax.Array, activation: str) -> jax.Array:
    """act'(g) / act(g) for the OUTPUT_ONLY_GATES: 1 - sigmoid(g), or s(1-s)/(1+s)."""
    s = sigmoid(g)
    if activation == "sigmoid":
        return 1.0 - s
    if activation == "ns_sigmoid":
        return s * (1.0 - s) / (1.0 + s)
    raise ValueError(f"gate_activation={activation!r} needs the ungated output; the "
                     f"output-only backward covers {', '.join(OUTPUT_ONLY_GATES)}")


def gate_backward_from_output(dout: jax.Array, out: jax.Array, gate: jax.Array,
                              activation: str):
    """(dO before the gate, d gate, delta) from the gated output alone.

    With out = o * act(g): d g = d out * o * act'(g) = d out * out * act'(g)/act(g), and the
    softmax backward's row term delta = sum_d (d out * act(g)) * o = sum_d d out * out.
    """
    g32 = gate.astype(jnp.float32)
    scores = gate_scores(g32, activation)
    product = dout.astype(jnp.float32) * out.astype(jnp.float32)
    ratio = _score_log_derivative(g32, activation)
    if gate.ndim == out.ndim:  # elementwise
        do = dout.astype(jnp.float32) * scores
        dg = product * ratio
    else:  # headwise: one score per (token, head)
        do = dout.astype(jnp.float32) * scores[..., None]
        dg = jnp.sum(product, axis=-1) * ratio
    delta = jnp.einsum("bshd->bhs", product)
    return do.astype(out.dtype), dg.astype(gate.dtype), delta


def sink_gradient(sink: jax.Array, lse: jax.Array, delta: jax.Array, seq: int) -> jax.Array:
    """d sink_h = -sum_{b,i} exp(sink_h - lse) * delta over real rows (base-2 lse [b,h,s])."""
    lse = lse[:, :, :seq].astype(jnp.float32)
    delta = delta[:, :, :seq].astype(jnp.float32)
    w_sink = jnp.exp2(sink.astype(jnp.float32)[None, :, None] * LOG2E - lse)
    return (-jnp.einsum("bhs,bhs->h", w_sink, delta)).astype(sink.dtype)


def attention_flops(batch: int, seq: int, heads: int, head_dim: int, causal: bool) -> float:
    """QK^T and PV FLOPs of the forward, halved when causal (flash-attention benchmarks' way)."""
    flops = 4.0 * batch * heads * seq * seq * head_dim
    return flops / 2 if causal else flops


def next_pow2(x: int) -> int:
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


# ----------------------------------------------------------------------------- custom VJP


@dataclasses.dataclass(frozen=True)
class Static:
    """Everything static about one kernel call (hashable: a nondiff argument of custom_vjp)."""

    problem: Problem
    sizes: tuple[tuple[str, int], ...]
    interpret: bool | str  # False, True or GENERIC_INTERPRET (resolve_interpret)

    def size(self, key: str) -> int:
        return dict(self.sizes)[key]


def make_flash_attention(forward, backward):
    """A custom-VJP attention from a kernel module's forward and backward launchers.

    forward(static, q, k, v, seg, gate, sink, residuals) -> (out, lse [b,h,s], o), where o is
        the ungated output if stores_ungated(problem), else `out` (nothing extra written)
    backward(static, q, k, v, seg, sink, do, lse, delta) -> (dq, dk, dv)
    The gate's and the sink's gradients are computed here from o, lse and delta, so each
    kernel only needs the three matmul-heavy passes.
    """

    @functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
    def flash(static, q, k, v, seg, gate, sink):
        return forward(static, q, k, v, seg, gate, sink, False)[0]

    def flash_fwd(static, q, k, v, seg, gate, sink):
        out, lse, o = forward(static, q, k, v, seg, gate, sink, True)
        # o is the ungated output only where stores_ungated(); else it is `out` itself
        return out, (q, k, v, seg, gate, sink, o, lse)

    def flash_bwd(static, residuals, dout):
        q, k, v, seg, gate, sink, o, lse = residuals
        activation = static.problem.gate_activation
        if gate is not None and not stores_ungated(static.problem):
            do, dgate, delta = gate_backward_from_output(dout, o, gate, activation)
        else:
            do, dgate = gate_backward(dout, o, gate, activation)
            delta = jnp.einsum("bshd,bshd->bhs", do.astype(jnp.float32), o.astype(jnp.float32))
        dq, dk, dv = backward(static, q, k, v, seg, sink, do, lse, delta)
        dsink = None if sink is None else sink_gradient(sink, lse, delta, q.shape[1])
        return dq, dk, dv, None, dgate, dsink

    flash.defvjp(flash_fwd, flash_bwd)
    return flash


def make_kernel_attention(name: str, min_block: int, padded_dim: Callable[[int], int],
                          forward: Callable[..., Any], backward: Callable[..., Any],
                          platform: str) -> tuple[Callable[..., jax.Array],
                                                  Callable[..., jax.Array], Any, Callable]:
    """A kernel module's public `attention`, its `trusted_attention` (what `ops.attention`
    calls once its door has checked the arguments), its custom-VJP core and its Static
    builder.

    Both flash kernels serve the one `ops.attention` interface; only their forward and
    backward launchers, their smallest tile and their head-dim padding differ.
    padded_dim(head_dim) -> the head dimension the kernel computes with.
    """
    flash = make_flash_attention(forward, backward)

    def static_of(q, k, gate, gate_activation, segment_ids, causal, normalizer, interpret,
                  block_sizes, window: int = 0) -> Static:
        return build_static(name, min_block, padded_dim(q.shape[-1]), q, k, gate,
                            gate_activation, segment_ids, causal, normalizer, interpret,
                            block_sizes, window)

    def trusted_attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
                          gate: jax.Array | None = None, gate_activation: str = "sigmoid",
                          segment_ids: jax.Array | None = None, causal: bool = True,
                          normalizer: str = "softmax", sink_logits: jax.Array | None = None,
                          interpret: bool | None = None,
                          block_sizes: dict[str, int] | None = None,
                          window: int = 0) -> jax.Array:
        check_kernel_args(name, q, k)
        static = static_of(q, k, gate, gate_activation, segment_ids, causal, normalizer,
                           interpret, block_sizes, window)
        return flash(static, q, k, v, segment_ids, gate, sink_logits)

    trusted_attention.__doc__ = (
        f"Gated flash attention on {platform}; the arguments mean what they mean in "
        "`ops.attention`.\n\n    interpret: run the kernels in Pallas interpret mode "
        "(None: exactly when compiling for a CPU; False is never overridden).\n"
        "    block_sizes: overrides of the tuned table in ops/block_sizes.py.\n"
        "    window > 0: sliding window; kv blocks wholly before a q block's window are "
        "skipped\n    (never loaded), as blocks above the causal diagonal are.\n    ")
    return checked(trusted_attention), trusted_attention, flash, static_of


# Matmuls each phase runs per visible (query, key) pair: the forward QK^T and PV; the dq pass
# recomputes QK^T and dO V^T and forms dS K; the dk/dv pass recomputes both and forms P^T dO
# and dS^T Q. Each matmul is 2 x head_dim FLOPs per pair; each phase takes one exp per pair.
MATMULS_PER_PHASE = {"gated_flash_fwd": 2, "gated_flash_dq": 3, "gated_flash_dkv": 4}


def visible_pairs(p: Problem) -> int:
    """(query, key) pairs a call attends over: causal rows see themselves and what precedes,
    windowed rows at most `window` keys before them (segment ids, known only at run time, are
    not subtracted: an upper bound)."""
    s, w = p.seq, p.window
    per_row = s * (s + 1) // 2 if p.causal else s * s
    if w and w < s:  # rows i >= w lose the i - w + 1 keys before their window
        per_row -= (s - w) * (s - w + 1) // 2
    return p.batch * p.heads * per_row


def cost_estimate(p: Problem, phase: str) -> pl.CostEstimate:
    """What one kernel call computes, for XLA: a custom call is otherwise free to its
    scheduler (nothing to overlap collectives with) and missing from its cost analysis
    (pre-flight FLOPs). Bytes stay 0, as for a call without an estimate: the kernel is
    compute-bound, and XLA's bytes-accessed count keeps measuring the traffic around the
    kernels, which is what the layout comparisons (benchmarks/tpu_bytes.py) read."""
    pairs = visible_pairs(p)
    return pl.CostEstimate(flops=2 * MATMULS_PER_PHASE[phase] * p.head_dim * pairs,
                           transcendentals=pairs, bytes_accessed=0)


GENERIC_INTERPRET = "generic"  # Pallas's own interpreter: no host callbacks


def resolve_interpret(interpret: bool | None) -> bool | str:
    """True: interpret; False: the real kernel, never overridden; None: interpret exactly when
    the target is a CPU (the platform being lowered for, ops.target, not the host).

    Returns False, True (TPU kernels: the Pallas TPU interpreter) or GENERIC_INTERPRET (Pallas's
    own interpreter, for TPU kernels too: inside a platform choice, where the TPU
    interpreter's ordered host callbacks cannot be lowered)."""
    from gated_attention.ops.target import in_platform_branch, target_platform

    if interpret is None:
        interpret = target_platform() == "cpu"
    if interpret and in_platform_branch():
        return GENERIC_INTERPRET
    return bool(interpret)


def build_static(name: str, min_block: int, padded_dim: int, q: jax.Array, k: jax.Array,
                 gate: jax.Array | None, gate_activation: str, segment_ids: jax.Array | None,
                 causal: bool, normalizer: str, interpret: bool | None,
                 block_sizes: dict[str, int] | None, window: int = 0) -> Static:
    """The static description of one kernel call: problem shape, tile sizes, interpret mode.

    Tile sizes come from ops/block_sizes.py (overridable) and are fitted to the length; each
    must be at least the kernel's `min_block`. The length is padded to the largest tile.
    """
    from gated_attention.ops.block_sizes import block_sizes_for, fit_to_length, target_kind

    b, s, h, d = q.shape
    interpret = resolve_interpret(interpret)
    sizes = fit_to_length(block_sizes_for(d, block_sizes, kind=target_kind()), s, min_block)
    for key in ("block_q", "block_kv", "block_q_dq", "block_kv_dq", "block_q_dkv",
                "block_kv_dkv"):
        if sizes[key] < min_block:
            raise UserError(f"block_sizes[{key!r}]={sizes[key]} must be >= {min_block} for "
                            f"impl={name!r}")
    multiple = max(v for key, v in sizes.items() if key.startswith("block"))
    problem = Problem(
        batch=b, seq=s, padded=round_up(s, multiple), heads=h, kv_heads=k.shape[2],
        head_dim=d, padded_dim=padded_dim, causal=causal,
        normalizer=normalizer, gate_kind=gate_kind(gate, q),
        gate_activation=gate_activation, has_segments=segment_ids is not None,
        window=int(window),
    )
    return Static(problem, tuple(sorted(sizes.items())), interpret)
