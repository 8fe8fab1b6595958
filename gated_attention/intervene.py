"""`python -m gated_attention.intervene`: evaluate a run with its gates changed (the code:
analysis/interventions.py)."""

from __future__ import annotations

from gated_attention.analysis.interventions import changes_from_flags, intervene
from gated_attention.core import errors
from gated_attention.core.errors import UserError


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "A training run (or a `convert from_hf` workdir).")
    flags.DEFINE_list("scales", [], "Gate-logit scales, e.g. 0,0.6,0.8,1.")
    flags.DEFINE_list("force_open", [], "LAYER:HEAD gates forced to 1 (* = all).")
    flags.DEFINE_list("force_closed", [], "LAYER:HEAD gates forced to 0 (* = all).")
    flags.DEFINE_list("ablate", [], "LAYER:HEAD heads removed (* = all).")
    flags.DEFINE_list("clamp_sink", [], "Values every learned sink logit is clamped to.")
    flags.DEFINE_integer("batches", 4, "Held-out batches.")
    flags.DEFINE_integer("batch_size", 8, "Rows per batch.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")


def main(argv: list[str]) -> None:
    from absl import flags, logging

    logging.set_verbosity(logging.WARNING)
    if len(argv) > 1:
        errors.exit_with(f"unexpected arguments: {' '.join(argv[1:])}")
    FLAGS = flags.FLAGS
    try:
        changes = changes_from_flags(FLAGS.scales, FLAGS.force_open, FLAGS.force_closed,
                                     FLAGS.ablate, FLAGS.clamp_sink)
        result = intervene(FLAGS.workdir, changes, batches=FLAGS.batches,
                           batch_size=FLAGS.batch_size, step=FLAGS.step)
    except (UserError, FileNotFoundError) as err:
        errors.fail(err)
    print(f"Written to {result['out']}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    from absl import app, flags

    define_flags()
    flags.mark_flags_as_required(["workdir"])
    app.run(main)
