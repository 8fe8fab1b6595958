"""The paper's 15A2B mixture-of-experts model (Tables 1, 3, 4 and 6): 15B parameters, 2.5B
active per token; 24 layers, 128 experts of width 768, 8 per token.

    python -m gated_attention.main --config=configs/moe_15a2b.py:variant=g1_sdpa_elementwise \
        --workdir=gs://my-bucket/runs/moe_g1

variant: any name in gated_attention.variants.VARIANTS. Recipe: sequences of 4096 tokens in
bfloat16, 1024 of them a step, warm-up over 1,000 steps to a learning rate of 2e-3, cosine
decay to 3e-5 over 100k steps; a global-batch load-balancing loss and a router z-loss.
Weights are sharded over every chip (FSDP); set mesh.expert to split the experts instead.
"""

from gated_attention.config_lib import base_config, parse_config_string


def get_config(arg=None):
    options = parse_config_string(arg)
    config = base_config(options.get("arch", "moe_15a2b"), options.get("variant", "baseline"))
    config.model.remat = "dots_with_no_batch_dims_saveable"
    config.train.batch_size = 1024
    config.train.steps = 100_000
    config.train.eval_every = 1_000
    config.train.checkpoint_every = 1_000
    config.optimizer.peak_lr = 2e-3
    config.optimizer.warmup_steps = 1_000
    config.optimizer.final_lr = 3e-5
    config.mesh.data, config.mesh.fsdp = 1, -1
    # The paper's corpus is not public; C4 through seqio is a common stand-in (docs/data.md):
    # config.data.source = "seqio"
    # config.data.tokenizer_path = "gs://my-bucket/spm/c4_151936.model"
    return config
