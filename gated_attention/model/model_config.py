"""The model's own description (`ModelConfig`), beside the model: the layers and model.py
read it at run time, so it sits on their floor and imports only what it names (variants,
RoPE scaling, the kernel and MoE choices). The run config (run_config) builds one from its
model and attention sections."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from gated_attention.core.checks import ConfigError, choice, require
from gated_attention.model.layers.moe_ops import MOE_IMPLS
from gated_attention.model.layers.rope import NO_SCALING, RopeScaling
from gated_attention.model.variants import VARIANTS, AttentionVariant, VariantError
from gated_attention.ops import IMPLS as ATTENTION_IMPLS

# model.remat -> the jax.checkpoint policy of each decoder block ("full" saves only the block
# input); "none" runs without rematerialisation. ModelConfig checks model.remat against these.
REMAT_POLICIES = {
    "full": None,
    "dots_with_no_batch_dims_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "nothing_saveable": jax.checkpoint_policies.nothing_saveable,
}
REMAT_CHOICES = ("none", *REMAT_POLICIES)
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model's own description, frozen: the layers read this, never the ConfigDict, so a
    model can be built from a notebook too. Its field defaults are the model section's
    defaults (`model_section` starts from them) and every model field is checked here, once.
    """

    vocab_size: int
    num_layers: int
    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_dim: int
    variant: AttentionVariant = AttentionVariant(name="baseline")
    tied_embeddings: bool = True
    qk_norm: bool = True
    # Biases on the q/k/v projections and on o_proj (off in the paper; Qwen-style imports).
    qkv_bias: bool = False
    o_proj_bias: bool = False
    zero_centred_norm: bool = False
    rope_base: float = 10_000.0
    # RoPE on the first int(head_dim * partial_rotary_factor) channels only (Qwen3-Next: 0.25).
    partial_rotary_factor: float = 1.0
    rope_scaling: RopeScaling = NO_SCALING  # base change, linear, NTK-aware or YaRN
    norm_eps: float = 1e-6
    dtype: str = "float32"
    attention_impl: str = "auto"  # one of ops.IMPLS; "auto" picks per compile target
    block_sizes: tuple[tuple[str, int], ...] = ()
    # Splash's backward: dq, dk and dv in one kernel (True) or dq in its own (ops/splash.py).
    splash_fused_backward: bool = False
    remat: str = "none"
    # One scanned block over parameters stacked on a leading "layers" axis (flat compile time).
    scan_layers: bool = False
    # Mixture of experts: num_experts == 0 means a dense SwiGLU FFN.
    num_experts: int = 0
    experts_per_token: int = 0
    expert_mlp_dim: int = 0
    moe_renormalize: bool = True
    # Qwen3-Next / Qwen3.5-MoE: a dense SwiGLU expert every token uses, behind a sigmoid gate.
    shared_expert_mlp_dim: int = 0
    moe_capacity_factor: float = 0.0
    moe_impl: str = "ragged"

    @property
    def compute_dtype(self) -> jnp.dtype:
        return DTYPES[self.dtype]

    @property
    def heads(self) -> tuple[int, int]:
        """(query heads, kv heads) after the variant's head-count deltas."""
        return self.variant.resolve_heads(self.num_heads, self.num_kv_heads)

    @property
    def experts(self) -> tuple[int, int]:
        """(experts, experts per token) after the variant's `extra_experts` delta."""
        extra = self.variant.extra_experts
        return self.num_experts + extra, self.experts_per_token + extra

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def rotary_dim(self) -> int:
        """Channels of each head RoPE rotates (the first ones; the rest pass through)."""
        return int(self.head_dim * self.partial_rotary_factor)

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "num_layers", "d_model", "num_heads", "num_kv_heads",
                     "head_dim", "mlp_dim"):
            require(getattr(self, name) > 0, f"model.{name}={getattr(self, name)} must be > 0")
        choice("model.dtype", self.dtype, DTYPES)
        choice("model.remat", self.remat, REMAT_CHOICES)
        choice("model.attention_impl", self.attention_impl, ATTENTION_IMPLS)
        require(isinstance(self.splash_fused_backward, bool),
                f"model.splash_fused_backward={self.splash_fused_backward!r} must be true or "
                "false")
        require(not self.head_dim % 2, f"model.head_dim={self.head_dim} must be even for RoPE")
        require(0 < self.partial_rotary_factor <= 1 and not self.rotary_dim % 2
                and self.rotary_dim > 0,
                f"model.partial_rotary_factor={self.partial_rotary_factor} must be in (0, 1] "
                "and rotate an even, non-zero number of head_dim channels")
        require(not self.shared_expert_mlp_dim or self.is_moe,
                f"model.shared_expert_mlp_dim={self.shared_expert_mlp_dim} needs an MoE arch "
                "(model.num_experts > 0); only 0 for a dense FFN")
        require(self.shared_expert_mlp_dim >= 0,
                f"model.shared_expert_mlp_dim={self.shared_expert_mlp_dim} must be >= 0 "
                "(0: no shared expert)")
        require(not self.qkv_bias or self.variant.switch_target == "none",
                f"model.qkv_bias=True needs plain k/v projections; variant "
                f"{self.variant.name!r} uses Switch-Head projections (switch_target="
                f"{self.variant.switch_target!r})")
        self.heads  # noqa: B018 - validates GQA divisibility after the variant's deltas
        require(not self.variant.extra_experts or self.is_moe,
                f"variant {self.variant.name!r} adds experts, which needs an MoE arch "
                "(model.num_experts > 0), e.g. arch=moe_15a2b or tiny_moe")
        if self.is_moe:
            experts, top_k = self.experts
            require(1 <= top_k <= experts, f"model.experts_per_token={self.experts_per_token} "
                    f"must be in 1..num_experts={self.num_experts}")
            require(self.expert_mlp_dim > 0, f"model.expert_mlp_dim={self.expert_mlp_dim} must "
                    "be > 0 for an MoE arch")
            choice("model.moe_impl", self.moe_impl, MOE_IMPLS)
            require(self.moe_capacity_factor >= 0, f"model.moe_capacity_factor="
                    f"{self.moe_capacity_factor} must be >= 0 (0 means dropless)")


