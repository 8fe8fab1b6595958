"""The model's own description (`ModelConfig`), beside the model: the layers and model.py
read it at run time, so it sits on their floor and imports only what it names (variants,
RoPE scaling, the kernel and MoE choices). The run config (config_lib) builds one from its
model and attention sections."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from gated_attention.layers.moe_ops import MOE_IMPLS
from gated_attention.layers.rope import NO_SCALING, RopeScaling
from gated_attention.ops import IMPLS as ATTENTION_IMPLS
from gated_attention.variants import AttentionVariant

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
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be > 0")
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype={self.dtype!r} is not allowed; choose one of "
                             f"{', '.join(DTYPES)}")
        if self.remat not in REMAT_CHOICES:
            raise ValueError(f"model.remat={self.remat!r} is not allowed; choose one of "
                             f"{', '.join(REMAT_CHOICES)}")
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"model.attention_impl={self.attention_impl!r} is not allowed; "
                             f"choose one of {', '.join(ATTENTION_IMPLS)}")
        if self.head_dim % 2:
            raise ValueError(f"model.head_dim={self.head_dim} must be even for RoPE")
        if not 0 < self.partial_rotary_factor <= 1 or self.rotary_dim % 2 or not self.rotary_dim:
            raise ValueError(f"model.partial_rotary_factor={self.partial_rotary_factor} must be in "
                             "(0, 1] and rotate an even, non-zero number of head_dim channels")
        if self.shared_expert_mlp_dim and not self.is_moe:
            raise ValueError(f"model.shared_expert_mlp_dim={self.shared_expert_mlp_dim} needs an "
                             "MoE arch (model.num_experts > 0); only 0 for a dense FFN")
        if self.shared_expert_mlp_dim < 0:
            raise ValueError(f"model.shared_expert_mlp_dim={self.shared_expert_mlp_dim} must be "
                             ">= 0 (0: no shared expert)")
        if self.qkv_bias and self.variant.switch_target != "none":
            raise ValueError("model.qkv_bias=True needs plain k/v projections; variant "
                             f"{self.variant.name!r} uses Switch-Head projections (switch_target="
                             f"{self.variant.switch_target!r})")
        self.heads  # noqa: B018 - validates GQA divisibility after the variant's deltas
        if self.variant.extra_experts and not self.is_moe:
            raise ValueError(f"variant {self.variant.name!r} adds experts, which needs an MoE "
                             "arch (model.num_experts > 0), e.g. arch=moe_15a2b or tiny_moe")
        if self.is_moe:
            experts, top_k = self.experts
            if not 1 <= top_k <= experts:
                raise ValueError(f"model.experts_per_token={self.experts_per_token} must be in "
                                 f"1..num_experts={self.num_experts}")
            if self.expert_mlp_dim <= 0:
                raise ValueError("model.expert_mlp_dim must be > 0 for an MoE arch")
            if self.moe_impl not in MOE_IMPLS:
                raise ValueError(f"model.moe_impl={self.moe_impl!r} is not allowed; choose one "
                                 f"of {', '.join(MOE_IMPLS)}")
            if self.moe_capacity_factor < 0:
                raise ValueError(f"model.moe_capacity_factor={self.moe_capacity_factor} must "
                                 "be >= 0 (0 means dropless)")
