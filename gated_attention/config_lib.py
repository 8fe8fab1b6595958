"""The one home of the run config: its schema, its defaults and its validation.

`base_config(arch, variant)` returns a full ml_collections ConfigDict; the files in configs/
wrap it for the command line. The variant is copied field by field into `config.attention`,
so any axis can be overridden from a flag (`--config.attention.activation=silu`). The model
section starts from `ModelConfig`'s field defaults (one default per field), and
`model_config(config)` turns the ConfigDict into that frozen ModelConfig, which the layers
read; `validate_run_config` checks every other field, all before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax.numpy as jnp
import ml_collections

from gated_attention.accounting import count_params
from gated_attention.analysis import stability
from gated_attention.data.streams import PACKINGS
from gated_attention.errors import UserError
from gated_attention.layers.moe_ops import MOE_IMPLS
from gated_attention.layers.rope import NO_SCALING, RopeScaling
from gated_attention.model import REMAT_CHOICES
from gated_attention.ops import IMPLS as ATTENTION_IMPLS
from gated_attention.variants import VARIANTS, AttentionVariant, VariantError, get_variant

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


# Shapes from the paper (docs/method.md); `tiny` trains in seconds on a CPU.
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
    # The synthetic sink task (data.source=bigram_backcopy, docs/sinks.md): 64 chain tokens
    # + BOS; a first-token sink forms in about 1,000 steps on a CPU.
    "sink_tiny": dict(vocab_size=65, num_layers=2, d_model=64, num_heads=1, num_kv_heads=1,
                      head_dim=32, mlp_dim=16, tied_embeddings=False, qk_norm=True),
    # Marked pass keys (data.source=passkey, docs/long_context.md): bytes; whole keys are
    # retrieved at 256 tokens after about 600 steps on a CPU.
    "passkey_tiny": dict(vocab_size=260, num_layers=2, d_model=64, num_heads=4, num_kv_heads=4,
                         head_dim=16, mlp_dim=128, tied_embeddings=True, qk_norm=True),
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
    "sink_tiny": dict(seq_len=64, dtype="float32", source="bigram_backcopy"),
    "passkey_tiny": dict(seq_len=256, dtype="float32", source="passkey", tokenizer="byte"),
}
# How each arch trains unless told otherwise ("section.field": value, applied by
# base_config), so an arch name means one run whichever config file builds it
# (configs/tiny.py, configs/ablation.py, a table's file). Fields not named keep the section
# defaults (train_section, optimizer_section).
_CPU_MINUTES = {  # a run on a CPU in minutes, with a checkpoint and an eval every 100 steps
    "train.steps": 300, "train.batch_size": 16, "train.eval_every": 100,
    "train.checkpoint_every": 100, "optimizer.warmup_steps": 30,
}
PAPER_LOSS_CHUNK = 8192  # vocabulary entries per tile of the paper recipes' chunked loss
_PAPER_SCALE = {  # FSDP over every chip, 1024 sequences a step, warm-up over 1,000 steps
    "model.remat": "dots_with_no_batch_dims_saveable", "train.batch_size": 1024,
    "train.eval_every": 1_000, "train.checkpoint_every": 1_000,
    "optimizer.warmup_steps": 1_000, "mesh.data": 1, "mesh.fsdp": -1,
    "train.loss_chunk_size": PAPER_LOSS_CHUNK,
}
# Table 2: 400B tokens at 4M tokens a step, peak learning rate 4e-3.
_DENSE_1P7B_RECIPE = {**_PAPER_SCALE, "train.steps": 95_000, "optimizer.peak_lr": 4e-3}
# Tables 1, 3, 4, 6: 100k steps, cosine from 2e-3 to 3e-5.
_MOE_15A2B_RECIPE = {**_PAPER_SCALE, "train.steps": 100_000, "optimizer.peak_lr": 2e-3,
                     "optimizer.final_lr": 3e-5}
# The synthetic sink task's recipe (docs/sinks.md): a first-token sink forms under it.
SINK_RECIPE = {
    "data.source": "bigram_backcopy", "data.seq_len": 64,
    "train.steps": 1000, "train.batch_size": 64, "train.eval_every": 500,
    "train.eval_batches": 2, "train.log_every": 50, "train.checkpoint_every": 1000,
    "optimizer.peak_lr": 1e-2, "optimizer.warmup_steps": 100, "optimizer.final_lr": 1e-4,
}
ARCH_TRAINING: dict[str, dict[str, Any]] = {
    "tiny": _CPU_MINUTES, "tiny_moe": _CPU_MINUTES,
    "dense_1p7b_28l": _DENSE_1P7B_RECIPE, "dense_1p7b_48l": _DENSE_1P7B_RECIPE,
    "moe_15a2b": _MOE_15A2B_RECIPE, "sink_tiny": SINK_RECIPE,
}
# Archs whose decoder blocks are scanned by default (model.scan_layers): deep enough that
# compiling layer by layer takes minutes.
SCANNED_ARCHS = ("dense_1p7b_28l", "dense_1p7b_48l", "moe_15a2b")
_MODEL_FIELDS = ({f.name for f in dataclasses.fields(ModelConfig)}
                 - {"variant", "block_sizes", "rope_scaling"})
_VARIANT_FIELDS = [f.name for f in dataclasses.fields(AttentionVariant)]


class ConfigError(UserError):
    """A config field is missing, out of range, or not one of its allowed values."""


def _choice(field: str, value: Any, allowed: Any) -> None:
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of "
                          f"{', '.join(map(str, allowed))}")


def model_section(arch: str) -> ml_collections.ConfigDict:
    _choice("arch", arch, ARCHS)
    # ModelConfig's own defaults (one default per field), then the arch's shapes.
    fields = {f.name: f.default for f in dataclasses.fields(ModelConfig)
              if f.name in _MODEL_FIELDS and f.default is not dataclasses.MISSING}
    fields.update(
        dtype=ARCH_RUN_DEFAULTS[arch]["dtype"],
        # Table 2: narrow the FFN of a gated model so its parameter count matches the baseline.
        narrow_ffn_to_match_baseline=False,
        # Biases on q/k/v and on o_proj (off in the paper; set by Hugging Face imports).
        qkv_bias=False, o_proj_bias=False,
        # One block scanned over stacked layer parameters (see model.py): compile time flat
        # in depth. Per-layer analysis works either way.
        scan_layers=arch in SCANNED_ARCHS,
    )
    fields.update(ARCHS[arch])
    section = ml_collections.ConfigDict(fields)
    section.block_sizes = ml_collections.ConfigDict({"block_q": 0, "block_kv": 0})
    # Context extension (layers/rope.py, docs/long_context.md): type none|linear|ntk|yarn.
    section.rope_scaling = ml_collections.ConfigDict(RopeScaling().to_dict())
    return section


def attention_section(variant: str) -> ml_collections.ConfigDict:
    try:
        return ml_collections.ConfigDict(get_variant(variant).to_dict())
    except VariantError as err:
        raise ConfigError(str(err)) from None


DATA_SOURCES = ("cpython_docs", "python_source", "files", "seqio", "tfds", "array_record",
                "bigram_backcopy", "passkey")
TOKENIZERS = ("sentencepiece", "byte", "hf")
SENTENCEPIECE_MODELS = ("unigram", "bpe")
ON_NONFINITE = ("stop", "skip")


def data_section(arch: str) -> ml_collections.ConfigDict:
    """What the model reads. See gated_attention/data/__init__.py for each source."""
    return ml_collections.ConfigDict(dict(
        source=ARCH_RUN_DEFAULTS[arch].get("source", "cpython_docs"),  # one of DATA_SOURCES
        # one of TOKENIZERS; "byte" needs model.vocab_size >= 259; "hf" reads
        # data.tokenizer_path (a tokenizer.json)
        tokenizer=ARCH_RUN_DEFAULTS[arch].get("tokenizer", "sentencepiece"),
        seq_len=ARCH_RUN_DEFAULTS[arch]["seq_len"],
        add_bos=False,              # a BOS token at the start of every packed segment
        add_eos=True,               # an EOS token at the end of every document
        eval_fraction=0.05,         # share of documents held out (local sources)
        paths="",                   # source=files: comma-separated paths or globs (.txt/.jsonl);
                                    # source=array_record: the folder of prepared shards
        text_key="text",            # source=files: the text field of .jsonl records; tfds: the
                                    # text feature
        seqio_task="",              # source=seqio: a registered task ("" = the C4 task)
        seqio_eval_split="validation",
        tfds_data_dir="",           # source=seqio/tfds: a prepared tfds data_dir (local, gs://)
        tfds_name="",               # source=tfds: e.g. "c4/en:3.1.0" (prepared, never downloaded)
        tfds_train_split="train",   # source=tfds: split names (tfds slicing allowed)
        tfds_eval_split="validation",
        packing="segments",         # one of PACKINGS: "segments" = chunks packed with segment
                                    # ids; "concat" = documents joined with EOS, no segment ids
        max_epochs=4.0,             # refuse runs repeating the training split more often
        shuffle_seed=0,
        tokenizer_path="",          # a SentencePiece .model to use instead of training one,
                                    # or (tokenizer=hf) a Hugging Face tokenizer.json
        sp_model_type="bpe",        # SentencePiece training (one of SENTENCEPIECE_MODELS);
                                    # bpe trains in ~2 s on the docs corpus, unigram in ~20 s
        sp_input_sentence_size=100_000,  # sentences sampled to train SentencePiece
        cache_dir="",               # "" = $GATED_ATTENTION_CACHE or ~/.cache/gated_attention
        # source=bigram_backcopy (data/bigram_backcopy.py): the synthetic sink task's chain
        # over model.vocab_size tokens (BOS = 0); sequences are drawn from shuffle_seed.
        backcopy_triggers=3,        # how many of the most frequent tokens trigger a copy
        backcopy_alpha=0.1,         # Dirichlet concentration of the chain's rows
        backcopy_seed=0,            # seed of the chain itself
        # source=passkey (data/passkey.py): rows packed with marked pass keys ("#<key>." in
        # filler, then " #" and the key), a task on which a tiny model learns retrieval.
        passkey_digits=10,          # digits of each key
        passkey_min_tokens=24,      # shortest example (at least what "#<key>. #<key>" takes)
        passkey_answer_only=True,   # the loss on the answer keys only (else on every token)
    ))


def train_section() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        steps=1000, batch_size=16, grad_accum=1,  # batch_size is global, in sequences
        eval_every=200, eval_batches=8, log_every=10,
        checkpoint_every=500, keep_checkpoints=3, async_checkpoint=True,
        z_loss=0.0, moe_aux_weight=0.01, moe_z_loss_weight=0.001,
        # A step's loss is a spike if it exceeds spike_factor x EMA(spike_ema) of the losses
        # before it, after warm-up (see metrics_writer.SpikeDetector).
        spike_factor=stability.SPIKE_FACTOR, spike_ema=stability.EMA_DECAY,
        # Continued training (init_from.py): a run workdir whose checkpoint's parameters start
        # this run (fresh optimizer and schedule, step 0, this run's length and RoPE), e.g. a
        # shorter run, or one written by `python -m gated_attention.convert from_hf`;
        # init_from_step 0 = its latest checkpoint.
        init_from="", init_from_step=0,
        # A step with a non-finite loss or gradient is never applied; then "stop" ends the
        # run (non-zero exit), "skip" goes on and stops after max_skipped such steps in a row.
        on_nonfinite="stop", max_skipped=10,
        # Initial weights drawn per parameter name (init_by_name.py): variants of one seed
        # start from the same weights wherever names and shapes agree (grids set it).
        init_by_name=False,
        # Sink, gate and activation statistics (telemetry.py) from the step's batch after
        # every telemetry_every updates, into metrics.jsonl (kind "telemetry") and
        # TensorBoard; 0 = off.
        telemetry_every=100,
        # Several hosts: a worker whose step (with its eval and checkpoint) takes longer than
        # step_timeout_s (the first step, with the compile: first_step_timeout_s) prints its
        # stack and exits 75, e.g. when another worker died (gated_attention/watchdog.py).
        step_timeout_s=900.0, first_step_timeout_s=3600.0,
        # The train loss over vocabulary tiles of this many entries (losses.
        # chunked_cross_entropy): float32 logits [batch, seq, vocab] never exist at once;
        # 0 = off (the plain loss over whole logits). On in the paper-scale recipes.
        loss_chunk_size=0,
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
    apply_overrides(config, ARCH_TRAINING.get(arch, {}))
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]
                    ) -> ml_collections.ConfigDict:
    """Set "section.field" values (an arch's training defaults, a recipe) on a config."""
    for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = value
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


def variant_label(config: ml_collections.ConfigDict) -> str:
    """The variant's name as the fields say: the paper variant `config.attention` was copied
    from (attention.name), then "+field=value" for each axis set apart from it."""
    variant = variant_from_config(config)
    base = variant.name.split("+")[0]
    reference = VARIANTS.get(base, AttentionVariant(name=base))
    changed = [f"{k}={getattr(variant, k)}" for k in _VARIANT_FIELDS
               if k != "name" and getattr(variant, k) != getattr(reference, k)]
    return "+".join([base, *changed])


def check_labels(config: ml_collections.ConfigDict) -> None:
    """`config.variant` and `config.arch` name what the fields hold, so they cannot disagree.

    The variant label is derived from config.attention (an axis override renames it, e.g.
    `g1_sdpa_elementwise+activation=silu`); a label set apart from the fields (an override
    of config.variant alone) is refused. config.arch names the defaults the model section
    started from; it is refused when the fields are exactly another architecture's (the
    command line refuses any --config.arch override, see main.py).
    """
    label = variant_label(config)
    if config.variant not in (label.split("+")[0], label):
        raise ConfigError(
            f"config.variant={config.variant!r} disagrees with config.attention, which holds "
            f"{label!r}; the label follows the fields: choose the variant in the config string "
            "(configs/ablation.py:variant=NAME) or override config.attention.<field>")
    if config.variant != label:
        try:
            config.variant = label
        except (AttributeError, TypeError, ValueError):
            pass  # a frozen config: checked above, left as it is
    _choice("arch", config.arch, ARCHS)
    same = [name for name, fields in ARCHS.items()
            if all(config.model.get(k) == v for k, v in fields.items())]
    if same and config.arch not in same:
        raise ConfigError(
            f"config.arch={config.arch!r} disagrees with config.model, which holds the "
            f"{same[0]!r} architecture; choose the arch in the config string "
            "(configs/ablation.py:arch=NAME) and override config.model.<field> for the rest")


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The frozen ModelConfig for a run config, validated (raises ConfigError, never compiles)."""
    _choice("arch", config.arch, ARCHS)
    variant = variant_from_config(config)
    fields = {k: config.model[k] for k in _MODEL_FIELDS if k in config.model}
    block_sizes = tuple((k, int(v)) for k, v in config.model.block_sizes.items() if v)
    try:
        rope_scaling = rope_scaling_from_config(config.model.get("rope_scaling"))
        cfg = ModelConfig(variant=variant, block_sizes=block_sizes, rope_scaling=rope_scaling,
                          **fields)
    except (ValueError, VariantError) as err:
        raise ConfigError(str(err)) from None
    if config.model.get("narrow_ffn_to_match_baseline", False):
        cfg = narrow_ffn_to_match_baseline(cfg)
    return cfg


def rope_scaling_from_config(section: ml_collections.ConfigDict | None) -> RopeScaling:
    """`config.model.rope_scaling` as a validated RopeScaling (absent in older run configs)."""
    if section is None:
        return RopeScaling()
    allowed = [f.name for f in dataclasses.fields(RopeScaling)]
    unknown = set(section.keys()) - set(allowed)
    if unknown:
        raise ConfigError(f"model.rope_scaling.{sorted(unknown)[0]} is not a field; allowed: "
                          f"{', '.join(allowed)}")
    return RopeScaling(**dict(section))


def init_from_steps(source: str) -> list[int]:
    """The checkpoint steps of the run at `source` (train.init_from), oldest first."""
    from gated_attention import paths

    directory = paths.resolve(source) / "checkpoints"
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def check_init_from(config: ml_collections.ConfigDict, cfg: ModelConfig) -> None:
    """train.init_from must be a run workdir with checkpoints (train.init_from_step among them;
    0 = the latest) whose parameters have exactly this model's names and shapes: checked from
    both configs, abstractly, before anything is compiled or written."""
    import json

    from flax import nnx

    from gated_attention import paths
    from gated_attention.model import abstract_model

    source, step = str(config.train.init_from), int(config.train.get("init_from_step", 0))
    saved, steps = paths.resolve(source) / "config.json", init_from_steps(source)
    _check(saved.exists() and bool(steps), f"train.init_from={source!r} is not a run workdir "
           "with checkpoints (e.g. a shorter run of this model, or one written by "
           "`python -m gated_attention.convert from_hf`)")
    _check(step >= 0, f"train.init_from_step={step} must be >= 0 (0 = the latest checkpoint)")
    _check(not step or step in steps, f"train.init_from_step={step} is not among the "
           f"checkpoints of {source}: {steps}")
    theirs = model_config(ml_collections.ConfigDict(json.loads(saved.read_text())))

    def shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        state = nnx.state(abstract_model(model_cfg), nnx.Param)
        return {".".join(map(str, path)): tuple(v.get_value().shape)
                for path, v in nnx.to_flat_state(state)}

    ours, source_shapes = shapes(cfg), shapes(theirs)
    for name in sorted(set(ours) | set(source_shapes)):
        _check(ours.get(name) == source_shapes.get(name),
               f"train.init_from={source!r} has parameter {name} of shape "
               f"{source_shapes.get(name)}, this model needs {ours.get(name)}")


def narrow_ffn_to_match_baseline(cfg: ModelConfig) -> ModelConfig:
    """Shrink mlp_dim so the gated model has (about) the baseline's parameters, as in Table 2."""
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



def family_config(arg: str | None, archs: tuple[str, ...]) -> ml_collections.ConfigDict:
    """The base config of an arch family's file (configs/tiny.py, configs/dense_1p7b.py):
    `arch=` in the config string must be one of `archs` (default: the first); `variant=`
    defaults to the baseline."""
    options = parse_config_string(arg)
    arch = options.get("arch", archs[0])
    if arch not in archs:
        raise ConfigError(f"arch={arch!r} is not allowed here; choose one of {', '.join(archs)}")
    return base_config(arch, options.get("variant", "baseline"))


def table_row_config(arg: str | None, rows: tuple[str, ...],
                     default_arch: str) -> ml_collections.ConfigDict:
    """The base config of one row of a paper table (configs/table*.py): `variant=` in the
    config string must be one of the table's `rows`; `arch=` defaults to the table's."""
    options = parse_config_string(arg)
    variant = options.get("variant", rows[0])
    if variant not in rows:
        raise ConfigError(f"variant={variant!r} is not a row of this table; choose one of "
                          f"{', '.join(rows)}")
    return base_config(options.get("arch", default_arch), variant)


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_epochs(config: ml_collections.ConfigDict, data_summary: dict[str, Any]
                 ) -> float | None:
    """The epoch guard (data.max_epochs), once the training split's size is known from the
    data summary and before compiling; returns the epochs asked (data/epochs.py)."""
    from gated_attention.data import epochs

    try:
        return epochs.check(config, data_summary)
    except epochs.EpochBudgetError as err:
        raise ConfigError(str(err)) from None


def validate_run_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check every data/train/optimizer field (and the model via model_config) before compiling.

    Returns the ModelConfig; raises ConfigError naming the field and its allowed values.
    The variant label is brought in line with the fields first (check_labels).
    """
    check_labels(config)
    cfg = model_config(config)
    data, train, opt = config.data, config.train, config.optimizer
    _choice("data.source", data.source, DATA_SOURCES)
    _choice("data.tokenizer", data.tokenizer, TOKENIZERS)
    _choice("data.sp_model_type", data.sp_model_type, SENTENCEPIECE_MODELS)
    _check(data.seq_len >= 2, f"data.seq_len={data.seq_len} must be >= 2")
    _check(0.0 < data.eval_fraction < 1.0,
           f"data.eval_fraction={data.eval_fraction} must be in (0, 1)")
    _choice("data.packing", data.packing, PACKINGS)
    _check(data.packing != "concat" or data.add_eos, "data.packing='concat' joins documents "
           "with EOS: it needs data.add_eos=True")
    _check(data.max_epochs > 0, f"data.max_epochs={data.max_epochs} must be > 0")
    _check(data.sp_input_sentence_size > 0,
           f"data.sp_input_sentence_size={data.sp_input_sentence_size} must be > 0")
    if data.tokenizer == "byte":
        from gated_attention.data.tokenizer import BYTE_VOCAB_SIZE

        _check(cfg.vocab_size >= BYTE_VOCAB_SIZE,
               f"data.tokenizer='byte' needs model.vocab_size >= {BYTE_VOCAB_SIZE} (256 bytes "
               f"+ pad, bos, eos); got {cfg.vocab_size}")
    elif data.tokenizer == "hf" and not (data.source == "array_record"
                                         and not data.tokenizer_path):  # the shards' own
        _check(bool(data.tokenizer_path), "data.tokenizer='hf' needs data.tokenizer_path (a "
               "tokenizer.json file)")
        from gated_attention.data import hf_tokenizer

        try:  # reads the file once: the vocab check comes before any compile or write
            hf_tokenizer.check_vocab(hf_tokenizer.HFTokenizer(data.tokenizer_path),
                                     cfg.vocab_size)
        except hf_tokenizer.HFTokenizerError as err:
            raise ConfigError(str(err)) from None
    elif data.source not in ("seqio", "bigram_backcopy"):
        _check(cfg.vocab_size >= 64, f"model.vocab_size={cfg.vocab_size} must be >= 64 for a "
               "SentencePiece tokenizer")
    if data.source == "files":
        _check(bool(data.paths.strip()), "data.source='files' needs data.paths (comma-separated "
               "paths or globs of .txt / .jsonl files)")
    from gated_attention.paths import is_local

    _check(is_local(data.cache_dir), f"data.cache_dir={data.cache_dir!r} must be a local folder "
           "(each host's own cache); the workdir and data.paths may be in a bucket")
    if data.source == "passkey":
        _check(data.tokenizer == "byte" or bool(data.tokenizer_path), "data.source='passkey' "
               "generates its text: it needs data.tokenizer='byte' or a data.tokenizer_path "
               "(nothing to train a tokenizer on)")
        _check(1 <= data.passkey_digits <= 18,
               f"data.passkey_digits={data.passkey_digits} must be in 1..18")
        _check(data.passkey_min_tokens >= 1,
               f"data.passkey_min_tokens={data.passkey_min_tokens} must be >= 1")
    if data.source == "bigram_backcopy":
        _check(1 <= data.backcopy_triggers <= cfg.vocab_size - 3,
               f"data.backcopy_triggers={data.backcopy_triggers} must be in 1..model.vocab_size"
               f" - 3 = {cfg.vocab_size - 3} (BOS and two other tokens stay non-triggers)")
        _check(data.backcopy_alpha > 0,
               f"data.backcopy_alpha={data.backcopy_alpha} must be > 0 (Dirichlet concentration)")
    if data.tokenizer_path:
        from gated_attention.paths import resolve

        _check(resolve(data.tokenizer_path).exists(),
               f"data.tokenizer_path={data.tokenizer_path!r} does not exist (a tokenizer file: "
               "SentencePiece .model or tokenizer.json; leave it empty to train one)")
    if data.source == "files":
        import glob

        for part in filter(None, (p.strip() for p in data.paths.split(","))):
            _check(not is_local(part) or bool(glob.glob(os.path.expanduser(part))),
                   f"data.paths: {part!r} matches no file (comma-separated paths or globs of "
                   ".txt / .jsonl files)")
    if data.source == "seqio":
        _check(bool(data.tokenizer_path or data.seqio_task), "data.source='seqio' needs "
               "data.tokenizer_path (a SentencePiece .model file with model.vocab_size pieces) "
               "or data.seqio_task (a registered task, which brings its vocabulary)")
        _check(data.tokenizer == "sentencepiece", "data.source='seqio' reads a SentencePiece "
               f"vocabulary; data.tokenizer must be 'sentencepiece', not {data.tokenizer!r}")
    if data.source in ("tfds", "array_record", "seqio"):
        from gated_attention.data import sources

        try:  # the dataset, shards or task exist, and the shards match the tokenizer
            sources.check(config)
        except ValueError as err:
            raise ConfigError(str(err).strip().splitlines()[0]) from None

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
    if train.get("init_from"):  # the other run's parameters must fit this model
        check_init_from(config, cfg)
    _check(train.spike_factor > 1.0, f"train.spike_factor={train.spike_factor} must be > 1")
    _check(0.0 <= train.spike_ema < 1.0, f"train.spike_ema={train.spike_ema} must be in [0, 1)")
    _choice("train.on_nonfinite", train.get("on_nonfinite", "stop"), ON_NONFINITE)
    _check(train.get("max_skipped", 1) >= 1,
           f"train.max_skipped={train.get('max_skipped')} must be >= 1")
    _check(isinstance(train.get("init_by_name", False), bool),
           f"train.init_by_name={train.get('init_by_name')!r} must be True or False")
    every = train.get("telemetry_every", 0)
    _check(isinstance(every, int) and not isinstance(every, bool) and every >= 0,
           f"train.telemetry_every={every!r} must be an integer >= 0 (0 = off)")
    chunk = train.get("loss_chunk_size", 0)
    _check(isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 0,
           f"train.loss_chunk_size={chunk!r} must be an integer >= 0 (vocabulary entries per "
           "tile of the chunked loss; 0 = the plain loss)")
    for name in ("step_timeout_s", "first_step_timeout_s"):
        _check(train.get(name, 0.0) >= 0,
               f"train.{name}={train.get(name)} must be >= 0 seconds (0 turns the watchdog off)")

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