# The model section's fields that are ModelConfig fields as they are (the other three are
# built from sub-sections: the variant from config.attention, block_sizes, rope_scaling).
MODEL_FIELDS = ({f.name for f in dataclasses.fields(ModelConfig)}
                - {"variant", "block_sizes", "rope_scaling"})
VARIANT_FIELDS = [f.name for f in dataclasses.fields(AttentionVariant)]


def variant_from_section(attention: Mapping[str, Any]) -> AttentionVariant:
    """`config.attention` as a validated AttentionVariant (unknown fields refused)."""
    unknown = set(attention.keys()) - set(VARIANT_FIELDS)
    if unknown:
        raise ConfigError(f"attention.{sorted(unknown)[0]} is not a variant field; allowed: "
                          f"{', '.join(VARIANT_FIELDS)}")
    try:
        return AttentionVariant(**{k: attention[k] for k in VARIANT_FIELDS if k in attention})
    except VariantError as err:
        raise ConfigError(f"attention: {err}") from None


def variant_label(attention: Mapping[str, Any]) -> str:
    """The variant's name as the fields say: the paper variant `config.attention` was copied
    from (attention.name), then "+field=value" for each axis set apart from it."""
    variant = variant_from_section(attention)
    base = variant.name.split("+")[0]
    reference = VARIANTS.get(base, AttentionVariant(name=base))
    changed = [f"{k}={getattr(variant, k)}" for k in VARIANT_FIELDS
               if k != "name" and getattr(variant, k) != getattr(reference, k)]
    return "+".join([base, *changed])


def rope_scaling_from_section(section: Mapping[str, Any] | None) -> RopeScaling:
    """`config.model.rope_scaling` as a validated RopeScaling (absent in older run configs)."""
    if section is None:
        return RopeScaling()
    allowed = [f.name for f in dataclasses.fields(RopeScaling)]
    unknown = set(section.keys()) - set(allowed)
    if unknown:
        raise ConfigError(f"model.rope_scaling.{sorted(unknown)[0]} is not a field; allowed: "
                          f"{', '.join(allowed)}")
    try:
        return RopeScaling(**dict(section))
    except ValueError as err:
        raise ConfigError(str(err)) from None


def from_sections(model: Mapping[str, Any], attention: Mapping[str, Any]) -> ModelConfig:
    """The validated ModelConfig of a run config's model and attention sections (raises
    ConfigError naming the field, before anything is built)."""
    variant = variant_from_section(attention)
    fields = {k: model[k] for k in MODEL_FIELDS if k in model}
    block_sizes = tuple((k, int(v)) for k, v in model["block_sizes"].items() if v)
    rope_scaling = rope_scaling_from_section(model.get("rope_scaling"))
    return ModelConfig(variant=variant, block_sizes=block_sizes, rope_scaling=rope_scaling,
                       **fields)
