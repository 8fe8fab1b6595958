"""Hugging Face `config.json` (Qwen3, Qwen3-MoE, the paper's gated release, and the Qwen3-Next
family in hf/next_config.py) <-> run config.

Import reads the architecture fields, picks the variant from the release's gate flags
(`headwise_attn_output_gate` -> g1_sdpa_headwise, `elementwise_attn_output_gate` ->
g1_sdpa_elementwise, neither -> baseline) and refuses, in one line naming the file and the
field, whatever this project's model cannot reproduce exactly (sliding windows, other RoPE
scalings, other activations, MoE layers mixed with dense ones, biases next to a packed gate).

Export writes the fields back. A run imported from Hugging Face keeps the original config.json
(as the string `config.hf_config`) and gets it back unchanged when nothing it maps was edited.
"""

from __future__ import annotations

import json
import math
from typing import Any

import ml_collections

from gated_attention.config import archs, run_config
from gated_attention.config.run_config import ConfigError
from gated_attention.hf import layouts, next_config
from gated_attention.hf.rope_fields import hf_rope_scaling, rope_fields
from gated_attention.model.model_config import ModelConfig

DENSE_ARCHITECTURE, MOE_ARCHITECTURE = "Qwen3ForCausalLM", "Qwen3MoeForCausalLM"
ARCHITECTURES = {DENSE_ARCHITECTURE: "qwen3", MOE_ARCHITECTURE: "qwen3_moe"}
GATE_FLAGS = {"headwise_attn_output_gate": "g1_sdpa_headwise",
              "elementwise_attn_output_gate": "g1_sdpa_elementwise"}


def _fail(where: str, message: str) -> None:
    raise ConfigError(f"{where}: {message}")


def detect(hf: dict[str, Any], where: str = "config.json") -> tuple[str, dict[str, Any]]:
    """(layout name, the text model's config) of a config.json; refuses other architectures.

    A multimodal Qwen3.5 config holds the text model under `text_config`; the top level's
    tie_word_embeddings and dtype apply to it.
    """
    names = hf.get("architectures") or []
    model_type = hf.get("model_type")
    multimodal = [layouts.MULTIMODAL[n] for n in names if n in layouts.MULTIMODAL]
    if not multimodal and not names and model_type in layouts.MULTIMODAL_MODEL_TYPES:
        multimodal = [layouts.MULTIMODAL_MODEL_TYPES[model_type]]
    if multimodal:
        text = hf.get("text_config")
        if not isinstance(text, dict):
            _fail(where, "text_config is missing; a multimodal Qwen3.5 config keeps the text "
                  "model's fields there")
        inherited = {k: hf[k] for k in ("tie_word_embeddings", "torch_dtype", "dtype")
                     if k in hf and k not in text}
        return multimodal[0], {**text, **inherited}
    known = [layouts.ARCHITECTURES[n] for n in names if n in layouts.ARCHITECTURES]
    supported = [*layouts.ARCHITECTURES, *layouts.MULTIMODAL]
    if names and not known:
        _fail(where, f"architectures={names} is not supported; choose one of "
              f"{', '.join(supported)}")
    if known:
        return known[0], hf
    if model_type not in layouts.MODEL_TYPES:
        _fail(where, f"model_type={model_type!r} is not supported; choose one of "
              f"{', '.join([*layouts.MODEL_TYPES, *layouts.MULTIMODAL_MODEL_TYPES])}")
    return layouts.MODEL_TYPES[model_type], hf


def is_moe(hf: dict[str, Any], where: str = "config.json") -> bool:
    """True for Qwen3-MoE, False for dense Qwen3; refuses any other architecture."""
    names = hf.get("architectures") or []
    known = [n for n in names if n in ARCHITECTURES]
    if names and not known:
        _fail(where, f"architectures={names} is not supported; choose one of "
              f"{', '.join(ARCHITECTURES)}")
    model_type = ARCHITECTURES[known[0]] if known else hf.get("model_type")
    if model_type not in ARCHITECTURES.values():
        _fail(where, f"model_type={model_type!r} is not supported; choose one of "
              f"{', '.join(ARCHITECTURES.values())}")
    return model_type == "qwen3_moe"


