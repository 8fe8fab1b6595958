"""Table 6: Switch-Head baselines (mixtures of value / key-value projections), beside the
headwise value gate that `switch_v_1top1` equals and the G1 gate."""

from experiments.grid_lib import table_runs


def runs(scale="tiny", seeds=(0,)):
    return table_runs("table6_switch_head", "moe_15a2b", scale, seeds,
                      extra=("baseline", "g2_value_headwise", "g1_sdpa_elementwise"))
