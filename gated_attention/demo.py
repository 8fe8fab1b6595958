"""`make demo`: the paper's baseline and its G1 elementwise gate, side by side, in minutes.

    python -m gated_attention.demo --workdir=runs/demo [--steps=N] [--overwrite]

Trains `tiny` baseline and `tiny` g1_sdpa_elementwise for the same steps and seed on the
embedded CPython corpus (on a CPU with two or more cores, both at once, one core each),
measures both on held-out text with gated_attention.analysis.stats, then trains `sink_tiny`
baseline and G1 on the synthetic Bigram-Backcopy task, where a first-token attention sink
forms in CPU-minutes (gated_attention.analysis.sink_report), and writes `<workdir>/report.md`
with tables and PNG plots of both. Running it again reuses finished runs.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from absl import app, flags, logging

from gated_attention.cli import train_command

VARIANTS = ("baseline", "g1_sdpa_elementwise")
ANALYSIS_BATCHES, ANALYSIS_BATCH_SIZE = 4, 16  # held-out rows measured: 4 x 16 windows
GENERATE_EXAMPLE = ("python -m gated_attention.generate --workdir={run} --prompt=\"The\" "
                    "--max_new_tokens=40 --temperature=0.7 --top_p=0.9")
FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command's flags, defined when it runs (importing the module defines none)."""
    flags.DEFINE_string("workdir", "runs/demo", "Where the two runs and the report go.")
    flags.DEFINE_integer("steps", 100, "Training steps for each model.")
    flags.DEFINE_integer("batch_size", 16, "Sequences per step.")
    flags.DEFINE_integer("seq_len", 128, "Tokens per sequence.")
    flags.DEFINE_float("peak_lr", 3e-3, "Peak learning rate.")
    flags.DEFINE_bool("parallel", None, "Train both models at once (default: on a CPU with >= 2 "
                      "cores).")
    flags.DEFINE_bool("sinks", True, "Also train the synthetic attention-sink task (sinks/).")
    flags.DEFINE_integer("sink_steps", 1000, "Training steps of each sink_tiny model.")
    flags.DEFINE_integer("sink_batch_size", 32, "Sequences per step of the sink_tiny models.")
    flags.DEFINE_bool("overwrite", False, "Move old runs with other settings aside and retrain.")


def demo_overrides(steps: int, batch_size: int, seq_len: int, peak_lr: float) -> dict[str, Any]:
    """Flags (and config values) shared by both runs."""
    return {
        "train.steps": steps, "train.batch_size": batch_size, "data.seq_len": seq_len,
        "train.eval_every": steps, "train.checkpoint_every": steps, "train.log_every": 10,
        "train.eval_batches": 8, "data.add_bos": True, "optimizer.peak_lr": peak_lr,
        "optimizer.warmup_steps": max(1, steps // 10), "optimizer.final_lr": peak_lr / 10,
    }


def demo_config(variant: str, overrides: dict[str, Any]):
    from gated_attention.config import run_config

    return run_config.apply_overrides(run_config.base_config("tiny", variant), overrides)


def train_both(workdir: pathlib.Path, overrides: dict[str, Any], parallel: bool,
               overwrite: bool) -> None:
    """One `gated_attention.main` process per variant (one core each when in parallel)."""
    run_commands([train_command.train_argv(
        f"configs/ablation.py:arch=tiny,variant={variant}", str(workdir / variant), overrides,
        progress=not parallel, overwrite=overwrite) for variant in VARIANTS], parallel)


def sink_train_commands(workdir: pathlib.Path, overrides: Mapping[str, Any], *, progress: bool,
                        overwrite: bool) -> list[list[str]]:
    """One training command per sink variant (configs/sinks.py at the demo's length)."""
    from gated_attention.analysis import sink_report

    return [train_command.train_argv(f"{sink_report.CONFIG_FILE}:variant={variant}",
                                     str(workdir / variant), overrides, progress=progress,
                                     overwrite=overwrite)
            for variant in sink_report.SINK_VARIANTS]


def run_commands(commands: list[list[str]], parallel: bool) -> None:
    """Run training commands from the repository root, at once (one core each) or in turn."""
    env = dict(os.environ)
    if parallel:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                            "intra_op_parallelism_threads=1").strip()
    root = pathlib.Path(__file__).resolve().parent.parent
    if parallel:  # interleaved lines: each says which run it comes from
        procs = [subprocess.Popen(c, env=env, cwd=root, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, bufsize=1)
                 for c in commands]
        readers = [threading.Thread(target=_relay, args=(stream, out, f"[{run_label(c)}] "))
                   for c, p in zip(commands, procs, strict=True)
                   for stream, out in ((p.stdout, sys.stdout), (p.stderr, sys.stderr))]
        for reader in readers:
            reader.start()
        codes = [p.wait() for p in procs]
        for reader in readers:
            reader.join()
    else:
        codes = [subprocess.call(c, env=env, cwd=root) for c in commands]
    if any(codes):
        raise SystemExit(f"training failed (exit codes {codes}); see the messages above")


