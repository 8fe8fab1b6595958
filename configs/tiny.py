"""A model that trains on a CPU in minutes: 4 layers of width 128 on the embedded corpus.

    python -m gated_attention.main --config=configs/tiny.py:variant=g1_sdpa_elementwise \
        --workdir=runs/tiny_g1

arch: tiny (dense, the default) or tiny_moe (8 experts, top-2).
variant: any name in gated_attention.model.variants.VARIANTS (the paper's table rows).
Any field can be changed on the command line, e.g. --config.train.steps=600.

The run (300 steps of 16 x 256 tokens, an eval and a checkpoint every 100) is the arch's
own default (archs.ARCH_TRAINING), so configs/ablation.py:arch=tiny is the same run.
"""

from gated_attention.config.config_files import family_config

ARCHS = ("tiny", "tiny_moe")
# Fields this file sets beyond its arch's defaults: none.
OWN_FIELDS: tuple[str, ...] = ()


def get_config(arg=None):
    return family_config(arg, ARCHS)
