"""A model that trains on a CPU in minutes: 4 layers of width 128 on the embedded corpus.

    python -m gated_attention.main --config=configs/tiny.py:variant=g1_sdpa_elementwise \
        --workdir=runs/tiny_g1

arch: tiny (dense, the default) or tiny_moe (8 experts, top-2).
variant: any name in gated_attention.variants.VARIANTS (the paper's table rows).
Any field can be changed on the command line, e.g. --config.train.steps=600.
"""

from gated_attention.config_lib import family_config

ARCHS = ("tiny", "tiny_moe")


def get_config(arg=None):
    config = family_config(arg, ARCHS)
    config.data.seq_len = 128
    config.data.add_bos = True  # a fixed first token, where an attention sink can form
    config.train.steps = 300
    config.train.batch_size = 16
    config.train.eval_every = 100
    config.train.checkpoint_every = 100
    config.optimizer.warmup_steps = 30
    return config
