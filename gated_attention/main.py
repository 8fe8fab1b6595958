"""Command line: train (or resume) one run.

    python -m gated_attention.main \
        --config=configs/ablation.py:arch=tiny,variant=g1_sdpa_elementwise \
        --workdir=runs/x --config.train.steps=200 --config.optimizer.peak_lr=4e-3

Any config field can be overridden with --config.<section>.<field>=value. The resolved
config is saved as <workdir>/config.json; starting again in the same workdir resumes from the
latest checkpoint (or extends it, if only --config.train.steps grew); a workdir holding a
different run is refused unless --overwrite is given (the old contents are then moved to
<workdir>.backup-<timestamp>), and so is a second launch while the first is alive.
Ctrl-C or SIGTERM saves a checkpoint at the step reached and exits (130 / 143); a diverged
run (non-finite loss) exits 1 naming the step (see docs/fault_tolerance.md). The workdir may be in a
bucket (--workdir=gs://bucket/runs/x). On a pod every host runs the same command
(--multihost=auto joins them).
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

from absl import app, flags, logging
from ml_collections import config_flags

from gated_attention.core import errors


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags on `flag_values` (tests parse many command lines, each on its own)."""
    config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                    "configs/ablation.py:arch=tiny,variant=baseline",
                                    lock_config=True, flag_values=flag_values)
    flags.DEFINE_string("workdir", None, "Directory for config, checkpoints and metrics.",
                        flag_values=flag_values)
    flags.DEFINE_bool("overwrite", False, "Move an existing different run aside and start anew.",
                      flag_values=flag_values)
    flags.DEFINE_bool("progress", True, "Show a progress bar.", flag_values=flag_values)
    flags.DEFINE_enum("multihost", "auto", ["auto", "yes", "no"],
                      "Join the other hosts with jax.distributed.initialize(): auto does on a "
                      "TPU pod, with GATED_ATTENTION_MULTIHOST=1 or with JAX_COORDINATOR_ADDRESS "
                      "set.", flag_values=flag_values)
    flags.DEFINE_string("seqio_module", "", "Module(s) to import first (comma-separated), e.g. "
                        "one registering the seqio task named by --config.data.seqio.task.",
                        flag_values=flag_values)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=flag_values)
    return flag_values


FLAGS = flags.FLAGS  # the command's flags are defined on it when run as a program (below), so
# importing this module defines no global flag that another command's could collide with


def main(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> None:
    FLAGS = flag_values  # noqa: N806 - the parsed command line (absl's global one by default)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from gated_attention.config import run_config
    from gated_attention.parallel import distributed
    from gated_attention.training import checkpoint, interrupts, loop

    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    config = _load_config(FLAGS)
    overridden = next((a for a in sys.argv if a.startswith("--config.arch")), None)
    if overridden:  # the model fields were filled from the config string's arch
        errors.exit_with(
            f"Config error: {overridden} is refused: config.arch names the architecture the "
            "model fields came from; choose it in the config string "
            "(--config=configs/ablation.py:arch=NAME) and override config.model.<field> for "
            "the rest")
    from gated_attention.data.inputs import import_modules

    try:
        import_modules(FLAGS.seqio_module)  # registers the user's seqio tasks
    except ImportError as err:  # the user's --seqio_module is missing
        errors.fail(err, "Config error")
    try:
        run_config.validate_run_config(config)
        from gated_attention.training import run_checks  # the documents and a tokenizer that fits

        run_checks.check_run(config, None if FLAGS.overwrite else FLAGS.workdir, inputs=False)
    except errors.UserError as err:
        _fail(err)
    distributed.initialize({"auto": None, "yes": True, "no": False}[FLAGS.multihost])
    try:
        summary = loop.run(config, FLAGS.workdir, overwrite=FLAGS.overwrite,
                            progress=FLAGS.progress)
    except errors.UserError as err:  # ConfigError, WorkdirError, WorkdirBusyError
        _fail(err)
    except checkpoint.CheckpointError as err:  # a damaged or missing checkpoint of the workdir
        errors.fail(err)
    except loop.NonFiniteError as err:
        sys.exit(f"Diverged: {err}")
    except interrupts.Interrupted as err:
        print(f"Stopped: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # before training began: there is no step to save yet
        print("Stopped by Ctrl-C while preparing the run; no step was trained.",
              file=sys.stderr)
        sys.exit(interrupts.EXIT_CODES["SIGINT"])
    except Exception:  # a bug, or a collective whose peer died: no shutdown barrier to wait at
        distributed.end_failed_process()  # returns only in a single-process run
        raise
    evaluation = summary.get("eval") or {}
    if evaluation:
        print(f"Done: step {summary['steps']}, held-out loss {evaluation['loss']:.4f}, "
              f"perplexity {evaluation['perplexity']:.2f}. Run in {FLAGS.workdir}")


def _fail(err: BaseException) -> NoReturn:
    from gated_attention.config import run_config

    errors.fail(err, "Config error" if isinstance(err, run_config.ConfigError) else "Error")


def _load_config(FLAGS: flags.FlagValues):  # noqa: N803
    """FLAGS.config, with a config file that cannot be loaded as one line (absl loads it
    lazily, at the first access)."""
    try:
        config = FLAGS.config
        config.keys()
    except OSError as err:
        errors.exit_with(_unloadable(FLAGS["config"].serialize().split("=", 1)[-1], err))
    return config


def _unloadable(path: str, err: OSError) -> str:
    reason = str(err).strip().splitlines()[-1].strip()
    return f"Config error: --config={path} cannot be loaded ({reason})"


def _raised_in_ml_collections(err: BaseException) -> bool:
    """Whether `err` was raised inside ml_collections (an unknown or ill-typed
    --config.<field> override), not in this project's code."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and f"{os.sep}ml_collections{os.sep}" in frames[-1].filename


def parse_flags(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> list[str]:
    """absl parsing, with config errors (unknown field, bad arch/variant) as one clear line;
    an exception of the project's own code keeps its traceback."""
    try:
        return flag_values(argv)
    except OSError as err:  # the config file is missing or unreadable
        path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "?")
        errors.exit_with(_unloadable(path, err))
    except flags.Error as err:
        if (user := errors.user_error_in(err)) is not None:  # the config file refused
            errors.fail(user, "Config error")
        if "Traceback (most recent call last)" in str(err):  # the config file's code failed
            raise
        errors.exit_with(f"Flag error: {str(err).splitlines()[0]}\n"
                         "Pass --helpfull to see the flags.")
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        if not _raised_in_ml_collections(err):
            raise
        message = str(err).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        errors.exit_with(f"Config error: {message}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    define_flags(FLAGS)
    app.run(main, flags_parser=parse_flags)
