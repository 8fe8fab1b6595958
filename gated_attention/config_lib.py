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
                      qk_norm=True, num_experts=128, experts_per_token=8, expert_mlp_dim=768,
                      moe_impl="auto"),
    "tiny_moe": dict(vocab_size=1024, num_layers=4, d_model=128, num_heads=4, num_kv_heads=2,
                     head_dim=32, mlp_dim=128, tied_embeddings=False, qk_norm=True,
                     num_experts=8, experts_per_token=2, expert_mlp_dim=128, moe_impl="auto"),
    "small_moe": dict(vocab_size=32_000, num_layers=12, d_model=768, num_heads=12,
                      num_kv_heads=6, head_dim=64, mlp_dim=512, tied_embeddings=False,
                      qk_norm=True, num_experts=32, experts_per_token=4, expert_mlp_dim=512,
                      moe_impl="auto"),
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
# Archs whose decoder blocks are scanned by default (model.scan_layers): deep enough that
# compiling layer by layer takes minutes.
SCANNED_ARCHS = ("dense_1p7b_28l", "dense_1p7b_48l", "moe_15a2b")
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
        # One block scanned over stacked layer parameters (see model.py): compile time flat
        # in depth. Per-layer analysis works either way.
        scan_layers=arch in SCANNED_ARCHS,
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


DATA_SOURCES = ("cpython_docs", "python_source", "files", "seqio")
TOKENIZERS = ("sentencepiece", "byte")
SENTENCEPIECE_MODELS = ("unigram", "bpe")


def data_section(arch: str) -> ml_collections.ConfigDict:
    """What the model reads. See gated_attention/data/__init__.py for each source."""
    return ml_collections.ConfigDict(dict(
        source="cpython_docs",      # one of DATA_SOURCES
        tokenizer="sentencepiece",  # one of TOKENIZERS; "byte" needs model.vocab_size >= 259
        seq_len=ARCH_RUN_DEFAULTS[arch]["seq_len"],
        add_bos=False,              # a BOS token at the start of every packed segment
        add_eos=True,               # an EOS token at the end of every document
        eval_fraction=0.05,         # share of documents held out (local sources)
        paths="",                   # source=files: comma-separated paths or globs (.txt/.jsonl)
        text_key="text",            # source=files: the text field of .jsonl records
        seqio_task="",              # source=seqio: a registered task ("" = the C4 task)
        seqio_eval_split="validation",
        tfds_data_dir="",           # source=seqio: a prepared tfds data_dir
        shuffle_seed=0,
        tokenizer_path="",          # a SentencePiece .model to use instead of training one
        sp_model_type="bpe",        # SentencePiece training (one of SENTENCEPIECE_MODELS);
                                    # bpe trains in ~2 s on the docs corpus, unigram in ~20 s
        sp_input_sentence_size=100_000,  # sentences sampled to train SentencePiece
        cache_dir="",               # "" = $GATED_ATTENTION_CACHE or ~/.cache/gated_attention
    ))


def train_section() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        steps=1000, batch_size=16, grad_accum=1,  # batch_size is global, in sequences
        eval_every=200, eval_batches=8, log_every=10,
        checkpoint_every=500, keep_checkpoints=3, async_checkpoint=True,
        z_loss=0.0, moe_aux_weight=0.01, moe_z_loss_weight=0.001,
        # A step's loss is a spike if it exceeds spike_factor x EMA(spike_ema) of the losses
        # before it, after warm-up (see metrics_writer.SpikeDetector).
        spike_factor=1.5, spike_ema=0.9,
    ))


def optimizer_section() -> ml_collections.ConfigDict:
    """AdamW with linear warm-up to peak_lr, then cosine decay to final_lr (the paper's)."""
    return ml_collections.ConfigDict(dict(
        peak_lr=3e-3, warmup_steps=100, final_lr=3e-5, b1=0.9, b2=0.95, eps=1e-8,
        weight_decay=0.1, clip_norm=1.0,
    ))


