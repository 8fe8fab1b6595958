"""cuDNN flash attention through jax.nn.dot_product_attention (GPU only).

It takes no segment ids and knows only plain softmax, so those requests are refused here
rather than silently dropped; the gate is applied right after, where XLA fuses it.
"""

from __future__ import annotations

import jax

from gated_attention.ops.gating import apply_output_gate
from gated_attention.ops.target import target_platform


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
    if segment_ids is not None:
        raise ValueError("impl='cudnn' does not support segment_ids; use impl='pallas_gpu', "
                         "'xla' or 'auto'")
    if normalizer != "softmax":
        raise ValueError(f"impl='cudnn' supports normalizer='softmax' only, not {normalizer!r}; "
                         "use impl='pallas_gpu', 'xla' or 'auto'")
    if target_platform() != "gpu":
        raise ValueError(f"impl='cudnn' needs a GPU; the target is {target_platform()!r}. "
                         "Use impl='xla' or 'auto'")
    out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    return apply_output_gate(out, gate, gate_activation)