def run_label(command: list[str]) -> str:
    """The run a training command writes, as its workdir's last two parts (demo/baseline,
    sinks/g1_sdpa_elementwise)."""
    workdir = next(a.split("=", 1)[1] for a in command if a.startswith("--workdir="))
    return "/".join(pathlib.Path(workdir).parts[-2:])


def _relay(stream: Any, out: Any, prefix: str) -> None:
    """Copy a child's output line by line, each line prefixed with its run."""
    for line in stream:
        out.write(prefix + line)
        out.flush()
    stream.close()


def _train_series(run_dir: pathlib.Path) -> list[tuple[int, float]]:
    from gated_attention.training.metrics_writer import read_jsonl

    return [(r["step"], r["loss"]) for r in read_jsonl(run_dir / "metrics.jsonl")
            if r.get("kind") == "train"]


def analyze(workdir: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Each model's analysis (analysis/run_analysis.py: `<run>/analysis/`, what the notebooks
    read) on the same held-out rows, with training's held-out loss beside it."""
    from gated_attention.analysis import run_analysis as analyze_lib

    results = {}
    for variant in VARIANTS:
        stats = analyze_lib.analyze(workdir / variant, batches=ANALYSIS_BATCHES,
                                    batch_size=ANALYSIS_BATCH_SIZE)
        summary = json.loads((workdir / variant / "summary.json").read_text())
        stats["heldout_loss"] = summary["eval"]["loss"]
        stats["heldout_perplexity"] = summary["eval"]["perplexity"]
        stats["tokens_per_sec"] = summary["train"].get("tokens_per_sec")
        results[variant] = stats
    (workdir / "stats.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def write_report(workdir: pathlib.Path, results: dict[str, dict[str, Any]],
                 overrides: dict[str, Any], seconds: float,
                 extra_lines: list[str] | None = None) -> pathlib.Path:
    from gated_attention.analysis import plots
    from gated_attention.analysis.sink_report import uniform_first_token

    series = {v: _train_series(workdir / v) for v in VARIANTS}
    plots.plot_loss_curves(series, workdir / "loss_curves.png")
    plots.plot_per_layer({v: r["first_token_attention_per_layer"] for v, r in results.items()},
                         workdir / "first_token_attention.png", "attention on token 0",
                         "first-token attention per layer (query 0 excluded)")
    plots.plot_per_layer({v: r["max_activation_per_layer"]["resid_after_ffn"]
                          for v, r in results.items()}, workdir / "max_activation.png",
                         "max |layer output|", "massive activation per layer", log=True)
    base, gated = results[VARIANTS[0]], results[VARIANTS[1]]
    seq_len = overrides["data.seq_len"]
    uniform = uniform_first_token(seq_len)

    def row(name: str, key: str, fmt: str) -> str:
        values = [r.get(key) for r in (base, gated)]
        cells = ["-" if v is None else format(v, fmt) for v in values]
        return f"| {name} | {cells[0]} | {cells[1]} |"

    tokens = overrides["train.steps"] * overrides["train.batch_size"] * seq_len
    m_ratio = base["massive_activation"] / max(gated["massive_activation"], 1e-9)
    sink_formed = base["first_token_attention"] > 2 * uniform
    lines = [
        "# Gated attention demo: baseline vs G1 elementwise gate",
        "",
        f"`tiny` (4 layers, d_model 128) trained {overrides['train.steps']} steps x "
        f"{overrides['train.batch_size']} x {seq_len} tokens ({tokens / 1e6:.2f}M tokens) on "
        "the CPython docs corpus, same seed and data order; each sequence starts with BOS. "
        f"Measured on held-out text (query 0 excluded from F-Attn). Wall time {seconds:.0f} s.",
        "",
        "| metric | baseline | G1 elementwise |",
        "|---|---|---|",
        row("held-out loss", "heldout_loss", ".4f"),
        row("held-out perplexity", "heldout_perplexity", ".2f"),
        row("first-token attention (F-Attn)", "first_token_attention", ".4f"),
        row("massive activation (M-Act, mean over layers of max abs output)",
            "massive_activation", ".2f"),
        row("mean gate score", "gate_score_mean", ".3f"),
        "",
        f"Uniform causal attention would put about {uniform:.4f} on token 0 at this length.",
        "",
        "![loss curves](loss_curves.png)",
        "![first-token attention per layer](first_token_attention.png)",
        "![max activation per layer](max_activation.png)",
        "",
        "## What this run can and cannot show",
        "",
        f"- Massive activations: the gated model's are {m_ratio:.2f}x smaller than the "
        "baseline's. This effect appears within minutes of training (1.7-3.6x at a "
        "few million tokens) and grows with training.",
        f"- Gate scores start at 0.5 (sigmoid of ~0) and fall slowly; here the mean is "
        f"{gated['gate_score_mean']:.3f} (the paper's fully trained value is 0.116).",
        "- Attention sink: " + (
            f"the baseline puts {base['first_token_attention']:.3f} on token 0, above uniform "
            f"({uniform:.3f}); the gate's {gated['first_token_attention']:.3f} is to be read "
            "against it." if sink_formed else
            f"the baseline puts {base['first_token_attention']:.3f} on token 0, not clearly "
            f"above uniform ({uniform:.3f}): no sink has formed yet, so this run cannot show "
            "the gate removing one (the paper's 0.467 -> 0.048 needs far more training)."
            + (" The synthetic task below forms one in minutes." if extra_lines else "")),
        "- Perplexity differences at this budget are within seed noise; compare over seeds "
        "and longer runs.",
        "",
        "A longer run (the docs corpus allows about 3 epochs, data.max_epochs=4; about 15 "
        "minutes on a CPU):",
        "",
        "```",
        "python -m gated_attention.demo --workdir=runs/demo_long --steps=700 --seq_len=256",
        "# or one model at a time on the larger local corpus (any config field overridable):",
        "python -m gated_attention.main --config=configs/ablation.py:arch=tiny,"
        "variant=g1_sdpa_elementwise \\",
        "    --workdir=runs/g1_long --config.data.source=python_source "
        "--config.train.steps=20000 --config.data.add_bos=True",
        "```",
        "",
        *look_further_lines(workdir, overrides["train.steps"]),
        *(extra_lines or []),
    ]
    path = workdir / "report.md"
    path.write_text("\n".join(lines))
    return path


