"""Attention variants as data: every row of the paper's tables is one `AttentionVariant`.

A variant is a small frozen dataclass validated once at construction. The model is built from
it in three places (layers/gates.py, layers/attention.py, and layers/block.py for
sandwich norm); two more branch on it to check and count (model_config.ModelConfig: heads,
experts, Switch-Head bias; accounting.py: gate parameters). The rest only read fields to
report or map them (analysis/stats.py, telemetry.py, intervene.py, hf/).
The general form of a gate is `Y' = Y (op) act(X W)` (docs/method.md), so each axis of variation
is one field here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gated_attention.core.checks import ConfigError, choice

# Kernel vocabularies live with the kernels (ops/); a variant only chooses among them.
from gated_attention.ops import GATE_ACTIVATIONS as ACTIVATIONS
from gated_attention.ops import NORMALIZERS

GATE_POSITIONS = ("none", "sdpa", "value", "key", "query", "dense_output")
POSITION_ALIASES = {"G1": "sdpa", "G2": "value", "G3": "key", "G4": "query", "G5": "dense_output"}
GRANULARITIES = ("elementwise", "headwise")
SHARINGS = ("head_specific", "head_shared")
COMBINES = ("multiply", "add")
GATE_INPUTS = ("hidden", "constant")
SDPA_TRANSFORMS = ("none", "silu", "rmsnorm")
SWITCH_TARGETS = ("none", "v", "kv")
GATE_INITS = ("normal", "zeros")


class VariantError(ConfigError):
    """A variant field holds a value outside its allowed set, or fields contradict."""


@dataclasses.dataclass(frozen=True)
class AttentionVariant:
    """One point of the paper's variant space (docs/method.md, "The variant space").

    Gate fields only matter when `gate_position != "none"`; architecture deltas
    (`q_heads_multiplier`, `kv_heads_multiplier`, `extra_experts`, `sandwich_norm`,
    `switch_*`) change the base architecture the way the paper's baselines did.
    """

    name: str = "custom"
    gate_position: str = "none"
    granularity: str = "elementwise"
    sharing: str = "head_specific"
    combine: str = "multiply"
    activation: str = "sigmoid"
    gate_input: str = "hidden"
    sdpa_transform: str = "none"
    normalizer: str = "softmax"
    q_heads_multiplier: float = 1.0
    kv_heads_multiplier: float = 1.0
    extra_experts: int = 0
    sandwich_norm: bool = False
    switch_target: str = "none"
    switch_experts: int = 1
    switch_top_k: int = 1
    # Axes beyond the paper's tables (docs/beyond.md).
    gate_input_dims: int = 0          # the gate reads X[..., :k]; 0 = all of D
    gate_input_fraction: float = 1.0  # ... or the first round(fraction * D) dimensions
    gate_rank: int = 0                # W_gate = A B with A [k, r], B [r, out]; 0 = full rank
    gate_scale: float = 1.0           # scores = gate_scale * act(X W): 2 with sigmoid = 2σ
    gate_init: str = "normal"         # W_gate init: normal(0, 0.02) or zeros
    gate_bias: bool = False           # a learned bias on the gate logits ...
    gate_bias_init: float = 0.0       # ... initialised to this value
    extra_gate_positions: str = ""    # more gated positions, comma-separated (e.g. "value")
    exclusive_self_attention: bool = False  # XSA: drop y_i's component along its own v_i
    window: int = 0                   # sliding window: a query sees its last `window` keys

    def __post_init__(self) -> None:
        position = POSITION_ALIASES.get(self.gate_position, self.gate_position)
        object.__setattr__(self, "gate_position", position)
        choice("gate_position", self.gate_position, GATE_POSITIONS, VariantError)
        choice("granularity", self.granularity, GRANULARITIES, VariantError)
        choice("sharing", self.sharing, SHARINGS, VariantError)
        choice("combine", self.combine, COMBINES, VariantError)
        choice("activation", self.activation, ACTIVATIONS, VariantError)
        choice("gate_input", self.gate_input, GATE_INPUTS, VariantError)
        choice("sdpa_transform", self.sdpa_transform, SDPA_TRANSFORMS, VariantError)
        choice("normalizer", self.normalizer, NORMALIZERS, VariantError)
        choice("switch_target", self.switch_target, SWITCH_TARGETS, VariantError)
        if self.granularity == "headwise" and self.sharing == "head_shared":
            raise VariantError(
                "granularity='headwise' with sharing='head_shared' leaves one scalar for all "
                "heads; use granularity='elementwise' or sharing='head_specific'"
            )
        if self.gate_position == "dense_output" and self.granularity == "headwise":
            raise VariantError(
                "gate_position='dense_output' (G5) has no heads; granularity must be "
                "'elementwise'"
            )
        if self.gate_position == "dense_output" and self.sharing == "head_shared":
            raise VariantError("gate_position='dense_output' (G5) has no heads; sharing must be "
                               "'head_specific'")
        if self.gate_input == "constant" and self.combine == "add":
            raise VariantError("gate_input='constant' supports combine='multiply' only")
        if self.sdpa_transform != "none" and self.gate_position not in ("none", "sdpa"):
            raise VariantError(
                "sdpa_transform acts on the SDPA output; combine it with gate_position "
                "'none' or 'sdpa', not " + repr(self.gate_position)
            )
        for field in ("q_heads_multiplier", "kv_heads_multiplier"):
            if getattr(self, field) <= 0:
                raise VariantError(f"{field}={getattr(self, field)} must be > 0")
        if self.extra_experts < 0:
            raise VariantError(f"extra_experts={self.extra_experts} must be >= 0")
        self._check_beyond_axes()
        if self.switch_target != "none":
            if self.switch_experts < 1:
                raise VariantError(f"switch_experts={self.switch_experts} must be >= 1")
            if not 1 <= self.switch_top_k <= self.switch_experts:
                raise VariantError(
                    f"switch_top_k={self.switch_top_k} must be in 1..switch_experts="
                    f"{self.switch_experts}"
                )

    def _check_beyond_axes(self) -> None:
        choice("gate_init", self.gate_init, GATE_INITS, VariantError)
        if self.gate_input_dims < 0:
            raise VariantError(f"gate_input_dims={self.gate_input_dims} must be >= 0 "
                               "(0 = all of d_model)")
        if not 0.0 < self.gate_input_fraction <= 1.0:
            raise VariantError(f"gate_input_fraction={self.gate_input_fraction} must be in "
                               "(0, 1]")
        if self.gate_input_dims and self.gate_input_fraction != 1.0:
            raise VariantError("gate_input_dims and gate_input_fraction both set; set one "
                               "(gate_input_dims=0 or gate_input_fraction=1.0)")
        if self.gate_rank < 0:
            raise VariantError(f"gate_rank={self.gate_rank} must be >= 0 (0 = full rank)")
        if self.gate_scale <= 0:
            raise VariantError(f"gate_scale={self.gate_scale} must be > 0")
        if self.window < 0:
            raise VariantError(f"window={self.window} must be >= 0 (0 = no window)")
        shapes_gate = (self.gate_input_dims or self.gate_input_fraction != 1.0
                       or self.gate_rank or self.gate_init != "normal"
                       or self.gate_bias or self.gate_scale != 1.0 or self.extra_gate_positions)
        if shapes_gate and not self.gated:
            raise VariantError("gate_input_dims, gate_input_fraction, gate_rank, gate_scale, "
                               "gate_init, gate_bias and extra_gate_positions need a gate; set "
                               "gate_position to one of " + ", ".join(GATE_POSITIONS[1:]))
        if self.gate_input == "constant" and (self.gate_input_dims or self.gate_rank
                                              or self.gate_input_fraction != 1.0
                                              or self.gate_bias):
            raise VariantError("gate_input='constant' reads no input; gate_input_dims, "
                               "gate_input_fraction, gate_rank and gate_bias need "
                               "gate_input='hidden'")
        extra = self.extra_positions
        for position in extra:
            choice("extra_gate_positions", position, GATE_POSITIONS[1:], VariantError)
        if self.gate_position in extra or len(set(extra)) != len(extra):
            raise VariantError(f"extra_gate_positions={self.extra_gate_positions!r} repeats a "
                               f"gated position (gate_position={self.gate_position!r})")
        if "dense_output" in extra and (self.granularity == "headwise"
                                        or self.sharing == "head_shared"):
            raise VariantError("extra_gate_positions has 'dense_output' (G5), which has no "
                               "heads; granularity must be 'elementwise' and sharing "
                               "'head_specific'")
        if self.sdpa_transform != "none" and "sdpa" in extra:
            raise VariantError("sdpa_transform acts on the SDPA output; it cannot be combined "
                               "with an extra 'sdpa' gate")

    @property
    def extra_positions(self) -> tuple[str, ...]:
        """extra_gate_positions as canonical position names (aliases G1-G5 accepted)."""
        names = [p.strip() for p in self.extra_gate_positions.split(",") if p.strip()]
        return tuple(POSITION_ALIASES.get(p, p) for p in names)

    @property
    def gate_positions(self) -> tuple[str, ...]:
        """Every gated position: gate_position first, then the extra ones."""
        return (self.gate_position, *self.extra_positions) if self.gated else ()

    def gate_input_width(self, d_model: int) -> int:
        """How many leading dimensions of the normed input X the gate reads."""
        if self.gate_input_dims:
            if self.gate_input_dims > d_model:
                raise VariantError(f"gate_input_dims={self.gate_input_dims} must be <= "
                                   f"d_model={d_model}")
            return self.gate_input_dims
        return max(1, round(self.gate_input_fraction * d_model))

    @property
    def gated(self) -> bool:
        return self.gate_position != "none"

    @property
    def fusable_sdpa_gate(self) -> bool:
        """True when the G1 gate is `attn * act(logits)` that a kernel can fuse."""
        return (
            self.gate_position == "sdpa"
            and self.combine == "multiply"
            and self.sdpa_transform == "none"
            and self.gate_scale == 1.0
            and not self.exclusive_self_attention
        )

    def replace(self, **changes: Any) -> AttentionVariant:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def resolve_heads(self, num_heads: int, num_kv_heads: int) -> tuple[int, int]:
        """Apply the head-count deltas and check that GQA grouping still works."""
        heads = self.q_heads_multiplier * num_heads
        kv_heads = self.kv_heads_multiplier * num_kv_heads
        if heads != int(heads) or kv_heads != int(kv_heads):
            raise VariantError(
                f"variant {self.name!r}: q_heads_multiplier/kv_heads_multiplier give "
                f"{heads} query / {kv_heads} kv heads, which must be whole numbers"
            )
        heads, kv_heads = int(heads), int(kv_heads)
        if heads % kv_heads:
            raise VariantError(
                f"variant {self.name!r}: num_heads={heads} is not divisible by "
                f"num_kv_heads={kv_heads}"
            )
        return heads, kv_heads


def _g(position: str, **kw: Any) -> dict[str, Any]:
    return {"gate_position": position, **kw}


# name -> fields. Names follow paper_tables.json exactly.
_VARIANT_FIELDS: dict[str, dict[str, Any]] = {
    # Table 1 baselines and architecture deltas.
    "baseline": {},
    "kv_heads_8": {"kv_heads_multiplier": 2.0},
    "q_heads_48": {"q_heads_multiplier": 1.5},
    "add_4_experts": {"extra_experts": 4},
    # Table 1 gates.
    "g1_sdpa_elementwise": _g("sdpa"),
    "g2_value_elementwise": _g("value"),
    "g3_key_elementwise": _g("key"),
    "g4_query_elementwise": _g("query"),
    "g5_dense_output": _g("dense_output"),
    "g1_sdpa_headwise": _g("sdpa", granularity="headwise"),
    "g2_value_headwise": _g("value", granularity="headwise"),
    "g1_sdpa_head_shared": _g("sdpa", sharing="head_shared"),
    "g2_value_head_shared": _g("value", sharing="head_shared"),
    "g1_sdpa_additive_silu": _g("sdpa", combine="add", activation="silu"),
    "g1_sdpa_elementwise_silu": _g("sdpa", activation="silu"),
    # Table 2.
    "baseline_sandwich_norm": {"sandwich_norm": True},
    # Table 3: non-linearity ablations at G1.
    "g1_sdpa_rmsnorm": {"sdpa_transform": "rmsnorm"},
    "g1_sdpa_silu_paramfree": {"sdpa_transform": "silu"},
    "g1_sdpa_additive_identity": _g("sdpa", combine="add", activation="identity"),
    # Table 4.
    "g1_input_independent": _g("sdpa", gate_input="constant"),
    "g1_ns_sigmoid": _g("sdpa", activation="ns_sigmoid"),
    # Table 6: Switch-Head baselines.
    "switch_kv_8top8": {"switch_target": "kv", "switch_experts": 8, "switch_top_k": 8},
    "switch_kv_4top4": {"switch_target": "kv", "switch_experts": 4, "switch_top_k": 4},
    "switch_v_4top4": {"switch_target": "v", "switch_experts": 4, "switch_top_k": 4},
    "switch_v_8top2": {"switch_target": "v", "switch_experts": 8, "switch_top_k": 2},
    "switch_v_1top1": {"switch_target": "v", "switch_experts": 1, "switch_top_k": 1},
    # Related attention-sink alternatives (not in the paper's tables).
    "softmax_off_by_one": {"normalizer": "softmax_off_by_one"},
    "learned_sink": {"normalizer": "learned_sink"},
    "softpick": {"normalizer": "softpick"},
    # Beyond the paper (docs/beyond.md): gate input width, rank, parametrisation, positions,
    # exclusive self-attention and sliding windows.
    "g1_input_16th": _g("sdpa", gate_input_fraction=1 / 16),
    "g1_input_12": _g("sdpa", gate_input_dims=12),
    "g1_headwise_input_12": _g("sdpa", granularity="headwise", gate_input_dims=12),
    "g1_rank_8": _g("sdpa", gate_rank=8),
    "g1_two_sigmoid_zero_init": _g("sdpa", gate_scale=2.0, gate_init="zeros"),
    "g1_bias_init_2": _g("sdpa", gate_bias=True, gate_bias_init=2.0),
    "g1_g2": _g("sdpa", extra_gate_positions="value"),
    "g1_g2_headwise": _g("sdpa", granularity="headwise", extra_gate_positions="value"),
    "xsa": {"exclusive_self_attention": True},
    "xsa_g1": _g("sdpa", exclusive_self_attention=True),
    "swa_32": {"window": 32},
    "swa_32_g1_headwise": _g("sdpa", granularity="headwise", window=32),
    "swa_32_g1": _g("sdpa", window=32),
}

# The names added beyond the paper's tables (docs/beyond.md), in registry order.
BEYOND_PAPER = tuple(list(_VARIANT_FIELDS)[list(_VARIANT_FIELDS).index("g1_input_16th"):])

VARIANTS: Mapping[str, AttentionVariant] = {
    name: AttentionVariant(name=name, **fields) for name, fields in _VARIANT_FIELDS.items()
}


def get_variant(name: str, **overrides: Any) -> AttentionVariant:
    """Look a variant up by its paper-table name, optionally overriding fields."""
    if name not in VARIANTS:
        raise VariantError(f"variant={name!r} is unknown; choose one of {', '.join(VARIANTS)}")
    variant = VARIANTS[name]
    if overrides:
        unknown = set(overrides) - {f.name for f in dataclasses.fields(AttentionVariant)}
        if unknown:
            allowed = ", ".join(f.name for f in dataclasses.fields(AttentionVariant))
            raise VariantError(
                f"variant override field(s) {sorted(unknown)} unknown; allowed: {allowed}"
            )
        variant = variant.replace(**overrides)
    return variant
