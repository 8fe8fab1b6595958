"""Command line: train (or resume) one run.

    python -m gated_attention.main \
        --config=configs/ablation.py:arch=tiny,variant=g1_sdpa_elementwise \
        --workdir=runs/x --config.train.steps=200 --config.optimizer.peak_lr=4e-3

Any config field can be overridden with --config.<section>.<field>=value. The resolved
config is saved as <workdir>/config.json; starting again in the same workdir resumes from the
latest checkpoint; a workdir holding a different run is refused unless --overwrite is given
(the old contents are then moved to <workdir>.backup-<timestamp>). The workdir may be in a
bucket (--workdir=gs://bucket/runs/x). On a pod every host runs the same command
(--multihost=auto joins them).
"""

from __future__ import annotations

import sys

from absl import app, flags, logging
from ml_collections import config_flags

config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                "configs/ablation.py:arch=tiny,variant=baseline",
                                lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for config, checkpoints and metrics.")
flags.DEFINE_bool("overwrite", False, "Move an existing different run aside and start anew.")
flags.DEFINE_bool("progress", True, "Show a progress bar.")
flags.DEFINE_enum("multihost", "auto", ["auto", "yes", "no"],
                  "Join the other hosts with jax.distributed.initialize(): auto does on a TPU "
                  "pod, with GATED_ATTENTION_MULTIHOST=1 or with JAX_COORDINATOR_ADDRESS set.")
flags.DEFINE_string("seqio_module", "", "Module(s) to import first (comma-separated), e.g. "
                    "one registering the seqio task named by --config.data.seqio_task.")
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    from gated_attention import config_lib, distributed, train, workdir

    logging.set_verbosity(logging.WARNING)  # orbax logs every file it writes at INFO
    config = FLAGS.config
    try:
        from gated_attention.data.inputs import import_modules

        import_modules(FLAGS.seqio_module)  # registers the user's seqio tasks
        config_lib.validate_run_config(config)
    except (config_lib.ConfigError, ImportError) as err:
        sys.exit(f"Config error: {err}")
    distributed.initialize({"auto": None, "yes": True, "no": False}[FLAGS.multihost])
    try:
        summary = train.run(config, FLAGS.workdir, overwrite=FLAGS.overwrite,
                            progress=FLAGS.progress)
    except (workdir.WorkdirError, config_lib.ConfigError) as err:
        sys.exit(f"Error: {err}")
    evaluation = summary.get("eval") or {}
    if evaluation:
        print(f"Done: step {summary['steps']}, held-out loss {evaluation['loss']:.4f}, "
              f"perplexity {evaluation['perplexity']:.2f}. Run in {FLAGS.workdir}")


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, with config errors (unknown field, bad arch/variant) as one clear line."""
    try:
        return FLAGS(argv)
    except flags.Error as err:
        sys.exit(f"Flag error: {err}\nPass --helpfull to see the flags.")
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        message = str(err).strip("'\"").replace("\\n", " ").replace("\\'", "'")
        sys.exit(f"Config error: {message}")


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
