"""The run config: its schema, its defaults per arch, and the one call that validates it.

`base_config(arch, variant)` returns a full ml_collections ConfigDict; the files in configs/
wrap it for the command line. The variant is copied field by field into `config.attention`,
so any axis can be overridden from a flag (`--config.attention.activation=silu`). The model
section starts from `ModelConfig`'s field defaults (model_config.py, beside the model), the
data section takes each source's own fields from its module (data/registry.py), and
`model_config(config)` turns the ConfigDict into the frozen ModelConfig the layers read.
`validate_run_config` asks each section's owner to check it, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import ml_collections

from gated_attention.config import optimizer_config, train_config
from gated_attention.config.archs import ARCH_RUN_DEFAULTS, ARCH_TRAINING, ARCHS, SCANNED_ARCHS
from gated_attention.core.checks import ConfigError, choice
from gated_attention.data import registry as data_registry
from gated_attention.model import model_config as model_config_lib
from gated_attention.model.accounting import count_params
from gated_attention.model.layers.rope import RopeScaling
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.variants import VARIANTS, VariantError, get_variant

_MODEL_FIELDS = model_config_lib.MODEL_FIELDS


def model_section(arch: str) -> ml_collections.ConfigDict:
    choice("arch", arch, ARCHS)
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




def data_section(arch: str) -> ml_collections.ConfigDict:
    """What the model reads: the fields every source shares, then each source's own section
    (config.data.seqio, config.data.tfds, ...; data/registry.py)."""
    return data_registry.with_sections(dict(
        source=ARCH_RUN_DEFAULTS[arch].get("source", "cpython_docs"),  # a data/registry.py name
        # one of data/registry.py's TOKENIZERS; "byte" needs model.vocab_size >= 259; "hf" reads
        # data.tokenizer_path (a tokenizer.json)
        tokenizer=ARCH_RUN_DEFAULTS[arch].get("tokenizer", "sentencepiece"),
        seq_len=ARCH_RUN_DEFAULTS[arch]["seq_len"],
        add_bos=False,              # a BOS token at the start of every packed segment
        add_eos=True,               # an EOS token at the end of every document
        eval_fraction=0.05,         # share of documents held out (local sources)
        packing="segments",         # one of PACKINGS: "segments" = chunks packed with segment
                                    # ids; "concat" = documents joined with EOS, no segment ids
        max_epochs=4.0,             # refuse runs repeating the training split more often
        shuffle_seed=0,
        tokenizer_path="",          # a SentencePiece .model to use instead of training one,
                                    # or (tokenizer=hf) a Hugging Face tokenizer.json
        sp_model_type="bpe",        # SentencePiece training (data/registry.py);
                                    # bpe trains in ~2 s on the docs corpus, unigram in ~20 s
        sp_input_sentence_size=100_000,  # sentences sampled to train SentencePiece
        cache_dir="",               # "" = $GATED_ATTENTION_CACHE or ~/.cache/gated_attention
        # Fields several sources read (paths, text_key, tfds_data_dir): data/registry.py.
        **data_registry.SHARED_FIELDS,
    ))


def train_section() -> ml_collections.ConfigDict:
    return ml_collections.ConfigDict(dict(
        steps=1000, batch_size=16, grad_accum=1,  # batch_size is global, in sequences
        eval_every=200, eval_batches=8, log_every=10,
        checkpoint_every=500, keep_checkpoints=3, async_checkpoint=True,
        z_loss=0.0, moe_aux_weight=0.01, moe_z_loss_weight=0.001,
        # A step's loss is a spike if it exceeds spike_factor x EMA(spike_ema) of the losses
        # before it, after warm-up (see metrics_writer.SpikeDetector).
        spike_factor=train_config.SPIKE_FACTOR, spike_ema=train_config.EMA_DECAY,
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
        # TensorBoard; 0 = off. They read telemetry_rows rows of the batch (0 = one
        # micro-batch, batch_size / grad_accum: a forward that fits wherever the step fits).
        telemetry_every=100, telemetry_rows=0,
        # Several hosts: a worker whose step (with its eval and checkpoint) takes longer than
        # step_timeout_s (the first step, with the compile: first_step_timeout_s) prints its
        # stack and exits 75, e.g. when another worker died (gated_attention/training/watchdog.py).
        step_timeout_s=900.0, first_step_timeout_s=3600.0,
        # The train loss a tile at a time, so float32 logits [batch, seq, vocab] never exist
        # at once; 0 = off (the plain loss over whole logits). On in the paper-scale recipes.
        # loss_tiles says which axis is tiled, loss_chunk_size how many entries of it a tile
        # holds: "vocab", vocabulary entries (losses.chunked_cross_entropy: the backward
        # recomputes each tile's logits), or "tokens", sequence positions of every batch row
        # (losses.token_tiled_cross_entropy: the gradient computed in the forward pass, no
        # recomputation). A config saved without loss_tiles tiles the vocabulary.
        loss_chunk_size=0, loss_tiles="vocab",
        # The dtype the logits matmul writes: "float32", or "compute" (model.dtype, bfloat16
        # at scale, as MaxText and Megatron-LM store them: half the loss's HBM traffic).
        # The matmul accumulates in float32 and the softmax, its sums and the gradient run
        # in float32 either way; "compute" rounds each logit once (bfloat16: 8 bits).
        logits_dtype="float32",
        # lm-eval tasks during training (evaluation/hook.py): every harness_every steps and
        # at the end, harness_tasks (comma-separated lm-eval names; local YAML tasks from
        # harness_include_path) on harness_limit examples each (0 = all), into metrics.jsonl
        # (kind "harness"), TensorBoard and record.json; 0 = off.
        **train_config.HARNESS_FIELDS,
    ))


def optimizer_section() -> ml_collections.ConfigDict:
    """AdamW with linear warm-up to peak_lr, then cosine decay to final_lr (the paper's) at
    schedule_steps (0 = train.steps; more trains the first train.steps of a longer run)."""
    return ml_collections.ConfigDict(dict(
        peak_lr=3e-3, warmup_steps=100, final_lr=3e-5, schedule_steps=0, b1=0.9, b2=0.95,
        eps=1e-8, weight_decay=0.1, clip_norm=1.0,
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
    # logical-rule overrides "name=axis+axis,..." (see gated_attention/parallel/sharding.py).
    config.mesh = ml_collections.ConfigDict(dict(
        data=-1, fsdp=1, tensor=1, expert=1, dcn_data=1, dcn_fsdp=1, dcn_tensor=1,
        dcn_expert=1, rules=""))
    apply_overrides(config, ARCH_TRAINING.get(arch, {}))
    return config


def apply_overrides(config: ml_collections.ConfigDict, overrides: dict[str, Any]
                    ) -> ml_collections.ConfigDict:
    """Set "section.field" values (an arch's training defaults, a recipe; nested ones such as
    "data.passkey.digits" too) on a config."""
    for key, value in overrides.items():
        *sections, field = key.split(".")
        target = config
        for section in sections:
            target = target[section]
        target[field] = value
    return config


def saved_config(saved: dict[str, Any]) -> ml_collections.ConfigDict:
    """A run's config.json (parsed) as a ConfigDict, with each data source's section: a run
    saved before sections has the flat names only (data.seqio_task, ...), rebuilt here into
    data.seqio.task and kept as its alias, as base_config makes them."""
    config = ml_collections.ConfigDict(saved)
    if "data" in saved:
        config.data = data_registry.with_sections(saved["data"])
    return config


def variant_label(config: ml_collections.ConfigDict) -> str:
    """The variant's name as `config.attention` says (model_config.variant_label)."""
    return model_config_lib.variant_label(config.attention)


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
    choice("arch", config.arch, ARCHS)
    same = [name for name, fields in ARCHS.items()
            if all(config.model.get(k) == v for k, v in fields.items())]
    if same and config.arch not in same:
        raise ConfigError(
            f"config.arch={config.arch!r} disagrees with config.model, which holds the "
            f"{same[0]!r} architecture; choose the arch in the config string "
            "(configs/ablation.py:arch=NAME) and override config.model.<field> for the rest")


def model_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """The frozen ModelConfig for a run config, validated by model_config (raises ConfigError,
    never compiles); Table 2's narrowed FFN applied when model.narrow_ffn_to_match_baseline."""
    choice("arch", config.arch, ARCHS)
    cfg = model_config_lib.from_sections(config.model, config.attention)
    if config.model.get("narrow_ffn_to_match_baseline", False):
        cfg = narrow_ffn_to_match_baseline(cfg)
    return cfg


def narrow_ffn_to_match_baseline(cfg: ModelConfig) -> ModelConfig:
    """Shrink mlp_dim so the gated model has (about) the baseline's parameters, as in Table 2."""
    baseline = cfg.replace(variant=VARIANTS["baseline"])
    extra = count_params(cfg) - count_params(baseline)
    per_unit = 3 * cfg.d_model * cfg.num_layers  # one FFN column in every layer
    return cfg.replace(mlp_dim=cfg.mlp_dim - round(extra / per_unit))


def validate_run_config(config: ml_collections.ConfigDict) -> ModelConfig:
    """Check every field before compiling, each section by its owner: the labels here, the
    model and attention sections by model_config, data by data/registry.py (and the source's
    module), train by train_config, optimizer by optim. No file is read: what the fields name
    is opened (and checked) by data.registry.check_files and init_from.check_source.

    Returns the ModelConfig; raises ConfigError naming the field and its allowed values.
    The variant label is brought in line with the fields first (check_labels).
    """
    check_labels(config)
    cfg = model_config(config)
    data_registry.check_section(config, cfg)
    train_config.check_section(config.train)
    train_config.check_harness_fields(config.train)
    optimizer_config.check_section(config.optimizer, config.train.steps)
    return cfg
