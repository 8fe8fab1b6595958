"""Smoke test: the tiny baseline and the tiny G1 elementwise gate (any scale stays tiny).
Train it in about a minute on a CPU:

    python -m experiments.run_grid experiments/grids/smoke.py --root runs/smoke \
        --set train.steps=100 --set optimizer.warmup_steps=10
"""

from experiments.grid_lib import Run


def runs(scale="tiny", seeds=(0,)):
    return [Run(arch="tiny", variant=v, seed=s, table="table4_sink_and_activation")
            for v in ("baseline", "g1_sdpa_elementwise") for s in seeds]
