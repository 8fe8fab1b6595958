"""Any (architecture, variant) pair of the paper as one config.

    --config=configs/ablation.py:arch=dense_1p7b_28l,variant=g1_sdpa_headwise

arch: tiny, small, dense_1p7b_28l, dense_1p7b_48l, moe_15a2b, tiny_moe, small_moe.
variant: any name in gated_attention.model.variants.VARIANTS (the paper's table row names).
Each arch trains with its own defaults (archs.ARCH_TRAINING), the same whichever file
in configs/ builds it.
"""

from gated_attention.config.config_files import parse_config_string
from gated_attention.config.run_config import base_config

# Fields this file sets beyond its arch's defaults: none.
OWN_FIELDS: tuple[str, ...] = ()


def get_config(arg: str | None = None):
    options = parse_config_string(arg)
    return base_config(arch=options.get("arch", "tiny"), variant=options.get("variant", "baseline"))
