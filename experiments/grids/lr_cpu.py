"""Learning-rate stability at CPU scale: baseline, sandwich-norm baseline and G1 gates on the
deep, narrow recipe of configs/lr_sweep_cpu.py; sweep it with --lr_multipliers:

    python -m experiments.run_grid experiments/grids/lr_cpu.py --root runs/lr_cpu \
        --seeds 0,1 --lr_multipliers 1,2,4,8,16,32 --no_analyze
    python -m experiments.summarize runs/lr_cpu

The recipe fixes the run length and batch, so the scale is ignored.
"""

import dataclasses

from configs.lr_sweep_cpu import LR_RECIPE
from experiments.grid_lib import Run

VARIANTS = ("baseline", "baseline_sandwich_norm", "g1_sdpa_elementwise", "g1_sdpa_headwise")


@dataclasses.dataclass(frozen=True)
class LrRun(Run):
    """A run under the one shared recipe: its directory name leaves the recipe out."""

    @property
    def name(self) -> str:
        lr = "" if self.lr_multiplier is None else f"-lrx{self.lr_multiplier:g}"
        layers = dict(self.overrides)["model.num_layers"]
        return f"{self.arch}-l{layers}-{self.variant}{lr}-s{self.seed}"


def runs(scale="tiny", seeds=(0,)):
    del scale  # the recipe fixes the run length and batch
    overrides = tuple(sorted(LR_RECIPE.items()))
    return [LrRun(arch="tiny", variant=v, seed=s, overrides=overrides, table="table2_dense")
            for v in VARIANTS for s in seeds]
