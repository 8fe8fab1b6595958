"""The paper's dense 1.7B models (Table 2): 28 layers of width 2048 or 48 of width 1536.

    python -m gated_attention.main \
        --config=configs/dense_1p7b.py:arch=dense_1p7b_48l,variant=g1_sdpa_elementwise \
        --workdir=gs://my-bucket/runs/dense48_g1

arch: dense_1p7b_28l (the default) or dense_1p7b_48l. variant: any name in
gated_attention.model.variants.VARIANTS. Recipe: sequences of 4096 tokens in bfloat16, 1024 of
them a step (4M tokens), AdamW to a peak learning rate of 4e-3, 400B tokens; a gated model's
FFN is narrowed so it has the baseline's parameter count. Weights are sharded over every
chip (FSDP). `python -m gated_attention.inspect` with this config prints the memory per chip.
The recipe is the arch's own default (archs.ARCH_TRAINING); this file adds the narrowed
FFN of gated models, so configs/ablation.py:arch=dense_1p7b_28l is the same run with the
gate's parameters on top.
"""

from gated_attention.config.config_files import family_config

ARCHS = ("dense_1p7b_28l", "dense_1p7b_48l")
# Fields this file sets beyond its arch's defaults.
OWN_FIELDS = ("model.narrow_ffn_to_match_baseline",)


def get_config(arg=None):
    config = family_config(arg, ARCHS)
    config.model.narrow_ffn_to_match_baseline = config.variant != "baseline"
    # The paper's corpus is not public; C4 through seqio is a common stand-in (docs/data.md):
    # config.data.source = "seqio"
    # config.data.tokenizer_path = "gs://my-bucket/spm/c4_151936.model"
    return config
