"""Attention kernels behind one call, `ops.attention`.

Kernels here are plain functions of arrays (no Flax, no configs). `impl` picks one:
"xla" (reference.py, every feature, any platform), "chunked" (chunked.py: the same
features blockwise, never holding S x S), "cudnn" (jax.nn.dot_product_attention on
GPU: plain softmax, no segment ids), "pallas_gpu", "pallas_tpu", or "auto", which picks the
fastest path that supports every feature asked for and never silently drops one.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from gated_attention.ops.gating import GATE_ACTIVATIONS, apply_output_gate, gate_activation
from gated_attention.ops.reference import NORMALIZERS
from gated_attention.ops.target import compiling_for, target_platform

IMPLS = ("xla", "cudnn", "pallas_gpu", "pallas_tpu", "chunked", "auto")

__all__ = ["IMPLS", "NORMALIZERS", "GATE_ACTIVATIONS", "attention", "resolve_impl",
           "compiling_for", "target_platform",
           "apply_output_gate", "gate_activation", "validate_attention_args"]


def validate_attention_args(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    gate: jax.Array | None,
    gate_activation: str,
    segment_ids: jax.Array | None,
    normalizer: str,
    sink_logits: jax.Array | None,
    impl: str,
) -> None:
    """Raise a ValueError naming the argument and its allowed values, before any tracing."""
    if impl not in IMPLS:
        raise ValueError(f"impl={impl!r} is not allowed; choose one of {', '.join(IMPLS)}")
    if normalizer not in NORMALIZERS:
        raise ValueError(
            f"normalizer={normalizer!r} is not allowed; choose one of {', '.join(NORMALIZERS)}"
        )
    if gate_activation not in GATE_ACTIVATIONS:
        raise ValueError(
            f"gate_activation={gate_activation!r} is not allowed; choose one of "
            f"{', '.join(GATE_ACTIVATIONS)}"
        )
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise ValueError("q, k, v must be [batch, seq, heads, head_dim]; got shapes "
                         f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    b, s, h, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v batch and head_dim must match q; got q {q.shape}, k {k.shape}")
    if h % k.shape[2]:
        raise ValueError(f"query heads ({h}) must be a multiple of kv heads ({k.shape[2]})")
    if gate is not None and gate.shape not in ((b, s, h, d), (b, s, h)):
        raise ValueError(
            f"gate must be [b, s, h, d]={(b, s, h, d)} (elementwise) or [b, s, h]={(b, s, h)} "
            f"(headwise); got {gate.shape}"
        )
    if segment_ids is not None and segment_ids.shape != (b, s):
        raise ValueError(f"segment_ids must be [batch, seq]={(b, s)}; got {segment_ids.shape}")
    if normalizer == "learned_sink":
        if sink_logits is None or sink_logits.shape != (h,):
            got = None if sink_logits is None else sink_logits.shape
            raise ValueError(f"normalizer='learned_sink' needs sink_logits of shape ({h},); "
                             f"got {got}")
    elif sink_logits is not None:
        raise ValueError(f"sink_logits is only used with normalizer='learned_sink', "
                         f"not {normalizer!r}")


def resolve_impl(impl: str, *, segment_ids: jax.Array | None, normalizer: str,
                 platform: str | None = None, dtype: jnp.dtype | None = None,
                 same_length: bool = True) -> str:
    """Map "auto" to the fastest implementation that supports every requested feature.

    TPU: the Pallas Mosaic kernel (every feature). GPU: cuDNN when it can do the job (plain
    softmax, no segment ids, 16-bit inputs; a gate is applied right after it and XLA fuses it,
    about 1-2% per the anchors), else the Pallas Triton kernel. Pallas kernels are
    self-attention only, so unequal query/key lengths fall back to XLA. CPU: XLA.
    """
    if impl != "auto":
        return impl
    platform = platform or target_platform()
    cudnn_ok = (same_length and segment_ids is None and normalizer == "softmax"
                and dtype is not None and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16))
    if platform == "gpu" and cudnn_ok:
        return "cudnn"
    if not same_length:
        return "xla"
    if platform == "tpu":
        return "pallas_tpu"
    if platform == "gpu":
        return "pallas_gpu"
    return "xla"


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
    impl: str = "xla",
    interpret: bool = False,
    block_sizes: dict[str, int] | None = None,
) -> jax.Array:
    """softmax-family attention with an optional fused output gate `out * act(gate)`.

    q [b, s, h, d]; k, v [b, t, kv_heads, d]; gate [b, s, h, d] or [b, s, h];
    segment_ids [b, s] (packed sequences never attend across segments);
    sink_logits [h] for normalizer="learned_sink".
    """
    validate_attention_args(
        q, k, v, gate=gate, gate_activation=gate_activation, segment_ids=segment_ids,
        normalizer=normalizer, sink_logits=sink_logits, impl=impl,
    )
    impl = resolve_impl(impl, segment_ids=segment_ids, normalizer=normalizer, dtype=q.dtype,
                        same_length=k.shape[1] == q.shape[1])
    kwargs = dict(gate=gate, gate_activation=gate_activation, segment_ids=segment_ids,
                  causal=causal, normalizer=normalizer, sink_logits=sink_logits)
    if impl == "xla":
        from gated_attention.ops import reference

        return reference.attention(q, k, v, **kwargs)
    if impl == "chunked":  # blockwise XLA, memory linear in length (long-context evaluation)
        from gated_attention.ops import chunked

        blocks = {name: size for name, size in (block_sizes or {}).items()
                  if name in ("block_q", "block_kv")}
        return chunked.attention(q, k, v, **kwargs, **blocks)
    if impl == "cudnn":
        from gated_attention.ops import cudnn

        return cudnn.attention(q, k, v, **kwargs)
    if impl == "pallas_gpu":
        from gated_attention.ops import pallas_gpu as pallas
    else:
        from gated_attention.ops import pallas_tpu as pallas
    from gated_attention.sharding import shard_map_attention

    def kernel(q, k, v, **optional):
        return pallas.attention(q, k, v, interpret=interpret, block_sizes=block_sizes,
                                gate_activation=gate_activation, causal=causal,
                                normalizer=normalizer, **optional)

    optional = dict(gate=gate, segment_ids=segment_ids, sink_logits=sink_logits)
    return shard_map_attention(kernel, q, k, v, optional)