def base_config(arch: str = "tiny", variant: str = "baseline") -> ml_collections.ConfigDict:
    """Every setting of a run, with defaults that suit `arch`."""
    config = ml_collections.ConfigDict()
    config.arch = arch
    config.variant = variant
    config.seed = 0
    config.model = model_section(arch)
    config.attention = attention_section(variant)
    config.data = data_section(arch)
    config.train = train_section()
    config.optimizer = optimizer_section()
    # Devices per slice on each mesh axis, slices per axis on a multi-slice pod (dcn_*), and
    # logical-rule overrides "name=axis+axis,..." (see gated_attention/sharding.py).
    config.mesh = ml_collections.ConfigDict(dict(
        data=-1, fsdp=1, tensor=1, expert=1, dcn_data=1, dcn_fsdp=1, dcn_tensor=1,
        dcn_expert=1, rules=""))
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


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def validate_run_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check every data/train/optimizer field (and the model via model_config) before compiling.

    Returns the ModelConfig; raises ConfigError naming the field and its allowed values.
    """
    cfg = model_config(config)
    data, train, opt = config.data, config.train, config.optimizer
    _choice("data.source", data.source, DATA_SOURCES)
    _choice("data.tokenizer", data.tokenizer, TOKENIZERS)
    _choice("data.sp_model_type", data.sp_model_type, SENTENCEPIECE_MODELS)
    _check(data.seq_len >= 2, f"data.seq_len={data.seq_len} must be >= 2")
    _check(0.0 < data.eval_fraction < 1.0,
           f"data.eval_fraction={data.eval_fraction} must be in (0, 1)")
    _check(data.sp_input_sentence_size > 0,
           f"data.sp_input_sentence_size={data.sp_input_sentence_size} must be > 0")
    if data.tokenizer == "byte":
        from gated_attention.data.tokenizer import BYTE_VOCAB_SIZE

        _check(cfg.vocab_size >= BYTE_VOCAB_SIZE,
               f"data.tokenizer='byte' needs model.vocab_size >= {BYTE_VOCAB_SIZE} (256 bytes "
               f"+ pad, bos, eos); got {cfg.vocab_size}")
    elif data.source != "seqio":
        _check(cfg.vocab_size >= 64, f"model.vocab_size={cfg.vocab_size} must be >= 64 for a "
               "SentencePiece tokenizer")
    if data.source == "files":
        _check(bool(data.paths.strip()), "data.source='files' needs data.paths (comma-separated "
               "paths or globs of .txt / .jsonl files)")
    from gated_attention.paths import is_local

    _check(is_local(data.cache_dir), f"data.cache_dir={data.cache_dir!r} must be a local folder "
           "(each host's own cache); the workdir and data.paths may be in a bucket")
    if data.source == "seqio":
        _check(bool(data.tokenizer_path), "data.source='seqio' needs data.tokenizer_path (a "
               "SentencePiece .model file with model.vocab_size pieces)")
        _check(data.tokenizer == "sentencepiece", "data.source='seqio' reads a SentencePiece "
               f"vocabulary; data.tokenizer must be 'sentencepiece', not {data.tokenizer!r}")

    _check(train.steps > 0, f"train.steps={train.steps} must be > 0")
    _check(train.batch_size > 0, f"train.batch_size={train.batch_size} must be > 0")
    _check(train.grad_accum >= 1, f"train.grad_accum={train.grad_accum} must be >= 1")
    _check(train.batch_size % train.grad_accum == 0,
           f"train.batch_size={train.batch_size} must be divisible by "
           f"train.grad_accum={train.grad_accum} (micro-batches of equal size)")
    for name in ("eval_every", "eval_batches", "checkpoint_every"):
        _check(train[name] >= 0, f"train.{name}={train[name]} must be >= 0 (0 disables it)")
    _check(train.log_every > 0, f"train.log_every={train.log_every} must be > 0")
    _check(train.keep_checkpoints >= 1,
           f"train.keep_checkpoints={train.keep_checkpoints} must be >= 1")
    for name in ("z_loss", "moe_aux_weight", "moe_z_loss_weight"):
        _check(train[name] >= 0, f"train.{name}={train[name]} must be >= 0")
    _check(train.spike_factor > 1.0, f"train.spike_factor={train.spike_factor} must be > 1")
    _check(0.0 <= train.spike_ema < 1.0, f"train.spike_ema={train.spike_ema} must be in [0, 1)")

    _check(opt.peak_lr > 0, f"optimizer.peak_lr={opt.peak_lr} must be > 0")
    _check(0 <= opt.final_lr <= opt.peak_lr,
           f"optimizer.final_lr={opt.final_lr} must be in [0, peak_lr={opt.peak_lr}]")
    _check(0 <= opt.warmup_steps <= train.steps,
           f"optimizer.warmup_steps={opt.warmup_steps} must be in [0, train.steps={train.steps}]")
    for name in ("b1", "b2"):
        _check(0.0 <= opt[name] < 1.0, f"optimizer.{name}={opt[name]} must be in [0, 1)")
    _check(opt.eps > 0, f"optimizer.eps={opt.eps} must be > 0")
    _check(opt.weight_decay >= 0, f"optimizer.weight_decay={opt.weight_decay} must be >= 0")
    _check(opt.clip_norm >= 0, f"optimizer.clip_norm={opt.clip_norm} must be >= 0 (0 = off)")
    return cfg
