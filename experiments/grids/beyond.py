"""The axes beyond the paper (docs/beyond.md) on the attention-sink task, at CPU scale.

Gate input width (12 of 64 dimensions, and 1/16), gate rank 8, 2·sigmoid with zero-
initialised weights, a bias started at 2, G1 + G2, exclusive self-attention alone and with
G1, and sliding windows of 32 alone and with G1, beside the baseline and the plain G1 gate,
on `sink_tiny` under the recipe of experiments/grids/sinks_cpu.py (two heads per layer).
Seeds vary slowest, so a stopped grid still has every variant at the first seed:

    python -m experiments.run_grid experiments/grids/beyond.py --root runs/beyond --seeds 0,1
    python -m experiments.summarize runs/beyond

The grid also holds the comparison on text (`text_runs`: arch tiny, 300 steps, the tiny
arch's default text corpus), after the sink runs; take either part by name with `--only`:

    python -m experiments.run_grid experiments/grids/beyond.py --root runs/beyond --seeds 0,1 \
        --only tiny-baseline-steps300-eval_every300-checkpoint_every300-s0,...

The recipes' overrides cover every setting a `--scale` would change, so the scale is ignored.
"""

from experiments.grid_lib import Run
from experiments.grids.sinks_cpu import RECIPE, SinkRun

VARIANTS = ("baseline", "g1_sdpa_elementwise", "g1_two_sigmoid_zero_init", "xsa", "xsa_g1",
            "g1_input_12", "g1_rank_8", "g1_g2", "g1_bias_init_2", "g1_input_16th",
            "swa_32", "swa_32_g1")
TEXT = (("train.steps", 300), ("train.eval_every", 300), ("train.checkpoint_every", 300))


def runs(scale="tiny", seeds=(0,)):
    del scale  # the recipes fix the run length and batch
    sink = [SinkRun(arch="sink_tiny", variant=v, seed=s, overrides=RECIPE)
            for s in seeds for v in VARIANTS]
    return sink + text_runs(seeds)


TEXT_VARIANTS = ("baseline", "g1_sdpa_elementwise", "xsa", "xsa_g1", "swa_32", "swa_32_g1")


def text_runs(seeds=(0,)):
    return [Run(arch="tiny", variant=v, seed=s, overrides=TEXT)
            for s in seeds for v in TEXT_VARIANTS]
