"""Table 1: where to put a gate, and of which kind, in the 15A2B MoE model.

    python -m gated_attention.main --config=configs/table1_moe.py:variant=g1_sdpa_elementwise \
        --workdir=gs://my-bucket/runs/table1_moe_g1_sdpa_elementwise

Rows: the baseline, three ways of spending the gate's parameters on a bigger baseline
(more kv heads, more query heads, more experts), the gate at each position G1-G5, headwise
and head-shared gates, and additive or SiLU gates.
Every row trains its arch's defaults: the 15A2B recipe of configs/moe_15a2b.py, or with
`arch=tiny_moe` the same row on a model a CPU trains in minutes.
"""

from gated_attention.config.config_files import table_row_config

# Fields this file sets beyond its arch's defaults: none (it picks the row).
OWN_FIELDS: tuple[str, ...] = ()
ROWS = (
    "baseline", "g1_sdpa_elementwise", "kv_heads_8", "q_heads_48", "add_4_experts",
    "g2_value_elementwise", "g3_key_elementwise", "g4_query_elementwise", "g5_dense_output",
    "g1_sdpa_headwise", "g2_value_headwise", "g1_sdpa_head_shared", "g2_value_head_shared",
    "g1_sdpa_additive_silu", "g1_sdpa_elementwise_silu",
)


def get_config(arg=None):
    return table_row_config(arg, ROWS, "moe_15a2b")
