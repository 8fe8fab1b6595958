"""The one place the training command is built: `python -m gated_attention.main` with a config
spec, a workdir and config overrides, as an argument list.

The demo, the grids (experiments/run_grid.py, and experiments/grid_workloads.py for one
GKE workload per run), the pod scripts (tpu_scripts/launch.sh and gke_launch.sh) and the SLURM
script (gpu_scripts/train.sbatch) all take it from here, so a flag of `gated_attention.main`
is spelled once.
The shell scripts print it with

    python -m gated_attention.cli.train_command --python=.venv/bin/python --config=SPEC \
        --workdir=DIR [--progress=false] [-- FLAG ...]

(they call `main` through `python -c`), which writes the command, shell-quoted, on one line.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from gated_attention.cli import flags as cli_flags

MODULE = "gated_attention.main"
# The same command as a template of run_grid's fields (its `--command` default).
TEMPLATE = "{python} -m " + MODULE + " --config={config} --workdir={workdir} {overrides}"


def override_flag(key: str, value: Any) -> str:
    """`--config.<section.field>=<value>`: the value as `str` writes it (a float as its repr)."""
    return f"--config.{key}={value}"


def override_flags(overrides: Mapping[str, Any]) -> list[str]:
    return [override_flag(key, value) for key, value in overrides.items()]


def train_argv(config: str, workdir: str, overrides: Mapping[str, Any] | None = None, *,
               python: str = sys.executable, progress: bool | None = None,
               overwrite: bool = False, extra: Sequence[str] = ()) -> list[str]:
    """The argument list of one training run: config spec, workdir, overrides, then `extra`
    flags as given (already `--flag=value` strings)."""
    argv = [python, "-m", MODULE, f"--config={config}", f"--workdir={workdir}"]
    if progress is not None:
        argv.append(f"--progress={progress}")
    argv += override_flags(overrides or {})
    if overwrite:
        argv.append("--overwrite")
    return argv + list(extra)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The flags of the printing command, on `flag_values` (importing defines none)."""
    flags.DEFINE_string("python", "python", "The Python that runs the command.",
                        flag_values=flag_values)
    flags.DEFINE_string("config", None, "Config spec, e.g. configs/ablation.py:arch=tiny.",
                        flag_values=flag_values)
    flags.DEFINE_string("workdir", None, "The run's directory.", flag_values=flag_values)
    flags.DEFINE_enum("progress", None, ["true", "false"], "Show a progress bar (default: "
                      "main's).", flag_values=flag_values)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str]) -> int:
    """Print the training command for a shell script (flags after `--` are appended)."""
    args = list(argv)
    extra = args[args.index("--") + 1:] if "--" in args else []
    own = args[:args.index("--")] if "--" in args else args
    parsed = cli_flags.Command("gated_attention.cli.train_command", __doc__).parse(
        define_flags(flags.FlagValues()), own)
    if parsed.progress is not None:  # as the scripts have always written it: lower case
        extra = [f"--progress={parsed.progress}", *extra]
    print(shlex.join(train_argv(parsed.config, parsed.workdir, python=parsed.python,
                                extra=extra)))
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main(sys.argv[1:]))
