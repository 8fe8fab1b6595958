"""The paper's 15A2B mixture-of-experts model (Tables 1, 3, 4 and 6): 15B parameters, 2.5B
active per token; 24 layers, 128 experts of width 768, 8 per token.

    python -m gated_attention.main --config=configs/moe_15a2b.py:variant=g1_sdpa_elementwise \
        --workdir=gs://my-bucket/runs/moe_g1

variant: any name in gated_attention.model.variants.VARIANTS. Recipe: sequences of 4096 tokens in
bfloat16, 1024 of them a step, warm-up over 1,000 steps to a learning rate of 2e-3, cosine
decay to 3e-5 over 100k steps; a global-batch load-balancing loss and a router z-loss.
Weights are sharded over every chip (FSDP); set mesh.expert to split the experts instead.
The recipe is the arch's own default (archs.ARCH_TRAINING), so
configs/ablation.py:arch=moe_15a2b is the same run; `arch=tiny_moe` gives the CPU-sized one.
"""

from gated_attention.config.config_files import parse_config_string
from gated_attention.config.run_config import base_config

# Fields this file sets beyond its arch's defaults: none.
OWN_FIELDS: tuple[str, ...] = ()


def get_config(arg=None):
    options = parse_config_string(arg)
    config = base_config(options.get("arch", "moe_15a2b"), options.get("variant", "baseline"))
    # The paper's corpus is not public; C4 through seqio is a common stand-in (docs/data.md):
    # config.data.source = "seqio"
    # config.data.tokenizer_path = "gs://my-bucket/spm/c4_151936.model"
    return config
