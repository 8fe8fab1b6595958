"""Names of the intermediates the model can sow for analysis, and how to collect them.

The model sows with `module.sow(nnx.Intermediate, name, value)` only for the names asked for
(`model(tokens, capture=...)`), so training pays nothing. `collect` pops them into one dict
per layer. Attention probabilities are S x S: ask for them on short inputs only;
`first_token_attention` is computed query-chunk by query-chunk and is cheap at any length.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax
from flax import nnx

ATTENTION_CAPTURES = (
    "attention_probs",        # [b, heads, q, k]
    "first_token_attention",  # [b, heads, q]: weight on key 0
    "gate_scores",            # act(X W), shape of the variant's score
    "sdpa_before_gate",       # [b, s, heads, d]
    "sdpa_after_gate",        # [b, s, heads, d]
)
BLOCK_CAPTURES = (
    "attn_output",       # [b, s, D] attention branch output (after o_proj / G5 gate)
    "resid_after_attn",  # [b, s, D]
    "ffn_output",        # [b, s, D]
    "resid_after_ffn",   # [b, s, D]: the layer's output hidden state
)
CAPTURE_NAMES = ATTENTION_CAPTURES + BLOCK_CAPTURES


def validate_capture(names: Iterable[str]) -> frozenset[str]:
    names = frozenset(names)
    unknown = names - set(CAPTURE_NAMES)
    if unknown:
        raise ValueError(f"capture names {sorted(unknown)} unknown; choose from "
                         f"{', '.join(CAPTURE_NAMES)}")
    return names


def collect(model: nnx.Module) -> list[dict[str, jax.Array]]:
    """Pop sown intermediates from the model: one dict per layer, name -> array.

    A per-layer model sows under `layers.<i>.…`; a scanned one (model.scan_layers) sows under
    `layers.…` with the layer axis first, which is split here.
    """
    state = nnx.pop(model, nnx.Intermediate)
    per_layer: dict[int, dict[str, jax.Array]] = {}
    for path, leaf in nnx.to_flat_state(state):
        layer = next((int(p) for p in path if isinstance(p, int) or str(p).isdigit()), None)
        name = next(str(p) for p in reversed(path) if str(p) in CAPTURE_NAMES)
        value = leaf.get_value() if isinstance(leaf, nnx.Variable) else leaf
        if isinstance(value, tuple):  # sow appends to a tuple; each name is sown once per call
            value = value[-1]
        if layer is None:  # stacked by the scan: [layers, ...]
            for i in range(value.shape[0]):
                per_layer.setdefault(i, {})[name] = value[i]
        else:
            per_layer.setdefault(layer, {})[name] = value
    return [per_layer[i] for i in sorted(per_layer)]
