"""Table 5: long context. Train at a short length, raise the RoPE base (10k -> 1M) and continue
training at 4x (8x in the paper) that length from the short run's checkpoint, then evaluate
from 1/8 to 8x the continued length with and without YaRN (docs/long_context.md).

Each variant has two runs: the short one, and the continued one (`train.init_from` names the
short run in the same grid root). Run the grid with the length evaluation as its analysis
command, and without --parallel (a continued run needs its short run's checkpoint; one
started too early fails and is retried by the next invocation):

    python -m experiments.run_grid experiments/grids/table5.py --root runs/table5 \
        --scale tiny --analyze_command "$(python -m experiments.grids.table5 tiny)"
"""

from __future__ import annotations

import dataclasses
import sys

from experiments.grid_lib import Run, scaled_arch

VARIANTS = ("baseline", "g1_sdpa_elementwise")
TABLE = "table5_ruler"
# Per scale: (short length, steps), (continued length, steps, batch), evaluated lengths,
# YaRN factor, examples per retrieval task and length, and model overrides of both runs.
# Paper: pre-training at 4k, continued at 32k with base 1M, YaRN x4 to 128k. `tiny` is what
# ran on a 2-core CPU in ~40 minutes for 2 seeds (docs/long_context.md): the tiny arch cut to
# 2 layers of width 64.
TINY_MODEL = (("model.num_layers", 2), ("model.d_model", 64), ("model.num_heads", 2),
              ("model.num_kv_heads", 1), ("model.mlp_dim", 192))
SETTINGS = {
    "tiny": dict(short=(256, 400), long=(1024, 150, 4),
                 lengths=(128, 256, 512, 1024, 2048, 4096, 8192), yarn_factor=4.0,
                 examples=4, model=TINY_MODEL),
    "small": dict(short=(1024, 5000), long=(4096, 1000, 8),
                  lengths=(512, 1024, 2048, 4096, 8192, 16384, 32768), yarn_factor=4.0,
                  examples=8, model=()),
    "paper": dict(short=(4096, 100_000), long=(32768, 10_000, 128),
                  lengths=(4096, 8192, 16384, 32768, 65536, 131072), yarn_factor=4.0,
                  examples=8, model=()),
}
ROPE_BASE_SHORT, ROPE_BASE_LONG = 10_000.0, 1_000_000.0


def short_run(arch: str, variant: str, seed: int, scale: str,
              settings: dict | None = None) -> Run:
    settings = settings or SETTINGS[scale]
    length, steps = settings["short"]
    return Run(arch=arch, variant=variant, seed=seed, table=TABLE, label=f"{variant} short",
               overrides=(*settings["model"], ("data.seq_len", length),
                          ("model.rope_base", ROPE_BASE_SHORT), ("train.steps", steps)))


@dataclasses.dataclass(frozen=True)
class ContinuedRun(Run):
    """A run named without its train.init_from: the source's name, spelled out in it, made
    names longer than a file name may be; arch, variant, model and seed already identify it."""

    @property
    def name(self) -> str:
        kept = tuple((k, v) for k, v in self.overrides if k != "train.init_from")
        return Run(**{**dataclasses.asdict(self), "overrides": kept}).name


def continued_run(arch: str, variant: str, seed: int, scale: str,
                  settings: dict | None = None) -> Run:
    settings = settings or SETTINGS[scale]
    length, steps, batch = settings["long"]
    source = short_run(arch, variant, seed, scale, settings)
    return ContinuedRun(arch=arch, variant=variant, seed=seed, table=TABLE, label=variant,
               overrides=(*settings["model"], ("data.seq_len", length),
                          ("model.rope_base", ROPE_BASE_LONG),
                          ("train.steps", steps), ("train.batch_size", batch),
                          ("optimizer.warmup_steps", max(1, steps // 10)),
                          ("train.init_from", "{root}/" + source.name)))


def runs(scale="tiny", seeds=(0,)):
    arch = scaled_arch("dense_1p7b_28l", scale)
    out = []
    for variant in VARIANTS:
        for seed in seeds:
            out += [short_run(arch, variant, seed, scale), continued_run(arch, variant, seed,
                                                                         scale)]
    return out


def eval_command(scale: str, settings: dict | None = None) -> str:
    """The run_grid --analyze_command template that evaluates every run at the scale's lengths."""
    settings = settings or SETTINGS[scale]
    lengths = ",".join(str(x) for x in settings["lengths"])
    extra = settings.get("eval_flags", "")
    return ("{python} -m gated_attention.evaluate_length --workdir={workdir} "
            f"--lengths={lengths} --scalings=none,yarn --yarn_factor={settings['yarn_factor']} "
            f"--examples={settings['examples']}" + (f" {extra}" if extra else ""))


if __name__ == "__main__":
    print(eval_command(sys.argv[1] if len(sys.argv) > 1 else "tiny"))
