"""The attention-sink recipe: `sink_tiny` on the synthetic Bigram-Backcopy task (docs/sinks.md).

    --config=configs/sinks.py:variant=g1_sdpa_elementwise

A first-token sink forms in the baseline within about 1,000 steps on one CPU core; the G1
gate keeps it from forming. arch defaults to sink_tiny (any arch works: its vocab_size sets
the chain's size).
"""

from gated_attention.config.archs import SINK_RECIPE
from gated_attention.config.config_files import parse_config_string
from gated_attention.config.run_config import apply_overrides, base_config

# The settings under which the sink forms (what breaks it: docs/sinks.md); for sink_tiny
# they are the arch's own defaults, so configs/ablation.py:arch=sink_tiny is the same run.
OWN_FIELDS = tuple(SINK_RECIPE)


def get_config(arg: str | None = None):
    options = parse_config_string(arg)
    config = base_config(arch=options.get("arch", "sink_tiny"),
                         variant=options.get("variant", "baseline"))
    return apply_overrides(config, SINK_RECIPE)
