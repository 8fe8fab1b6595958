"""`python -m gated_attention.evaluate_length`: a trained run at many lengths, with and without
RoPE scaling (the code: analysis/length.py)."""

from __future__ import annotations

from absl import app, flags

from gated_attention.analysis import retrieval_scores as retrieval_tasks
from gated_attention.analysis.length import EVAL_DIR, RESULT_FILE, SCALINGS, evaluate, eviction_eval
from gated_attention.core import errors, paths
from gated_attention.core.errors import UserError


def define_flags() -> None:
    """Flags only when run as a program: modules that import this one define their own."""
    flags.DEFINE_string("workdir", None, "A training run's directory.")
    flags.DEFINE_list("lengths", None, "Total lengths to evaluate at, e.g. 256,512,1024.")
    flags.DEFINE_list("scalings", ["none", "yarn"], f"RoPE scalings to compare: {SCALINGS}.")
    flags.DEFINE_float("yarn_factor", 0.0, "Scaling factor (0 = longest length / training length).")
    flags.DEFINE_list("tasks", list(retrieval_tasks.TASKS), "Retrieval tasks (empty: none).")
    flags.DEFINE_integer("examples", 8, "Examples per task and length.")
    flags.DEFINE_integer("ppl_rows", 4, "Held-out rows per length for perplexity.")
    flags.DEFINE_integer("batch_size", 1, "Rows per forward pass.")
    flags.DEFINE_integer("block", 512, "Query / key block of the chunked attention.")
    flags.DEFINE_integer("seed", 0, "Seed of the retrieval examples.")
    flags.DEFINE_integer("step", None, "Checkpoint step (default: the latest).")
    flags.DEFINE_list("evict_windows", [], "KV-cache eviction: windows W to score (instead "
                      "of --lengths), at the run's training length.")
    flags.DEFINE_list("keep_first", ["0"], "With --evict_windows: first tokens kept (k).")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    FLAGS = flags.FLAGS
    if FLAGS.evict_windows:
        try:
            result = eviction_eval(FLAGS.workdir, [int(x) for x in FLAGS.evict_windows],
                                   [int(x) for x in FLAGS.keep_first], rows=FLAGS.ppl_rows,
                                   batch_size=FLAGS.batch_size, step=FLAGS.step)
        except (UserError, FileNotFoundError) as err:
            errors.fail(err)
        print(f"Written to {result['out']}")
        return
    if not FLAGS.lengths:
        errors.exit_with("Error: give --lengths (or --evict_windows)")
    try:
        lengths = [int(x) for x in FLAGS.lengths]
    except ValueError:
        errors.exit_with(f"Error: --lengths={','.join(FLAGS.lengths)} must be comma-separated "
                         "integers")
    try:
        evaluate(FLAGS.workdir, lengths, scalings=FLAGS.scalings, yarn_factor=FLAGS.yarn_factor,
                 tasks=[t for t in FLAGS.tasks if t], examples=FLAGS.examples,
                 ppl_rows=FLAGS.ppl_rows, batch_size=FLAGS.batch_size, block=FLAGS.block,
                 seed=FLAGS.seed, step=FLAGS.step)
    except (UserError, FileNotFoundError) as err:
        errors.fail(err)
    print(f"Written to {paths.resolve(FLAGS.workdir) / EVAL_DIR / RESULT_FILE}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    define_flags()
    flags.mark_flags_as_required(["workdir"])
    app.run(main)
