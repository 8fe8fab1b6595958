"""Can a text baseline form a first-token sink on a CPU? A longer, larger-corpus text recipe.

Every text run elsewhere in the docs (the tiny arch's default corpus, 300 steps) stays at
the uniform attention level: no sink to remove. TEXT_SINK_RECIPE moves each knob the
literature ties to sink formation as far as one CPU core allows in well under an hour: a BOS
token opening every packed segment and so every window (data.add_bos), the installed Python
packages' source as corpus (data.source=python_source: tens of MB on any machine, under the
tiny arch's 1024-piece BPE vocabulary), ten times the steps, a peak learning rate ten times
the tiny default, and first-token statistics logged over training (train.telemetry_every).

    python -m experiments.run_grid experiments/grids/text_sink_cpu.py --root runs/text_sink \
        --seeds 0 --only tiny-pysrc-bos-baseline-s0 --no_analyze
    python -m experiments.summarize runs/text_sink

G1 against it over five seeds is `make tables --only text_sink_1k_cpu`: the first 1,000 of
those 3,000 steps (train.steps=1000 under the recipe's optimizer.schedule_steps=3000, so each
step sees the learning rate the full run gives it), ten runs of about 18 minutes. At full
length, seeds 0 and 1, it is `make tables --only text_sink_cpu`: four runs of 70 to 80 minutes.

The corpus is whatever Python packages the environment has installed, so a run names the
environment as much as the commit: the same command on another set of packages trains on
other text.
"""

import dataclasses

from experiments.grid_lib import Run

TEXT_SINK_RECIPE = (
    ("data.source", "python_source"), ("data.add_bos", True),
    ("train.steps", 3000), ("train.batch_size", 16), ("train.log_every", 50),
    ("train.eval_every", 1000), ("train.eval_batches", 4), ("train.checkpoint_every", 1000),
    ("train.telemetry_every", 250),
    ("optimizer.peak_lr", 3e-2), ("optimizer.final_lr", 3e-4), ("optimizer.warmup_steps", 200),
    ("optimizer.schedule_steps", 3000),
)
VARIANTS = ("baseline", "g1_sdpa_elementwise")


@dataclasses.dataclass(frozen=True)
class TextSinkRun(Run):
    """A run under a text-sink recipe: its directory name gives corpus and BOS, and the tag
    of a recipe that differs from TEXT_SINK_RECIPE (text_sink_heads2_cpu's "h2")."""

    tag: str = ""

    @property
    def name(self) -> str:
        parts = [self.arch, "pysrc-bos", *([self.tag] if self.tag else []), self.variant]
        return "-".join([*parts, f"s{self.seed}"])


def runs(scale: str = "tiny", seeds: tuple[int, ...] = (0,),
         recipe: tuple[tuple[str, object], ...] = TEXT_SINK_RECIPE, tag: str = "") -> list[Run]:
    del scale  # the recipe fixes the run length and batch
    return [TextSinkRun(arch="tiny", variant=v, seed=s, overrides=recipe, tag=tag)
            for s in seeds for v in VARIANTS]
