"""A grid's runs, one line each, for launchers that start one job per run: on GKE,
tpu_scripts/gke_launch.sh --grid submits one xpk workload per line and Kueue queues them
(no controller of ours decides what runs when).

    python -m experiments.grid_workloads experiments/grids/table1.py --root gs://b/grids/t1 \
        [--scale tiny] [--seeds 0,1] [--only NAME,...]

prints, per run, its name (its folder under --root) and its training flags, shell-quoted:
`NAME CONFIG_SPEC --config.key=value ...`. The runs, names and overrides are the grid's own
(experiments.grid_lib), as experiments.run_grid trains them, so a grid trained on GKE sits in
the same folders and summarises alike.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence

from absl import flags

from experiments import grid_lib
from gated_attention.cli import flags as cli_flags
from gated_attention.cli import train_command

CONFIG_ARG = "configs/ablation.py"
CLI = cli_flags.Command("experiments.grid_workloads", __doc__, positional=("grid",))


def run_lines(grid: str, root: str, scale: str, seeds: Sequence[int],
              only: Sequence[str] = ()) -> list[str]:
    """`NAME CONFIG_SPEC FLAG...` for every run of the grid file `grid` (those named in
    `only`, if given)."""
    runs = grid_lib.grid_runs(grid, scale, seeds)
    unknown = sorted(set(only) - {run.name for run in runs})
    if unknown:
        raise grid_lib.GridError(f"--only names runs the grid does not hold: "
                                 f"{', '.join(unknown)}; its runs: "
                                 f"{', '.join(run.name for run in runs)}")
    lines = []
    for run in runs:
        if only and run.name not in only:
            continue
        overrides = grid_lib.run_overrides(run, scale)
        flags_ = [flag.replace("{root}", root.rstrip("/"))
                  for flag in train_command.override_flags(overrides)]
        spec = f"{CONFIG_ARG}:arch={run.arch},variant={run.variant}"
        lines.append(shlex.join([run.name, spec, *flags_]))
    return lines


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    grid_lib.define_selection_flags(
        flag_values, "The grid's folder (gs://...); `{root}` in a run's overrides names it.",
        "Comma-separated run names to list.")
    flags.mark_flag_as_required("root", flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    args = CLI.parse(define_flags(flags.FlagValues()), argv)
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        CLI.error(f"--seeds={args.seeds!r} must be comma-separated integers")
    try:
        only = [name for name in args.only.split(",") if name.strip()]
        lines = run_lines(args.grid, args.root, args.scale, seeds, only)
    except grid_lib.GridError as err:
        CLI.error(str(err))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
