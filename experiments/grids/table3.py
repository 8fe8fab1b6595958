"""Table 3: parameter-free and additive non-linearities at G1, beside the baseline and the
sigmoid gate they are compared with."""

from experiments.grid_lib import table_runs


def runs(scale="tiny", seeds=(0,)):
    return table_runs("table3_nonlinearity", "moe_15a2b", scale, seeds,
                      extra=("baseline", "g1_sdpa_elementwise"))
