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

import re
import sys

from absl import app, flags, logging
from ml_collections import config_flags


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
                        "one registering the seqio task named by --config.data.seqio_task.",
                        flag_values=flag_values)
    flags.mark_flags_as_required(["config", "workdir"], flag_values=flag_values)
    return flag_values


FLAGS = flags.FLAGS  # the command's flags are defined on it when run as a program (below), so
# importing this module defines no global flag that another command's could collide with


def main(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> None:
    FLAGS = flag_values  # noqa: N806 - the parsed command line (absl's global one by default)
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from gated_attention import checkpoint, config_lib, distributed, interrupts, train, workdir_lock
    from gated_attention import workdir as workdir_lib

    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    config = _load_config(FLAGS)
    overridden = next((a for a in sys.argv if a.startswith("--config.arch")), None)
    if overridden:  # the model fields were filled from the config string's arch
        sys.exit(f"Config error: {overridden} is refused: config.arch names the architecture "
                 "the model fields came from; choose it in the config string "
                 "(--config=configs/ablation.py:arch=NAME) and override config.model.<field> "
                 "for the rest")
    try:
        from gated_attention.data.inputs import import_modules

        import_modules(FLAGS.seqio_module)  # registers the user's seqio tasks
        config_lib.validate_run_config(config)
        from gated_attention import run_checks  # the documents and a tokenizer that fits

        run_checks.check_run(config, None if FLAGS.overwrite else FLAGS.workdir, inputs=False)
    except (config_lib.ConfigError, ImportError) as err:
        sys.exit(f"Config error: {err}")
    distributed.initialize({"auto": None, "yes": True, "no": False}[FLAGS.multihost])
    try:
        summary = train.run(config, FLAGS.workdir, overwrite=FLAGS.overwrite,
                            progress=FLAGS.progress)
    except config_lib.ConfigError as err:
        sys.exit(f"Config error: {err}")
    except (workdir_lib.WorkdirError, workdir_lock.WorkdirBusyError,
            checkpoint.CheckpointError) as err:
        sys.exit(f"Error: {err}")
    except train.NonFiniteError as err:
        sys.exit(f"Diverged: {err}")
    except interrupts.Interrupted as err:
        print(f"Stopped: {err}", file=sys.stderr)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:  # before training began: there is no step to save yet
        print("Stopped by Ctrl-C while preparing the run; no step was trained.",
              file=sys.stderr)
        sys.exit(interrupts.EXIT_CODES["SIGINT"])
    evaluation = summary.get("eval") or {}
    if evaluation:
        print(f"Done: step {summary['steps']}, held-out loss {evaluation['loss']:.4f}, "
              f"perplexity {evaluation['perplexity']:.2f}. Run in {FLAGS.workdir}")


def _load_config(FLAGS: flags.FlagValues):  # noqa: N803
    """FLAGS.config, with a config file that cannot be loaded as one line (absl loads it
    lazily, at the first access)."""
    try:
        config = FLAGS.config
        config.keys()
    except OSError as err:
        sys.exit(_unloadable(FLAGS["config"].serialize().split("=", 1)[-1], err))
    return config


def _unloadable(path: str, err: OSError) -> str:
    reason = str(err).strip().splitlines()[-1].strip()
    return f"Config error: --config={path} cannot be loaded ({reason})"


def _last_exception_line(text: str) -> str:
    """`pkg.module.SomeError: message` -> `message`, from the end of a traceback text."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    for line in reversed(lines):
        match = re.match(r"^[\w.]*(Error|Exception)(:\s*(.*))?$", line)
        if match:
            return match.group(3) or line
    return " ".join(lines[-1:])


def parse_flags(argv: list[str], flag_values: flags.FlagValues = FLAGS) -> list[str]:
    """absl parsing, with config errors (unknown field, bad arch/variant) as one clear line."""
    try:
        return flag_values(argv)
    except OSError as err:  # the config file is missing or unreadable
        path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), "?")
        sys.exit(_unloadable(path, err))
    except flags.Error as err:
        text = str(err)
        if "Traceback (most recent call last)" in text:  # the config file itself raised
            sys.exit(f"Config error: {_last_exception_line(text)}")
        sys.exit(f"Flag error: {text.splitlines()[0]}\nPass --helpfull to see the flags.")
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        message = str(err).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        sys.exit(f"Config error: {message}")


if __name__ == "__main__":
    define_flags(FLAGS)
    app.run(main, flags_parser=parse_flags)
