"""The learning-rate claim where the paper makes it, as deep as a CPU trains: 24 layers in
bfloat16 with a long warm-up.

The paper's Table 2 models that diverge at a high learning rate are 28 and 48 layers deep,
train in bfloat16 and warm up over 1,000 steps. DEPTH_RECIPE is configs/lr_sweep_cpu.py's
narrow `tiny` at 24 layers, computing in bfloat16 (parameters and optimizer state float32),
300 steps of 4 x 128 tokens of which the first half warm up linearly; one run is about 2.5
minutes of one core. Sweep it with --lr_multipliers over the recipe's peak of 3e-2:

    python -m experiments.run_grid experiments/grids/lr_depth_cpu.py --root runs/lr_depth \
        --seeds 0,1,2,3,4 --lr_multipliers 8,32,128 --no_analyze
    python -m experiments.summarize runs/lr_depth
"""

import dataclasses

from configs.lr_sweep_cpu import LR_RECIPE
from experiments.grid_lib import Run

DEPTH_RECIPE = {
    **LR_RECIPE,
    "model.num_layers": 24, "model.dtype": "bfloat16",
    "train.batch_size": 4, "train.steps": 300, "train.eval_every": 300,
    "train.checkpoint_every": 300, "optimizer.warmup_steps": 150,
}
VARIANTS = ("baseline", "g1_sdpa_elementwise")


@dataclasses.dataclass(frozen=True)
class DepthRun(Run):
    """A run under the one shared recipe: its name gives depth and dtype, not the recipe."""

    @property
    def name(self) -> str:
        lr = "" if self.lr_multiplier is None else f"-lrx{self.lr_multiplier:g}"
        layers = dict(self.overrides)["model.num_layers"]
        return f"{self.arch}-l{layers}-bf16-{self.variant}{lr}-s{self.seed}"


def runs(scale="tiny", seeds=(0,)):
    del scale  # the recipe fixes the run length and batch
    overrides = tuple(sorted(DEPTH_RECIPE.items()))
    return [DepthRun(arch="tiny", variant=v, seed=s, overrides=overrides, table="table2_dense")
            for v in VARIANTS for s in seeds]
