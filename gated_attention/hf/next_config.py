"""config.json of the Qwen3-Next family (`qwen3_next`, `qwen3_5_text`, `qwen3_5_moe_text`) <->
config.model fields, following transformers' configuration and modeling code for them.

Import accepts what this model reproduces exactly: every layer full attention (`layer_types`,
or `full_attention_interval=1`), no multi-token-prediction head, no attention bias (the gate
rows of q_proj would carry one), silu, default / linear / YaRN RoPE on the first
`int(head_dim * partial_rotary_factor)` channels (Qwen3.5's interleaved M-RoPE reduces to it for
text, whose three position streams are equal), and feed-forwards that are all dense or all MoE
(Qwen3-Next: `mlp_only_layers`, `decoder_sparse_step`, `num_experts`) with a shared expert.
Anything else fails in one line naming the file and the field.
"""

from __future__ import annotations

from typing import Any

from gated_attention.config.run_config import ConfigError
from gated_attention.hf.layouts import Layout
from gated_attention.hf.rope_fields import rope_fields
from gated_attention.model.model_config import ModelConfig

DEFAULT_PARTIAL_ROTARY = 0.25  # transformers' default for all three
DEFAULT_HEAD_DIM = 256
DEFAULT_INTERVAL = 4  # full_attention_interval: one full-attention layer in four


def _fail(where: str, message: str) -> None:
    raise ConfigError(f"{where}: {message}")


def _positive(hf: dict[str, Any], name: str, where: str, default: Any = None) -> int:
    value = hf.get(name, default)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        _fail(where, f"{name}={value!r} must be a positive integer")
    return value


def layer_types(hf: dict[str, Any], where: str) -> list[str]:
    """Every layer's type, refusing linear attention (with the field that made it)."""
    layers = hf["num_hidden_layers"]
    types = hf.get("layer_types")
    if types is None:
        interval = hf.get("full_attention_interval", DEFAULT_INTERVAL)
        if interval != 1:
            _fail(where, f"full_attention_interval={interval} (no layer_types) makes "
                  f"{interval - 1} of every {interval} layers linear attention (Gated DeltaNet), "
                  "which this model does not have; only 1, or layer_types all 'full_attention'")
        return ["full_attention"] * layers
    if not isinstance(types, list) or len(types) != layers:
        _fail(where, f"layer_types must list num_hidden_layers={layers} entries")
    for i, kind in enumerate(types):
        if kind != "full_attention":
            _fail(where, f"layer_types[{i}]={kind!r} is not supported (linear-attention layers "
                  "are not part of this model); only 'full_attention'")
    return types


def partial_rotary_factor(hf: dict[str, Any], where: str) -> float:
    parameters = hf.get("rope_parameters") or {}
    factor = hf.get("partial_rotary_factor",
                    parameters.get("partial_rotary_factor", DEFAULT_PARTIAL_ROTARY))
    if not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        _fail(where, f"partial_rotary_factor={factor!r} must be in (0, 1]")
    return float(factor)


def moe_layers(hf: dict[str, Any], layout: Layout, where: str) -> bool:
    """True when every layer is MoE, False when every layer is dense; refuses a mix."""
    if layout.name == "qwen3_5":
        return False
    if layout.name == "qwen3_5_moe":
        return True
    layers, experts = hf["num_hidden_layers"], hf.get("num_experts", 0)
    step, only = hf.get("decoder_sparse_step", 1), hf.get("mlp_only_layers") or []
    sparse = [i for i in range(layers)
              if i not in only and experts > 0 and (i + 1) % step == 0]
    if sparse and len(sparse) != layers:
        field = "mlp_only_layers" if only else "decoder_sparse_step"
        _fail(where, f"{field}={hf.get(field)!r} mixes dense and MoE layers, which this model "
              "does not; only all-MoE (mlp_only_layers=[], decoder_sparse_step=1) or all-dense "
              "(num_experts=0)")
    return bool(sparse)


