"""Table 6: Switch-Head baselines (mixtures of value or key-value projections).

    python -m gated_attention.main --config=configs/table6_switch_head.py:variant=switch_kv_8top8 \
        --workdir=gs://my-bucket/runs/table6_switch_head_switch_kv_8top8

Rows: the paper's five Switch-Head settings, beside the baseline, the headwise value gate
that `switch_v_1top1` equals, and the G1 gate.
Every row trains the 15A2B recipe of configs/moe_15a2b.py; `arch=tiny_moe` runs the same
row on a model a CPU trains (then lower train.batch_size and train.steps).
"""

from gated_attention.config_lib import moe_15a2b_recipe, table_row_config

ROWS = (
    "switch_v_1top1", "switch_kv_8top8", "switch_kv_4top4", "switch_v_4top4", "switch_v_8top2",
    "baseline", "g2_value_headwise", "g1_sdpa_elementwise",
)


def get_config(arg=None):
    return moe_15a2b_recipe(table_row_config(arg, ROWS, "moe_15a2b"))
