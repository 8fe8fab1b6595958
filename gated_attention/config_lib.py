"""The ml_collections config schema: architectures, the attention variant, and run settings.

`base_config(arch, variant)` returns a full ConfigDict; `configs/ablation.py` wraps it for the
command line. The variant is copied field by field into `config.attention`, so any axis can be
overridden from a flag (`--config.attention.activation=silu`). `model_config(config)` turns the
ConfigDict into the frozen ModelConfig the layers read, validating every field first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from gated_attention.model_config import ModelConfig
from gated_attention.variants import VARIANTS, AttentionVariant, VariantError, get_variant

# Shapes from SPEC.md / paper_tables.json; `tiny` trains in seconds on a CPU.
ARCHS: dict[str, dict[str, Any]] = {
    "tiny": dict(vocab_size=1024, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                 head_dim=32, mlp_dim=384, tied_embeddings=True, qk_norm=True),
    "small": dict(vocab_size=32_000, num_layers=12, d_model=768, num_heads=12, num_kv_heads=6,
                  head_dim=64, mlp_dim=2560, tied_embeddings=True, qk_norm=True),
    "dense_1p7b_28l": dict(vocab_size=151_936, num_layers=28, d_model=2048, num_heads=16,
                           num_kv_heads=8, head_dim=128, mlp_dim=6144, tied_embeddings=True,
                           qk_norm=True),
    "dense_1p7b_48l": dict(vocab_size=151_936, num_layers=48, d_model=1536, num_heads=16,
                           num_kv_heads=8, head_dim=128, mlp_dim=4608, tied_embeddings=True,
                           qk_norm=True),
    "moe_15a2b": dict(vocab_size=151_936, num_layers=24, d_model=2048, num_heads=32,
                      num_kv_heads=4, head_dim=128, mlp_dim=768, tied_embeddings=False,
                      qk_norm=True, num_experts=128, experts_per_token=8, expert_mlp_dim=768),
    "tiny_moe": dict(vocab_size=1024, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                     head_dim=32, mlp_dim=128, tied_embeddings=False, qk_norm=True,
                     num_experts=8, experts_per_token=2, expert_mlp_dim=128),
    "small_moe": dict(vocab_size=32_000, num_layers=12, d_model=768, num_heads=12,
                      num_kv_heads=6, head_dim=64, mlp_dim=512, tied_embeddings=False,
                      qk_norm=True, num_experts=32, experts_per_token=4, expert_mlp_dim=512),
}
# Sequence length and dtype defaults per arch (the paper trains at 4096 in bf16).
ARCH_RUN_DEFAULTS: dict[str, dict[str, Any]] = {
    "tiny": dict(seq_len=256, dtype="float32"),
    "tiny_moe": dict(seq_len=256, dtype="float32"),
    "small": dict(seq_len=1024, dtype="bfloat16"),
    "small_moe": dict(seq_len=1024, dtype="bfloat16"),
    "dense_1p7b_28l": dict(seq_len=4096, dtype="bfloat16"),
    "dense_1p7b_48l": dict(seq_len=4096, dtype="bfloat16"),
    "moe_15a2b": dict(seq_len=4096, dtype="bfloat16"),
}
_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)} - {"variant", "block_sizes"}
_VARIANT_FIELDS = [f.name for f in dataclasses.fields(AttentionVariant)]


class ConfigError(ValueError):
    """A config field is missing, out of range, or not one of its allowed values."""


def _choice(field: str, value: Any, allowed: Any) -> None:
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of "
                          f"{', '.join(map(str, allowed))}")


def model_section(arch: str) -> ml_collections.ConfigDict:
    _choice("arch", arch, ARCHS)
    fields = dict(
        tied_embeddings=True, qk_norm=True, zero_centred_norm=False, rope_base=10_000.0,
        norm_eps=1e-6, dtype=ARCH_RUN_DEFAULTS[arch]["dtype"], attention_impl="auto", remat="none",
        num_experts=0, experts_per_token=0, expert_mlp_dim=0, moe_renormalize=True,
        moe_capacity_factor=0.0, moe_impl="ragged",
        # Table 2: narrow the FFN of a gated model so its parameter count matches the baseline.
        narrow_ffn_to_match_baseline=False,
    )
    fields.update(ARCHS[arch])
    section = ml_collections.ConfigDict(fields)
    section.block_sizes = ml_collections.ConfigDict({"block_q": 0, "block_kv": 0})
    return section


def attention_section(variant: str) -> ml_collections.ConfigDict:
    try:
        return ml_collections.ConfigDict(get_variant(variant).to_dict())
    except VariantError as err:
        raise ConfigError(str(err)) from None


def base_config(arch: str = "tiny", variant: str = "baseline") -> ml_collections.ConfigDict:
    """Every setting of a run, with defaults that suit `arch`."""
    config = ml_collections.ConfigDict()
    config.arch = arch
    config.variant = variant
    config.seed = 0
    config.model = model_section(arch)
    config.attention = attention_section(variant)
    config.data = ml_collections.ConfigDict(dict(
        source="cpython_docs", tokenizer="sentencepiece",
        seq_len=ARCH_RUN_DEFAULTS[arch]["seq_len"],
        add_bos=False, paths="", seqio_task="", text_key="text", shuffle_seed=0,
    ))
    config.train = ml_collections.ConfigDict(dict(
        steps=1000, batch_size=16, grad_accum=1, eval_every=200, eval_batches=8, log_every=10,
        checkpoint_every=500, keep_checkpoints=3, z_loss=0.0, moe_aux_weight=0.01,
        moe_z_loss_weight=0.001,
    ))
    config.optimizer = ml_collections.ConfigDict(dict(
        peak_lr=3e-3, warmup_steps=100, final_lr=3e-5, b1=0.9, b2=0.95, eps=1e-8,
        weight_decay=0.1, clip_norm=1.0,
    ))
    config.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
    return config


def variant_from_config(config: ml_collections.ConfigDict) -> AttentionVariant:
    fields = {k: config.attention[k] for k in _VARIANT_FIELDS if k in config.attention}
    unknown = set(config.attention.keys()) - set(_VARIANT_FIELDS)
    if unknown:
        raise ConfigError(f"attention.{sorted(unknown)[0]} is not a variant field; allowed: "
                          f"{', '.join(_VARIANT_FIELDS)}")
    try:
        return AttentionVariant(**fields)
    except VariantError as err:
        raise ConfigError(f"attention: {err}") from None


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The frozen ModelConfig for a run config, validated (raises ConfigError, never compiles)."""
    _choice("arch", config.arch, ARCHS)
    variant = variant_from_config(config)
    from gated_attention.ops import IMPLS

    _choice("model.attention_impl", config.model.attention_impl, IMPLS)
    fields = {k: config.model[k] for k in _MODEL_FIELDS if k in config.model}
    block_sizes = tuple((k, int(v)) for k, v in config.model.block_sizes.items() if v)
    try:
        cfg = ModelConfig(variant=variant, block_sizes=block_sizes, **fields)
    except (ValueError, VariantError) as err:
        raise ConfigError(str(err)) from None
    if config.model.get("narrow_ffn_to_match_baseline", False):
        cfg = narrow_ffn_to_match_baseline(cfg)
    return cfg


def narrow_ffn_to_match_baseline(cfg: ModelConfig) -> ModelConfig:
    """Shrink mlp_dim so the gated model has (about) the baseline's parameters, as in Table 2."""
    from gated_attention.inspect import count_params

    baseline = cfg.replace(variant=VARIANTS["baseline"])
    extra = count_params(cfg) - count_params(baseline)
    per_unit = 3 * cfg.d_model * cfg.num_layers  # one FFN column in every layer
    return cfg.replace(mlp_dim=cfg.mlp_dim - round(extra / per_unit))


def parse_config_string(arg: str | None) -> dict[str, str]:
    """`arch=tiny,variant=g1_sdpa_headwise` -> {"arch": "tiny", "variant": ...}."""
    out: dict[str, str] = {}
    for part in filter(None, (arg or "").split(",")):
        if "=" not in part:
            raise ConfigError(f"config string part {part!r} must look like key=value "
                              "(keys: arch, variant)")
        key, value = part.split("=", 1)
        out[key.strip()] = value.strip()
    unknown = set(out) - {"arch", "variant"}
    if unknown:
        raise ConfigError(f"config string key {sorted(unknown)[0]!r} unknown; keys: arch, variant")
    return out