def model_fields(hf: dict[str, Any], layout: Layout, where: str) -> dict[str, Any]:
    """config.model fields of a Qwen3-Next-family text config (validated)."""
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        _positive(hf, name, where)
    layer_types(hf, where)
    if hf.get("hidden_act", "silu") != "silu":
        _fail(where, f"hidden_act={hf['hidden_act']!r} is not supported; choose one of silu")
    if hf.get("mtp_num_hidden_layers"):
        _fail(where, f"mtp_num_hidden_layers={hf['mtp_num_hidden_layers']} is not supported "
              "(multi-token-prediction heads are not part of this model); only 0")
    if hf.get("attention_bias"):
        _fail(where, "attention_bias=true is not supported (the gate rows of q_proj would carry "
              "a bias); only false")
    heads = hf["num_attention_heads"]
    rope_base, rope_scaling = rope_fields(hf, where)
    fields = dict(
        vocab_size=hf["vocab_size"], num_layers=hf["num_hidden_layers"],
        d_model=hf["hidden_size"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or DEFAULT_HEAD_DIM,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=True, zero_centred_norm=True, rope_base=rope_base,
        partial_rotary_factor=partial_rotary_factor(hf, where),
        norm_eps=float(hf.get("rms_norm_eps", 1e-6)), qkv_bias=False, o_proj_bias=False,
        num_experts=0, experts_per_token=0, expert_mlp_dim=0, shared_expert_mlp_dim=0,
        rope_scaling=rope_scaling,
    )
    rotary = int(fields["head_dim"] * fields["partial_rotary_factor"])
    if rotary % 2 or not rotary:
        _fail(where, f"partial_rotary_factor={fields['partial_rotary_factor']} rotates {rotary} "
              f"of head_dim={fields['head_dim']} channels; it must be even and non-zero")
    if moe_layers(hf, layout, where):
        fields.update(
            num_experts=_positive(hf, "num_experts", where),
            experts_per_token=_positive(hf, "num_experts_per_tok", where),
            expert_mlp_dim=_positive(hf, "moe_intermediate_size", where),
            shared_expert_mlp_dim=_positive(hf, "shared_expert_intermediate_size", where),
            # Qwen3.5-MoE's router always renormalises its top-k weights.
            moe_renormalize=(True if layout.name == "qwen3_5_moe"
                             else bool(hf.get("norm_topk_prob", True))),
            moe_capacity_factor=0.0)
        fields["mlp_dim"] = hf.get("intermediate_size") or fields["expert_mlp_dim"]
    else:
        fields["mlp_dim"] = _positive(hf, "intermediate_size", where)
    return fields


def hf_fields(cfg: ModelConfig, layout: Layout, rope: dict[str, Any] | None,
              max_len: int) -> dict[str, Any]:
    """The Qwen3-Next-family config.json fields of a model (refusals are the caller's)."""
    heads, kv_heads = cfg.heads
    parameters: dict[str, Any] = {"rope_type": "default", **(rope or {}),
                                  "rope_theta": cfg.rope_base,
                                  "partial_rotary_factor": cfg.partial_rotary_factor}
    out: dict[str, Any] = {
        "architectures": [layout.moe_architecture if cfg.is_moe else layout.dense_architecture],
        "model_type": layout.moe_model_type if cfg.is_moe else layout.dense_model_type,
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps, "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": False, "attention_dropout": 0.0,
        "layer_types": ["full_attention"] * cfg.num_layers, "full_attention_interval": 1,
        "partial_rotary_factor": cfg.partial_rotary_factor, "rope_theta": cfg.rope_base,
        "rope_parameters": parameters, "max_position_embeddings": max_len,
        "mtp_num_hidden_layers": 0,
    }
    if rope:  # transformers 4 reads the scaling from rope_scaling
        out["rope_scaling"] = rope
    if layout.name == "qwen3_next":
        out.update(intermediate_size=cfg.mlp_dim, decoder_sparse_step=1, mlp_only_layers=[],
                   num_experts=0)
    elif layout.name == "qwen3_5":
        out.update(intermediate_size=cfg.mlp_dim)
    if cfg.is_moe:
        experts, top_k = cfg.experts
        out.update(num_experts=experts, num_experts_per_tok=top_k,
                   moe_intermediate_size=cfg.expert_mlp_dim,
                   shared_expert_intermediate_size=cfg.shared_expert_mlp_dim)
        if layout.name == "qwen3_next":
            out["norm_topk_prob"] = cfg.moe_renormalize
    return out