def variant_name(hf: dict[str, Any], where: str = "config.json") -> str:
    layout, hf = detect(hf, where)
    if layouts.LAYOUTS[layout].next_family:  # q_proj always holds an elementwise gate
        return "g1_sdpa_elementwise"
    on = [flag for flag in GATE_FLAGS if hf.get(flag)]
    if len(on) > 1:
        _fail(where, f"{on[0]} and {on[1]} are both true; at most one gate flag may be set")
    return GATE_FLAGS[on[0]] if on else "baseline"


def model_fields(hf: dict[str, Any], where: str = "config.json") -> dict[str, Any]:
    """The config.model fields of a Hugging Face config (validated; errors name the field)."""
    layout, hf = detect(hf, where)
    if layouts.LAYOUTS[layout].next_family:
        return next_config.model_fields(hf, layouts.LAYOUTS[layout], where)
    moe = is_moe(hf, where)
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads"):
        if not isinstance(hf.get(name), int) or hf[name] <= 0:
            _fail(where, f"{name}={hf.get(name)!r} must be a positive integer")
    if hf.get("hidden_act", "silu") != "silu":
        _fail(where, f"hidden_act={hf['hidden_act']!r} is not supported; choose one of silu")
    if hf.get("use_sliding_window"):
        _fail(where, "use_sliding_window=true is not supported (this model attends to the whole "
              "prefix); only false")
    windowed = [t for t in hf.get("layer_types") or [] if t != "full_attention"]
    if windowed:
        _fail(where, f"layer_types holds {windowed[0]!r}; only 'full_attention' is supported")
    variant = variant_name(hf, where)
    bias = bool(hf.get("attention_bias") or hf.get("qkv_bias"))
    if bias and variant != "baseline":
        field = "attention_bias" if hf.get("attention_bias") else "qkv_bias"
        _fail(where, f"{field}=true with a gate packed into q_proj is not supported (the gate "
              "rows would carry a bias); only false")
    heads = hf["num_attention_heads"]
    rope_base, rope_scaling = rope_fields(hf, where)
    fields = dict(
        vocab_size=hf["vocab_size"], num_layers=hf["num_hidden_layers"],
        d_model=hf["hidden_size"], num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        mlp_dim=hf.get("intermediate_size", 0),
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qk_norm=bool(hf.get("use_qk_norm", True)), zero_centred_norm=False,
        rope_base=rope_base, norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        qkv_bias=bias, o_proj_bias=bias, partial_rotary_factor=1.0,
        num_experts=0, experts_per_token=0, expert_mlp_dim=0, shared_expert_mlp_dim=0,
    )
    if moe:
        if hf.get("decoder_sparse_step", 1) != 1:
            _fail(where, f"decoder_sparse_step={hf['decoder_sparse_step']} is not supported "
                  "(every layer must be an MoE layer); only 1")
        if hf.get("mlp_only_layers"):
            _fail(where, f"mlp_only_layers={hf['mlp_only_layers']} is not supported (every layer "
                  "must be an MoE layer); only []")
        fields.update(num_experts=hf.get("num_experts", 0),
                      experts_per_token=hf.get("num_experts_per_tok", 0),
                      expert_mlp_dim=hf.get("moe_intermediate_size", 0),
                      moe_renormalize=bool(hf.get("norm_topk_prob", False)),
                      moe_capacity_factor=0.0)
        fields["mlp_dim"] = fields["mlp_dim"] or fields["expert_mlp_dim"]
        for name, key in (("num_experts", "num_experts"),
                          ("experts_per_token", "num_experts_per_tok"),
                          ("expert_mlp_dim", "moe_intermediate_size")):
            if not isinstance(fields[name], int) or fields[name] <= 0:
                _fail(where, f"{key}={hf.get(key)!r} must be a positive integer")
    elif not isinstance(fields["mlp_dim"], int) or fields["mlp_dim"] <= 0:
        _fail(where, f"intermediate_size={hf.get('intermediate_size')!r} must be a positive "
              "integer")
    fields["rope_scaling"] = rope_scaling
    return fields


