"""Table 3: is it the non-linearity? Parameter-free and additive changes at G1.

    python -m gated_attention.main --config=configs/table3_nonlinearity.py:variant=g1_sdpa_rmsnorm \
        --workdir=gs://my-bucket/runs/table3_nonlinearity_g1_sdpa_rmsnorm

Rows: RMSNorm per head on the attention output, SiLU of it (no parameters), an additive
linear term with no activation, beside the baseline and the sigmoid gate.
Every row trains the 15A2B recipe of configs/moe_15a2b.py; `arch=tiny_moe` runs the same
row on a model a CPU trains (then lower train.batch_size and train.steps).
"""

from gated_attention.config_lib import moe_15a2b_recipe, table_row_config

ROWS = (
    "baseline", "g1_sdpa_rmsnorm", "g1_sdpa_silu_paramfree", "g1_sdpa_additive_identity",
    "g1_sdpa_elementwise",
)


def get_config(arg=None):
    return moe_15a2b_recipe(table_row_config(arg, ROWS, "moe_15a2b"))
