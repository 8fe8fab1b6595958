"""Table 6: Switch-Head baselines (mixtures of value or key-value projections).

    python -m gated_attention.main --config=configs/table6_switch_head.py:variant=switch_kv_8top8 \
        --workdir=gs://my-bucket/runs/table6_switch_head_switch_kv_8top8

Rows: the paper's five Switch-Head settings, beside the baseline, the headwise value gate
that `switch_v_1top1` equals, and the G1 gate.
Every row trains its arch's defaults: the 15A2B recipe of configs/moe_15a2b.py, or with
`arch=tiny_moe` the same row on a model a CPU trains in minutes.
"""

from gated_attention.config.config_files import table_row_config

# Fields this file sets beyond its arch's defaults: none (it picks the row).
OWN_FIELDS: tuple[str, ...] = ()
ROWS = (
    "switch_v_1top1", "switch_kv_8top8", "switch_kv_4top4", "switch_v_4top4", "switch_v_8top2",
    "baseline", "g2_value_headwise", "g1_sdpa_elementwise",
)


def get_config(arg=None):
    return table_row_config(arg, ROWS, "moe_15a2b")
