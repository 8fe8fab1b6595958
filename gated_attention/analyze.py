"""`python -m gated_attention.analyze`: analyse a trained run (the code:
analysis/run_analysis.py)."""

from __future__ import annotations

from absl import app, flags, logging

from gated_attention.analysis.run_analysis import DEFAULT_PROMPT, analyze, summary_lines
from gated_attention.core import errors


def define_flags() -> None:
    """Flags only when run as a program: modules that import this one define their own."""
    flags.DEFINE_string("workdir", None, "A training run's directory.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    flags.DEFINE_integer("batches", 8, "Held-out batches to measure on.")
    flags.DEFINE_integer("batch_size", 8, "Rows per held-out batch.")
    flags.DEFINE_string("prompt", DEFAULT_PROMPT, "Prompt for the attention maps.")
    flags.DEFINE_list("layers", None,
                      "Layers whose attention maps to draw (default first, middle, last).")
    flags.DEFINE_float("sink_threshold", 0.3, "Sink rate threshold on mean attention to token 0.")
    flags.DEFINE_bool("include_first_query", False,
                      "Count query 0 (it only sees itself) in F-Attn.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
    FLAGS = flags.FLAGS
    try:
        layers = None if FLAGS.layers is None else [int(x) for x in FLAGS.layers]
    except ValueError:
        errors.exit_with(f"Error: --layers={','.join(FLAGS.layers)} must be comma-separated "
                         "integers")
    try:
        result = analyze(FLAGS.workdir, step=FLAGS.step, batches=FLAGS.batches,
                         batch_size=FLAGS.batch_size, prompt=FLAGS.prompt, layers=layers,
                         sink_threshold=FLAGS.sink_threshold,
                         exclude_first_query=not FLAGS.include_first_query)
    except (errors.UserError, FileNotFoundError) as err:
        errors.fail(err)
    print("\n".join(summary_lines(result)))


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    define_flags()
    flags.mark_flags_as_required(["workdir"])
    app.run(main)