def closest_arch(fields: dict[str, Any]) -> str:
    """The project arch nearest in size (a label: every model field is set explicitly)."""
    moe = fields["num_experts"] > 0
    candidates = [a for a, f in archs.ARCHS.items() if (f.get("num_experts", 0) > 0) == moe]
    size = fields["d_model"] * fields["num_layers"]
    return min(candidates, key=lambda a: abs(math.log(
        archs.ARCHS[a]["d_model"] * archs.ARCHS[a]["num_layers"] / size)))


def to_run_config(hf: dict[str, Any], *, dtype: str = "float32",
               where: str = "config.json") -> ml_collections.ConfigDict:
    """A full run config (base_config plus the imported fields) for a Hugging Face config."""
    fields = model_fields(hf, where)
    rope_scaling = fields.pop("rope_scaling")
    config = run_config.base_config(closest_arch(fields), variant_name(hf, where))
    config.model.update(fields)
    config.model.dtype = dtype
    if "scan_layers" in config.model:  # imports build one module per layer
        config.model.scan_layers = False
    if "rope_scaling" in config.model:
        config.model.rope_scaling.update(rope_scaling)
    elif rope_scaling["type"] != "none":
        field = "rope_scaling" if hf.get("rope_scaling") is not None else "rope_parameters"
        _fail(where, f"{field}.rope_type={rope_scaling['type']!r} needs config.model.rope_scaling, "
              "which this build lacks; only default RoPE")
    max_len = detect(hf, where)[1].get("max_position_embeddings")
    if isinstance(max_len, int) and max_len > 1:
        config.data.seq_len = min(config.data.seq_len, max_len)
    config.hf_config = json.dumps(hf, sort_keys=True)
    run_config.model_config(config)  # the project's own validation, before anything is built
    return config


def source_layout(config: ml_collections.ConfigDict) -> str:
    """The layout a run was imported from (official for the project's own runs)."""
    original = json.loads(config.get("hf_config") or "null")
    return detect(original)[0] if original else "official"


def check_exportable(cfg: ModelConfig, layout: layouts.Layout) -> None:
    """One-line refusals of what `layout` cannot express exactly, before anything is written."""
    variant = cfg.variant
    if variant != run_config.get_variant(variant.name):
        raise ConfigError(f"variant={variant.name!r} is edited (its fields differ from the named "
                          "variant), which no Hugging Face layout describes")
    if variant.name not in layout.variants:
        holding = layouts.layouts_holding(variant.name)
        raise ConfigError(f"variant={variant.name!r} has no {layout.name} form; layouts that can "
                          f"hold it: {', '.join(holding) or 'none'}")
    if cfg.qkv_bias != cfg.o_proj_bias:
        raise ConfigError(f"model.qkv_bias={cfg.qkv_bias} and model.o_proj_bias="
                          f"{cfg.o_proj_bias} differ; Qwen3 has one switch for both")
    if cfg.qkv_bias and (variant.name != "baseline" or layout.next_family):
        raise ConfigError("model.qkv_bias=True with a gate packed into q_proj has no Hugging "
                          f"Face form ({layout.name}); only False")
    next_names = [n for n, lay in layouts.LAYOUTS.items() if lay.next_family]
    if not layout.next_family:
        if cfg.partial_rotary_factor != 1.0:
            raise ConfigError(f"model.partial_rotary_factor={cfg.partial_rotary_factor} has no "
                              f"{layout.name} form (every channel rotates); layouts that can: "
                              f"{', '.join(next_names)}")
        if cfg.shared_expert_mlp_dim:
            raise ConfigError(f"model.shared_expert_mlp_dim={cfg.shared_expert_mlp_dim} has no "
                              f"{layout.name} form; layouts that can: qwen3_next, qwen3_5_moe")
        return
    if not cfg.qk_norm:
        raise ConfigError(f"model.qk_norm=False has no {layout.name} form (q and k are always "
                          "normalised); layouts that can: official, qwen3")
    if cfg.is_moe and layout.moe_architecture is None:
        raise ConfigError(f"model.num_experts={cfg.num_experts}: {layout.name} is dense; layouts "
                          "that can hold MoE layers: official, qwen3_next, qwen3_5_moe")
    if not cfg.is_moe and layout.dense_architecture is None:
        raise ConfigError(f"model.num_experts=0: {layout.name} is MoE only; layouts that can hold "
                          "a dense model: official, qwen3_next, qwen3_5")
    if cfg.is_moe and not cfg.shared_expert_mlp_dim:
        raise ConfigError(f"model.shared_expert_mlp_dim=0: {layout.name}'s MoE layers always have "
                          "a shared expert; layouts that can hold this run: official")
    if cfg.is_moe and layout.name == "qwen3_5_moe" and not cfg.moe_renormalize:
        raise ConfigError("model.moe_renormalize=False has no qwen3_5_moe form (its router always "
                          "renormalises); layouts that can: official, qwen3_next")


