"""Table 2: the dense 1.7B models, and what a gate does to the largest stable learning rate.

    python -m gated_attention.main \
        --config=configs/table2_dense.py:arch=dense_1p7b_48l,variant=baseline \
        --config.optimizer.peak_lr=8e-3 --workdir=gs://my-bucket/runs/dense48_base_lr8e-3

Rows: baseline, baseline with sandwich norm, G1 elementwise and G1 headwise, on 28 layers
(dense_1p7b_28l, the default) or 48 (dense_1p7b_48l), at peak learning rates of 4e-3 (set
here) and 8e-3 (--config.optimizer.peak_lr=8e-3), where the baseline spikes or diverges.
Gated models have their FFN narrowed to the baseline's parameter count. The recipe is the
arch's own default (that of configs/dense_1p7b.py); `arch=tiny` runs a row on a model a CPU
trains in minutes.
"""

from gated_attention.config.config_files import table_row_config

# Fields this file sets beyond its arch's defaults.
OWN_FIELDS = ("model.narrow_ffn_to_match_baseline",)
ROWS = ("baseline", "g1_sdpa_elementwise", "baseline_sandwich_norm", "g1_sdpa_headwise")


def get_config(arg=None):
    config = table_row_config(arg, ROWS, "dense_1p7b_28l")
    config.model.narrow_ffn_to_match_baseline = config.variant.startswith("g1_")
    return config
