"""cuDNN flash attention over packed sequences (segment ids), then the gate (GPU only).

jax's public `jax.nn.dot_product_attention` takes no segment ids; its private cuDNN entry
point `jax._src.cudnn.fused_attention_stablehlo.dot_product_attention` takes per-row segment
lengths and start offsets (`q_seqlen` / `kv_seqlen` / `q_offsets` / `kv_offsets`, cuDNN's
packed "THD" layout, Hopper or later). `segment_offsets` builds them from segment ids inside
the jitted program: each run of equal ids is one segment (packed data keeps a document's
tokens contiguous; the XLA reference would also join two runs of one id, which packing never
writes). A row may hold up to seq_len segments, so that bound is used and nothing is dropped.

Private API: used only on the jax versions it is checked on (TESTED_JAX) and only while
the entry point keeps those arguments; elsewhere the call is refused with the alternatives.
Plain softmax and 16-bit inputs only, as cuDNN's flash attention.
"""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp

from gated_attention.core.errors import UserError
from gated_attention.ops.cudnn import check_target, target_checks
from gated_attention.ops.gating import apply_output_gate

# jax versions this path is compiled on (deviceless, the suite) and supported by the project;
# the entry point's signature is also checked at call time.
TESTED_JAX = ((0, 10, 2), (0, 12, 0))  # [low, high)
PACKED_ARGS = ("q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets")


def _jax_version() -> tuple[int, ...]:
    return tuple(int(p) for p in jax.__version__.split(".")[:3] if p.isdigit())


def check_api() -> None:
    """Refuse a jax whose private cuDNN entry point this module was not checked against."""
    low, high = TESTED_JAX
    if not low <= _jax_version() < high:
        raise UserError(f"impl='cudnn_packed' uses jax's private cuDNN API, checked on jax "
                        f"{'.'.join(map(str, low))} to before {'.'.join(map(str, high))}; this "
                        f"is jax {jax.__version__}. Use impl='pallas_gpu', 'xla' or 'auto'")
    from jax._src.cudnn import fused_attention_stablehlo as fused

    params = inspect.signature(fused.dot_product_attention).parameters
    missing = [a for a in PACKED_ARGS if a not in params]
    if missing:
        raise UserError(f"impl='cudnn_packed': jax {jax.__version__}'s cuDNN entry point has no "
                        f"{missing[0]!r}; use impl='pallas_gpu', 'xla' or 'auto'")


def segment_offsets(segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(lengths [b, s], offsets [b, s + 1]) of each row's segments, as cuDNN's packed layout
    takes them: segment m of row b starts at offsets[b, m] and holds lengths[b, m] tokens;
    entries past a row's last segment are -1.

    [[0, 0, 1, 1, 1, 2]] -> lengths [[2, 3, 1, -1, -1, -1]], offsets [[0, 2, 5, -1, ...]].
    """
    b, s = segment_ids.shape
    starts = jnp.concatenate([jnp.ones((b, 1), bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    index = jnp.cumsum(starts, axis=1, dtype=jnp.int32) - 1  # segment of each token
    count = index[:, -1:] + 1                                 # segments per row
    rows = jnp.arange(b)[:, None]
    lengths = jnp.zeros((b, s), jnp.int32).at[rows, index].add(1)
    slots = jnp.arange(s)[None, :]
    lengths = jnp.where(slots < count, lengths, -1)
    positions = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    # each start writes its position into its segment's slot; other tokens write nowhere
    target = jnp.where(starts, index, s + 1)
    offsets = jnp.full((b, s + 1), -1, jnp.int32).at[rows, target].set(positions, mode="drop")
    return lengths, offsets


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
) -> jax.Array:
    """Causal (or full) softmax attention within each segment, then `out * act(gate)`."""
    if normalizer != "softmax":
        raise UserError(f"impl='cudnn_packed' supports normalizer='softmax' only, not "
                        f"{normalizer!r}; use impl='pallas_gpu', 'xla' or 'auto'")
    if q.dtype not in (jnp.bfloat16, jnp.float16):
        raise UserError(f"impl='cudnn_packed' takes bfloat16 or float16 inputs, not {q.dtype}; "
                        "use impl='pallas_gpu', 'xla' or 'auto'")
    if k.shape[1] != q.shape[1]:
        raise UserError("impl='cudnn_packed' needs equal query and key lengths; use "
                        "impl='xla' or 'auto'")
    check_api()
    check_target("cudnn_packed", q)
    from jax._src.cudnn import fused_attention_stablehlo as fused

    if segment_ids is None:
        segment_ids = jnp.zeros(q.shape[:2], jnp.int32)
    lengths, offsets = segment_offsets(segment_ids)
    mask = fused.MaskType.PADDING_CAUSAL if causal else fused.MaskType.PADDING
    with target_checks():
        out = fused.dot_product_attention(
            q, k, v, q_seqlen=lengths, kv_seqlen=lengths, q_offsets=offsets,
            kv_offsets=offsets, scale=q.shape[-1] ** -0.5, mask_type=mask, qkv_layout="BTNH")
    return apply_output_gate(out, gate, gate_activation)