def hf_config(config: ml_collections.ConfigDict, *, dtype: str,
              layout: str | None = None) -> dict[str, Any]:
    """The Hugging Face config.json of a run config in `layout` (default: the layout it was
    imported from, else official); refuses what the layout cannot express."""
    cfg = run_config.model_config(config)
    target = layouts.get_layout(layout or source_layout(config))
    check_exportable(cfg, target)
    variant = cfg.variant
    rope = hf_rope_scaling(dict(config.model.get("rope_scaling") or {}))
    if target.next_family:
        out = next_config.hf_fields(cfg, target, rope, int(config.data.seq_len))
        out["torch_dtype"] = dtype
    else:
        heads, kv_heads = cfg.heads
        out = {
            "architectures": [target.moe_architecture if cfg.is_moe
                              else target.dense_architecture],
            "model_type": target.moe_model_type if cfg.is_moe else target.dense_model_type,
            "vocab_size": cfg.vocab_size, "hidden_size": cfg.d_model,
            "num_hidden_layers": cfg.num_layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": cfg.head_dim,
            "intermediate_size": cfg.mlp_dim, "hidden_act": "silu",
            "rms_norm_eps": cfg.norm_eps, "rope_theta": cfg.rope_base, "rope_scaling": rope,
            "tie_word_embeddings": cfg.tied_embeddings, "use_qk_norm": cfg.qk_norm,
            "attention_bias": cfg.qkv_bias, "qkv_bias": cfg.qkv_bias,
            "headwise_attn_output_gate": variant.name == "g1_sdpa_headwise",
            "elementwise_attn_output_gate": variant.name == "g1_sdpa_elementwise",
            "use_sliding_window": False, "attention_dropout": 0.0,
            "max_position_embeddings": int(config.data.seq_len), "torch_dtype": dtype,
        }
        if cfg.is_moe:
            experts, top_k = cfg.experts
            out.update(num_experts=experts, num_experts_per_tok=top_k,
                       moe_intermediate_size=cfg.expert_mlp_dim,
                       norm_topk_prob=cfg.moe_renormalize, decoder_sparse_step=1,
                       mlp_only_layers=[])
    original = json.loads(config.get("hf_config") or "null")
    if original is None or detect(original)[0] != target.name:
        return out
    text = detect(original)[1]  # a multimodal import exports its text model
    # An imported run: keep the original file where it still describes this model.
    merged = dict(text) if _same_model(text, out) else {**text, **out}
    if text is not original:
        merged.update(architectures=out["architectures"], model_type=out["model_type"])
    original = text
    for key in ("torch_dtype", "dtype"):  # transformers 4 and 5 name the weights' dtype so
        if key in original or key == "torch_dtype":
            merged[key] = dtype
    return merged


def _same_model(a: dict[str, Any], b: dict[str, Any]) -> bool:
    try:
        return (model_fields(a) == model_fields(b) and variant_name(a) == variant_name(b))
    except ConfigError:
        return False
