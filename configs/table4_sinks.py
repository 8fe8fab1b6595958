"""Table 4: gate score, massive activations and the attention sink, per gate variant.

    python -m gated_attention.main --config=configs/table4_sinks.py:variant=g1_sdpa_elementwise \
        --workdir=gs://my-bucket/runs/table4_sinks_g1_sdpa_elementwise

Rows: the baseline and G1/G2 gates, a gate that ignores its input, and a non-sparse sigmoid
(scores in [0.5, 1]). `python -m gated_attention.analyze` measures the table's columns.
Every row trains its arch's defaults: the 15A2B recipe of configs/moe_15a2b.py, or with
`arch=tiny_moe` the same row on a model a CPU trains in minutes.
"""

from gated_attention.config.config_files import table_row_config

# Fields this file sets beyond its arch's defaults: none (it picks the row).
OWN_FIELDS: tuple[str, ...] = ()
ROWS = (
    "baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise", "g1_sdpa_head_shared",
    "g2_value_elementwise", "g1_input_independent", "g1_ns_sigmoid",
)


def get_config(arg=None):
    return table_row_config(arg, ROWS, "moe_15a2b")