def look_further_lines(workdir: pathlib.Path, steps: int) -> list[str]:
    """Where each model's analysis is, the notebooks that read it, and text from the gated
    model (sampled: greedy decoding of a 100-step model repeats one piece, newlines here)."""
    try:
        shown = pathlib.Path(os.path.relpath(workdir))
    except ValueError:  # another drive
        shown = workdir
    if shown.parts[:1] == ("..",):
        shown = workdir
    return [
        "## Look further",
        "",
        f"Each model's analysis (figures and `analysis.json`, from `gated_attention.analyze`) "
        f"is in its `analysis/` folder: `{shown / VARIANTS[0]}/analysis/`, "
        f"`{shown / VARIANTS[1]}/analysis/`. `notebooks/compare_variants.ipynb` compares the "
        "two (set GRID_ROOT to this folder) and `notebooks/inspect_model.ipynb` draws one "
        "model's heads and gates.",
        "",
        f"Text from the gated model: greedy decoding of a model trained {steps} steps tends "
        "to repeat one piece (at 100 steps, newlines), so sample:",
        "",
        "```",
        GENERATE_EXAMPLE.format(run=shown / VARIANTS[1]),
        "```",
        "",
    ]


def train_and_report_sinks(workdir: pathlib.Path, parallel: bool) -> list[str]:
    """The synthetic sink task: train both models, measure every checkpoint, plot."""
    from gated_attention.analysis import sink_report

    overrides = sink_report.sink_overrides(FLAGS.sink_steps, FLAGS.sink_batch_size)
    folder = workdir / "sinks"
    print(f"Training {' and '.join(sink_report.SINK_VARIANTS)} on the synthetic sink task for "
          f"{FLAGS.sink_steps} steps{' in parallel' if parallel else ''} ...", flush=True)
    run_commands(sink_train_commands(folder, overrides, progress=not parallel,
                                     overwrite=FLAGS.overwrite), parallel)
    print("Measuring the sink at every checkpoint ...", flush=True)
    results = sink_report.analyze(folder)
    return sink_report.report_lines(folder, results, overrides, "sinks") + sink_emergence_lines(
        folder, results, overrides)


