"""Table 4: gate score, massive activations and the attention sink, per gate variant.

    python -m gated_attention.main --config=configs/table4_sinks.py:variant=g1_sdpa_elementwise \
        --workdir=gs://my-bucket/runs/table4_sinks_g1_sdpa_elementwise

Rows: the baseline and G1/G2 gates, a gate that ignores its input, and a non-sparse sigmoid
(scores in [0.5, 1]). `python -m gated_attention.analyze` measures the table's columns.
Every row trains the 15A2B recipe of configs/moe_15a2b.py; `arch=tiny_moe` runs the same
row on a model a CPU trains (then lower train.batch_size and train.steps).
"""

from gated_attention.config_lib import ConfigError, base_config, parse_config_string

ROWS = (
    "baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise", "g1_sdpa_head_shared",
    "g2_value_elementwise", "g1_input_independent", "g1_ns_sigmoid",
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
