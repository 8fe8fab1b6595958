"""TPU attention through jax's own splash attention kernel, with the G1 gate applied after.

`jax.experimental.pallas.ops.tpu.splash_attention` is Google's tuned Mosaic kernel: block-
sparse causal masks (fully masked tiles are never visited), segment ids, grouped kv heads and
per-head sinks. It serves every normaliser here but softpick:
  softmax             no sink
  softmax_off_by_one  a sink logit of 0 on every head (the "+1" in the denominator)
  learned_sink        the head's learned sink logit (splash also returns its gradient)
The gate `out * act(g)` follows as an XLA elementwise op, which XLA fuses with the layout
change back to [b, s, h, d].

The backward runs dq in a kernel of its own and dk / dv in another (`fused_backward=False`,
the default, as MaxText's `sa_use_fused_bwd_kernel: False` and this project's `pallas_tpu`),
or all three in one kernel (`fused_backward=True`). The fused kernel writes one partial dq
per kv tile (8 at 4096 positions in tiles of 512) that XLA then adds up: on the 1.7B step
for v5p the compiler's estimate counts 0.45 GB more traffic per layer for it
(benchmarks/RESULTS.md). The split one recomputes the attention scores once more, in the dq
kernel: MXU work inside a kernel, which no cost analysis sees (which is faster on a TPU has
not been measured here).

Splash works on one example ([heads, seq, head_dim]); the batch is vmapped. Lengths are padded
to a multiple of 128 (its lane tile): padded keys are never visible to real queries (the
causal mask hides them, or, without it, a segment id of their own).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import splash_attention as splash

from gated_attention.core.errors import UserError
from gated_attention.ops import _flash_common as fc
from gated_attention.ops import choices, reference
from gated_attention.ops.arguments import checked
from gated_attention.ops.gating import apply_output_gate

NAME = "splash"
# What splash serves is declared once, in choices.CAPABILITIES (in the reference's order).
NORMALIZERS = tuple(n for n in reference.NORMALIZERS
                    if n in choices.CAPABILITIES[NAME].normalizers)
LANES = 128
PADDING_SEGMENT = -1


def tile(padded: int, preferred: int = 512) -> int:
    """The largest of 512 / 256 / 128 (at most `preferred`) that divides the padded length."""
    for size in (512, 256, 128):
        if size <= preferred and padded % size == 0:
            return size
    return LANES


def _mask(padded: int, causal: bool, window: int):
    """Splash's block-sparse mask: a sliding window is its LocalMask (left reach window - 1,
    right reach 0 when causal), whose tiles wholly outside the band are never visited."""
    if window:
        return splash.LocalMask((padded, padded), (window - 1, 0 if causal else window - 1), 0)
    return (splash.CausalMask if causal else splash.FullMask)((padded, padded))


def _kernel(heads: int, padded: int, causal: bool, block: int, interpret: bool | str,
            window: int = 0, fused_backward: bool = False):
    """A splash kernel for one example's shape (its masks processed in numpy).

    Made anew for each call, not cached: a kernel first made inside one trace (e.g. the TPU
    branch a CPU run traces when libtpu is installed) holds that trace's mask arrays, and a
    cached one leaked them into the next jit (UnexpectedTracerError)."""
    mask = splash.MultiHeadMask([_mask(padded, causal, window) for _ in range(heads)])
    sizes = splash.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block,
        block_q_dkv=block, block_kv_dkv=block, block_kv_dkv_compute=block,
        block_q_dq=None if fused_backward else block,
        block_kv_dq=None if fused_backward else block,
        use_fused_bwd_kernel=fused_backward)
    return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=(pltpu.InterpretParams() if interpret is True
                                             else bool(interpret)))


def _sinks(normalizer: str, heads: int, sink_logits: jax.Array | None) -> jax.Array | None:
    if normalizer == "learned_sink":
        return sink_logits.astype(jnp.float32)
    if normalizer == "softmax_off_by_one":
        return jnp.zeros((heads,), jnp.float32)
    return None


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
    interpret: bool | None = None,
    block_sizes: dict[str, int] | None = None,
    window: int = 0,
    fused_backward: bool = False,
) -> jax.Array:
    """Splash attention then the gate; arguments mean what they mean in `ops.attention`.

    interpret: run in the Pallas TPU interpret mode (None: exactly when the target is a CPU).
    block_sizes: {"block_q": n} caps splash's square tile (512 / 256 / 128).
    fused_backward: dq, dk and dv in one backward kernel (default: dq in its own; above).
    The arguments every kernel takes are trusted (ops.attention checked them; `attention`
    checks them for a direct call); what splash alone refuses is checked here.
    """
    fc.check_kernel_args(NAME, q, k)
    if normalizer not in NORMALIZERS:
        raise UserError(f"impl='splash' supports normalizer in {', '.join(NORMALIZERS)}, not "
                        f"{normalizer!r}; use impl='pallas_tpu', 'xla' or 'auto'")
    if jax.config.jax_enable_x64:
        raise UserError("impl='splash' does not trace with jax_enable_x64 on (jax's kernel "
                        "mixes int32 and int64 indices); use impl='pallas_tpu' or 'auto'")
    b, s, h, d = q.shape
    padded = fc.round_up(s, LANES)
    preferred = (block_sizes or {}).get("block_q", 512)
    kernel = _kernel(h, padded, causal, tile(padded, preferred),
                     fc.resolve_interpret(interpret), window, fused_backward)

    def head_major(x, scale=1.0):  # [b, s, n, d] -> [b, n, S, d]
        return fc.pad_axis(jnp.einsum("bsnd->bnsd", x) * jnp.asarray(scale, x.dtype), 2, padded)

    ids = segment_ids
    if ids is None and not causal and padded != s:
        ids = jnp.zeros((b, s), jnp.int32)  # only so the padding gets a segment of its own
    seg = None
    if ids is not None:
        ids = fc.pad_axis(ids.astype(jnp.int32), 1, padded, PADDING_SEGMENT)
        seg = splash.SegmentIds(q=ids, kv=ids)
    sinks = _sinks(normalizer, h, sink_logits)
    out = jax.vmap(kernel, in_axes=(0, 0, 0, 0, None))(
        head_major(q, d ** -0.5), head_major(k), head_major(v), seg, sinks)
    out = jnp.einsum("bhsd->bshd", out[:, :, :s])
    return apply_output_gate(out, gate, gate_activation)


attention = checked(trusted_attention)
