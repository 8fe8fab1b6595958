"""Table 3: is it the non-linearity? Parameter-free and additive changes at G1.

    python -m gated_attention.main --config=configs/table3_nonlinearity.py:variant=g1_sdpa_rmsnorm \
        --workdir=gs://my-bucket/runs/table3_nonlinearity_g1_sdpa_rmsnorm

Rows: RMSNorm per head on the attention output, SiLU of it (no parameters), an additive
linear term with no activation, beside the baseline and the sigmoid gate.
Every row trains the 15A2B recipe of configs/moe_15a2b.py; `arch=tiny_moe` runs the same
row on a model a CPU trains (then lower train.batch_size and train.steps).
"""

from gated_attention.config_lib import ConfigError, base_config, parse_config_string

ROWS = (
    "baseline", "g1_sdpa_rmsnorm", "g1_sdpa_silu_paramfree", "g1_sdpa_additive_identity",
    "g1_sdpa_elementwise",
)


def get_config(arg=None):
    options = parse_config_string(arg)
    variant = options.get("variant", ROWS[0])
    if variant not in ROWS:
        raise ConfigError(f"variant={variant!r} is not a row of this table; choose one of "
                          f"{', '.join(ROWS)}")
    config = base_config(options.get("arch", "moe_15a2b"), variant)
    config.model.remat = "dots_with_no_batch_dims_saveable"
    config.train.batch_size = 1024  # sequences of 4096 tokens
    config.train.steps = 100_000
    config.train.eval_every = config.train.checkpoint_every = 1_000
    config.optimizer.peak_lr, config.optimizer.final_lr = 2e-3, 3e-5
    config.optimizer.warmup_steps = 1_000
    config.mesh.data, config.mesh.fsdp = 1, -1
    return config
