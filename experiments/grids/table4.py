"""Table 4: gate score, massive activation and first-token attention per gate variant."""

from experiments.grid_lib import table_runs


def runs(scale="tiny", seeds=(0,)):
    return table_runs("table4_sink_and_activation", "moe_15a2b", scale, seeds)