def sink_emergence_lines(folder: pathlib.Path, results: dict[str, dict[str, Any]],
                         overrides: dict[str, Any]) -> list[str]:
    """The telemetry's sink-emergence curves of the two sink runs (telemetry_report.py)."""
    from gated_attention.analysis import sink_report, telemetry_report

    seq_len = results[sink_report.SINK_VARIANTS[0]]["seq_len"]
    return telemetry_report.report_lines(folder, sink_report.SINK_VARIANTS, seq_len,
                                         overrides["train.batch_size"] * seq_len, "sinks")


def main(argv: list[str]) -> None:
    del argv
    logging.set_verbosity(logging.WARNING)
    start = time.perf_counter()
    workdir = pathlib.Path(FLAGS.workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    overrides = demo_overrides(FLAGS.steps, FLAGS.batch_size, FLAGS.seq_len, FLAGS.peak_lr)
    import jax

    from gated_attention.data import pipeline

    parallel = FLAGS.parallel
    if parallel is None:
        parallel = jax.default_backend() == "cpu" and (os.cpu_count() or 1) >= 2
    # Collect the corpus and train the tokenizer once, before the two runs share the cache.
    config = demo_config(VARIANTS[0], overrides)
    print("Preparing the CPython docs corpus and its tokenizer ...", flush=True)
    pipeline.load_local_data(config.data, config.model.vocab_size)
    print(f"Training {' and '.join(VARIANTS)} for {FLAGS.steps} steps"
          f"{' in parallel' if parallel else ''} ...", flush=True)
    train_both(workdir, overrides, parallel, FLAGS.overwrite)
    print("Measuring both models on held-out text ...", flush=True)
    results = analyze(workdir)
    sink_lines = train_and_report_sinks(workdir, parallel) if FLAGS.sinks else []
    report = write_report(workdir, results, overrides, time.perf_counter() - start, sink_lines)
    print(f"Report: {report}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    define_flags()
    app.run(main)
