"""The Hugging Face layouts this project reads and writes, as data: which architecture names
them, how q_proj holds the G1 gate, which norm form and feed-forward they have.

- official: the paper's release (Qwen3 / Qwen3-MoE with `*_attn_output_gate` flags). q_proj's
  rows per kv group: the G query heads, then their G gate blocks (d rows elementwise, 1 headwise).
- qwen3: Qwen3 / Qwen3-MoE without a gate (the same tensors as official's baseline).
- qwen3_next, qwen3_5, qwen3_5_moe: q_proj's rows per *query head*: d query rows, then d gate
  rows (always an elementwise sigmoid gate); every RMSNorm is zero-centred (`1 + w`); RoPE on a
  fraction of each head; MoE layers add a shared expert behind a sigmoid gate.
"""

from __future__ import annotations

import dataclasses

from gated_attention.config.run_config import ConfigError


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    dense_architecture: str | None  # None: the layout has no dense form
    moe_architecture: str | None    # None: the layout has no MoE form
    dense_model_type: str | None
    moe_model_type: str | None
    q_gate: str                     # "kv_group" (official) or "per_head" (Qwen3-Next family)
    variants: tuple[str, ...]       # the project variants it can hold exactly
    zero_centred_norm: bool
    shared_expert: bool             # MoE layers carry a shared expert

    @property
    def next_family(self) -> bool:
        return self.q_gate == "per_head"


G1 = ("g1_sdpa_elementwise", "g1_sdpa_headwise")  # headwise: its row repeated over head_dim
LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (
    Layout("official", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "qwen3", "qwen3_moe",
           "kv_group", ("baseline", *G1), False, False),
    Layout("qwen3", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "qwen3", "qwen3_moe",
           "kv_group", ("baseline",), False, False),
    Layout("qwen3_next", "Qwen3NextForCausalLM", "Qwen3NextForCausalLM", "qwen3_next",
           "qwen3_next", "per_head", G1, True, True),
    Layout("qwen3_5", "Qwen3_5ForCausalLM", None, "qwen3_5_text", None, "per_head", G1, True,
           False),
    Layout("qwen3_5_moe", None, "Qwen3_5MoeForCausalLM", None, "qwen3_5_moe_text", "per_head",
           G1, True, True),
)}
# Multimodal Qwen3.5 folders: the text model's config under `text_config`, its weights under
# this prefix (the vision tower, `model.visual.*`, is not read).
MULTIMODAL = {"Qwen3_5ForConditionalGeneration": "qwen3_5",
              "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe"}
MULTIMODAL_MODEL_TYPES = {"qwen3_5": "qwen3_5", "qwen3_5_moe": "qwen3_5_moe"}
TEXT_PREFIX = "model.language_model."
ARCHITECTURES = {arch: layout.name for layout in LAYOUTS.values() if layout.name != "qwen3"
                 for arch in (layout.dense_architecture, layout.moe_architecture) if arch}
MODEL_TYPES = {mt: layout.name for layout in LAYOUTS.values() if layout.name != "qwen3"
               for mt in (layout.dense_model_type, layout.moe_model_type) if mt}


def get_layout(name: str, field: str = "--to") -> Layout:
    if name not in LAYOUTS:
        raise ConfigError(f"{field}={name!r} is not a Hugging Face layout; choose one of "
                          f"{', '.join(LAYOUTS)}")
    return LAYOUTS[name]


def layouts_holding(variant: str) -> list[str]:
    return [name for name, layout in LAYOUTS.items() if variant in layout.variants]
