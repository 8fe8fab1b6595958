"""The attention-sink recipe: `sink_tiny` on the synthetic Bigram-Backcopy task (docs/sinks.md).

    --config=configs/sinks.py:variant=g1_sdpa_elementwise

A first-token sink forms in the baseline within about 1,000 steps on one CPU core; the G1
gate keeps it from forming. arch defaults to sink_tiny (any arch works: its vocab_size sets
the chain's size).
"""

from gated_attention.config_lib import base_config, parse_config_string

# The settings under which the sink forms (what breaks it: docs/sinks.md).
SINK_RECIPE = {
    "data.source": "bigram_backcopy", "data.seq_len": 64,
    "train.steps": 1000, "train.batch_size": 64, "train.eval_every": 500,
    "train.eval_batches": 2, "train.log_every": 50, "train.checkpoint_every": 1000,
    "optimizer.peak_lr": 1e-2, "optimizer.warmup_steps": 100, "optimizer.final_lr": 1e-4,
}


def get_config(arg: str | None = None):
    options = parse_config_string(arg)
    config = base_config(arch=options.get("arch", "sink_tiny"),
                         variant=options.get("variant", "baseline"))
    for key, value in SINK_RECIPE.items():
        section, field = key.split(".")
        config[section][field] = value
    return config
