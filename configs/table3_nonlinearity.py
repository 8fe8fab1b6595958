"""Table 3: is it the non-linearity? Parameter-free and additive changes at G1.

    python -m gated_attention.main --config=configs/table3_nonlinearity.py:variant=g1_sdpa_rmsnorm \
        --workdir=gs://my-bucket/runs/table3_nonlinearity_g1_sdpa_rmsnorm

Rows: RMSNorm per head on the attention output, SiLU of it (no parameters), an additive
linear term with no activation, beside the baseline and the sigmoid gate.
Every row trains its arch's defaults: the 15A2B recipe of configs/moe_15a2b.py, or with
`arch=tiny_moe` the same row on a model a CPU trains in minutes.
"""

from gated_attention.config.config_files import table_row_config

# Fields this file sets beyond its arch's defaults: none (it picks the row).
OWN_FIELDS: tuple[str, ...] = ()
ROWS = (
    "baseline", "g1_sdpa_rmsnorm", "g1_sdpa_silu_paramfree", "g1_sdpa_additive_identity",
    "g1_sdpa_elementwise",
)


def get_config(arg=None):
    return table_row_config(arg, ROWS, "moe_15a2b")
