"""Table 2 and its learning-rate stability sweep (dense 1.7B models).

Every row of Table 2 (its arch and max LR), gated models with the FFN narrowed to the
baseline's parameter count as in the paper, plus a sweep of peak LRs (the paper's 4e-3 and
8e-3, and one more doubling) for the baseline, sandwich-norm baseline and G1 gates, where
the baseline is expected to spike or diverge first.
"""

from experiments.grid_lib import Run, paper_tables, scaled_arch

SETTING_ARCH = {"28L": "dense_1p7b_28l", "48L": "dense_1p7b_48l"}
SWEEP_LRS = (4e-3, 8e-3, 1.6e-2)
SWEEP_VARIANTS = ("baseline", "baseline_sandwich_norm", "g1_sdpa_elementwise",
                  "g1_sdpa_headwise")


def _run(arch, variant, lr, seed, paper=()):
    overrides = [("optimizer.peak_lr", lr)]
    if variant.startswith("g1_"):
        overrides.append(("model.narrow_ffn_to_match_baseline", True))
    return Run(arch=arch, variant=variant, seed=seed, overrides=tuple(overrides),
               table="table2_dense", paper=paper, label=f"{variant} lr={lr:g}")


def runs(scale="tiny", seeds=(0,)):
    out = []
    for row in paper_tables()["table2_dense"]:
        arch = scaled_arch(SETTING_ARCH[row["setting"][:3]], scale)
        paper = (("setting", row["setting"]), ("max_lr", row["max_lr"]))
        out += [_run(arch, row["name"], row["max_lr"], s, paper) for s in seeds]
    arch = scaled_arch("dense_1p7b_48l", scale)
    out += [_run(arch, v, lr, s) for v in SWEEP_VARIANTS for lr in SWEEP_LRS for s in seeds]
    return out
