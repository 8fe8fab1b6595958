"""Table 1: every row of the 15A2B MoE ablation (baselines, G1-G5, granularity, sharing,
additive and SiLU gates)."""

from experiments.grid_lib import table_runs


def runs(scale="tiny", seeds=(0,)):
    return table_runs("table1_moe", "moe_15a2b", scale, seeds)
