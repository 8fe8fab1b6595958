"""Regenerate the CPU-scale tables in docs/ from their grids: `make tables`.

    python -m experiments.make_tables [--root runs/tables] [--only sinks_cpu] [--no_run]
        [--xla_flags=...] [--cores=1]

Each table in TABLES is a block of a docs page between `<!-- table:NAME begin -->` and
`<!-- table:NAME end -->`. For each, the grid is run (resumable: finished runs are kept; one
run at a time), summarised, and the block rewritten with the table (kind "paired": the paired
table against the baseline; kind "lr_sweep": the summary's learning-rate sweep tables) and a
line naming the command, the commits the runs' record.json name, the hosts and XLA settings
they ran under, and the seeds each row holds. --no_run only summarises roots already there,
and its block says so (the seeds are those found, not those the command would run). A block
whose runs come from several commits, hosts or XLA settings says so in bold.

The grids train under `--xla_flags` on `--cores` cores (defaults: experiments.cpu_pinning's
PINNED and PINNED_CORES), passed to every run as XLA_FLAGS and a CPU affinity and recorded in
its record.json, so that neither a host's core count nor its vector width changes the
numbers (another kind of CPU still can in the last bit: docs/reproducibility.md);
`--xla_flags= --cores=0` trains as the host likes.

    sinks_cpu  docs/sinks.md     the seven Table 4 rows of experiments/grids/sinks_cpu.py, seeds 0-4
    sinks_heads4_cpu, sinks_heads8_cpu  docs/sinks.md  experiments/grids/sinks_heads_cpu.py at 4
                                 and 8 heads per layer: baseline, G1 elementwise and G1
                                 head-shared, seeds 0-4 (only with --only)
    beyond_cpu docs/beyond.md    four sink-task rows of experiments/grids/beyond.py (BEYOND_ROWS),
                                 seeds 0-4 (only with --only)
    lr_cpu     docs/analysis.md  experiments/grids/lr_cpu.py shortened (batch 4, 200 steps),
                                 baseline and G1 elementwise at lr x1, x8, x32, x128, seeds
                                 0-4: 40 runs of one to two minutes on one core
    lr_depth_cpu  docs/analysis.md  experiments/grids/lr_depth_cpu.py: baseline and G1 elementwise
                                 at 24 layers in bfloat16, lr x8, x32, x128, seeds 0-4 (only with
                                 --only)
    text_sink_1k_cpu  docs/sinks.md  experiments/grids/text_sink_cpu.py's first 1,000 of its
                                 3,000 steps: baseline and G1 elementwise on text, seeds 0-4
                                 (only with --only)
    text_sink_cpu  docs/sinks.md  experiments/grids/text_sink_cpu.py at full length (3,000
                                 steps): baseline and G1 elementwise on text, seeds 0-1 (only
                                 with --only; four runs of 70 to 80 minutes)
    text_sink_heads2_cpu  docs/sinks.md  experiments/grids/text_sink_heads2_cpu.py: the text
                                 recipe's first 1,500 steps at two heads per layer, baseline
                                 and G1 elementwise, seeds 0-4 (only with --only)
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from experiments import (
    comparisons,
    cpu_pinning,
    paired_stats,
    rank_stats,
    summarize,
    telemetry_curves,
)
from experiments.grids import text_sink_cpu, text_sink_heads2_cpu
from gated_attention.cli import flags as cli_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
SINK_VARIANTS = ("baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise", "g1_sdpa_head_shared",
                 "g2_value_elementwise", "g1_input_independent", "g1_ns_sigmoid")
LR_VARIANTS = ("baseline", "g1_sdpa_elementwise")
HEAD_VARIANTS = ("baseline", "g1_sdpa_elementwise", "g1_sdpa_head_shared")
# The beyond grid's sink-task rows that carry its three claims at five seeds: a gate reading
# 1/16 of the input removes the sink, XSA removes it, G1 + G2 keeps it.
BEYOND_ROWS = ("baseline", "g1_input_16th", "xsa", "g1_g2")
# The text-sink recipe's runs (experiments/grids/text_sink_cpu.py), cut at step 1,000.
TEXT_SINK_STEPS = 1000
SEEDS5 = (0, 1, 2, 3, 4)
DEPTH_SEEDS = SEEDS5
LR_MULTIPLIERS = (1, 8, 32, 128)
DEPTH_MULTIPLIERS = (8, 32, 128)
# name -> kind ("paired" or "lr_sweep"), docs page, grid file, seeds, run_grid's other
# arguments, the runs (--only) and how the command line names them, and for "paired" the
# metrics of the table; "default": False keeps a table out of a plain `make tables`;
# "curves": True adds each run's first-token weight over training (telemetry_curves).
TABLES: dict[str, dict[str, Any]] = {
    "sinks_cpu": {
        "kind": "paired", "page": "docs/sinks.md", "grid": "experiments/grids/sinks_cpu.py",
        "seeds": "0,1,2,3,4", "args": (),
        "only": tuple(f"sink_tiny-h2-{v}-s{s}" for v in SINK_VARIANTS for s in range(5)),
        "only_text": "its 7 Table 4 rows",
        "metrics": ("f_attn", "sink_rate", "m_act", "eval_loss"),
    },
    "sinks_heads4_cpu": {
        "kind": "paired", "page": "docs/sinks.md", "grid": "experiments/grids/sinks_heads_cpu.py",
        "seeds": "0,1,2,3,4", "args": (), "default": False,
        "only": tuple(f"sink_tiny-h4-{v}-s{s}" for v in HEAD_VARIANTS for s in SEEDS5),
        "only_text": "baseline, G1 elementwise and G1 head-shared at 4 heads per layer",
        "metrics": ("f_attn", "sink_rate", "m_act", "eval_loss"),
    },
    "sinks_heads8_cpu": {
        "kind": "paired", "page": "docs/sinks.md", "grid": "experiments/grids/sinks_heads_cpu.py",
        "seeds": "0,1,2,3,4", "args": (), "default": False,
        "only": tuple(f"sink_tiny-h8-{v}-s{s}" for v in HEAD_VARIANTS for s in SEEDS5),
        "only_text": "baseline, G1 elementwise and G1 head-shared at 8 heads per layer",
        "metrics": ("f_attn", "sink_rate", "m_act", "eval_loss"),
    },
    "beyond_cpu": {
        "kind": "paired", "page": "docs/beyond.md", "grid": "experiments/grids/beyond.py",
        "seeds": "0,1,2,3,4", "args": (), "default": False,
        "only": tuple(f"sink_tiny-h2-{v}-s{s}" for v in BEYOND_ROWS for s in SEEDS5),
        "only_text": "four of its sink-task rows: " + ", ".join(BEYOND_ROWS),
        "metrics": ("f_attn", "sink_rate", "m_act", "eval_loss"),
    },
    "text_sink_1k_cpu": {
        "kind": "paired", "page": "docs/sinks.md", "grid": "experiments/grids/text_sink_cpu.py",
        "seeds": "0,1,2,3,4", "default": False,
        "args": ("--no_analyze", "--set", f"train.steps={TEXT_SINK_STEPS}"),
        "only": tuple(f"tiny-pysrc-bos-{v}-s{s}" for v in text_sink_cpu.VARIANTS
                      for s in SEEDS5),
        "only_text": "baseline and G1 elementwise, seeds 0-4",
        "metrics": ("f_attn", "f_attn_top", "m_act", "eval_loss"),
    },
    "text_sink_cpu": {
        "kind": "paired", "page": "docs/sinks.md", "grid": "experiments/grids/text_sink_cpu.py",
        "seeds": "0,1", "default": False, "args": ("--no_analyze",),
        "only": tuple(f"tiny-pysrc-bos-{v}-s{s}" for v in text_sink_cpu.VARIANTS
                      for s in (0, 1)),
        "only_text": "baseline and G1 elementwise, seeds 0-1",
        "metrics": ("f_attn", "f_attn_top", "m_act", "eval_loss"), "curves": True,
    },
    "text_sink_heads2_cpu": {
        "kind": "paired", "page": "docs/sinks.md",
        "grid": "experiments/grids/text_sink_heads2_cpu.py", "seeds": "0,1,2,3,4",
        "default": False, "args": ("--no_analyze",),
        "only": tuple(f"tiny-pysrc-bos-h2-{v}-s{s}" for v in text_sink_heads2_cpu.VARIANTS
                      for s in SEEDS5),
        "only_text": "baseline and G1 elementwise at two heads per layer, seeds 0-4",
        "metrics": ("f_attn", "f_attn_top", "m_act", "eval_loss"), "curves": True,
    },
    "lr_cpu": {
        "kind": "lr_sweep", "page": "docs/analysis.md", "grid": "experiments/grids/lr_cpu.py",
        "seeds": "0,1,2,3,4",
        "args": ("--lr_multipliers", ",".join(map(str, LR_MULTIPLIERS)), "--no_analyze",
                 "--set", "train.batch_size=4", "--set", "train.steps=200",
                 "--set", "train.eval_every=200", "--set", "train.checkpoint_every=200"),
        "only": tuple(f"tiny-l12-{v}-lrx{m}-s{s}" for v in LR_VARIANTS
                      for m in LR_MULTIPLIERS for s in SEEDS5),
        "only_text": "baseline and G1 elementwise at lr x1, x8, x32, x128, seeds 0-4",
    },
    "lr_depth_cpu": {
        "kind": "lr_sweep", "page": "docs/analysis.md",
        "grid": "experiments/grids/lr_depth_cpu.py", "seeds": "0,1,2,3,4", "default": False,
        "args": ("--lr_multipliers", ",".join(map(str, DEPTH_MULTIPLIERS)), "--no_analyze"),
        "only": tuple(f"tiny-l24-bf16-{v}-lrx{m}-s{s}" for v in LR_VARIANTS
                      for m in DEPTH_MULTIPLIERS for s in DEPTH_SEEDS),
        "only_text": "baseline and G1 elementwise at 24 layers in bfloat16, lr x8, x32, x128, "
                     "seeds 0-4",
    },
}


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def produced_line(result: Mapping[str, Any], command: str, ran: bool = True) -> str:
    """The command, then the commits, seeds, hosts and XLA settings of the finished runs'
    record.json (summarize.provenance_text: in bold where they mix)."""
    head = (f"Produced by `{command}`, then `python -m experiments.summarize`" if ran else
            f"Summarised by `make tables --no_run` from the runs found under the grid's root "
            f"(the command that makes them: `{command}`)")
    return head + ", " + summarize.provenance_text(result["runs"])


def paired_cell(entry: Mapping[str, Any] | None) -> str:
    """A row's difference to the baseline: mean [95% CI], p, Holm's mark; degenerate (every
    seed the same difference) with the exact sign-flip p; one seed with neither."""
    if entry is None:
        return "-"
    if entry["diff"] is None:
        return f"- ({entry['failed']} failed)"
    if entry["degenerate"]:
        text = (f"{entry['diff']:+.3f} (all {entry['n']} seeds equal: no interval), "
                f"p (exact sign-flip) {_p(entry['p'])}")
    elif entry["low"] is None:
        text = f"{entry['diff']:+.3f} (one seed: no interval, no test)"
    else:
        text = (f"{entry['diff']:+.3f} [{_fmt(entry['low'])}, {_fmt(entry['high'])}], "
                f"p {_p(entry['p'])}")
    if entry["failed"]:
        text += f", {entry['failed']} of {entry['n'] + entry['failed']} failed"
    return text + (comparisons.MARK if entry["significant"] else "")


def table_block(name: str, result: Mapping[str, Any], command: str, ran: bool = True) -> str:
    """Markdown of one table, by its kind: "lr_sweep" (lr_sweep_block) or "paired": per row
    the seeds it holds, mean ± se over them and the paired difference to the baseline with
    its 95% t interval, p-value and Holm mark, for each metric; then, for each difference that
    is not significant, the seeds that would resolve it, with their range; then Spearman's rho
    against the paper where the rows have paper values."""
    spec = TABLES[name]
    if spec["kind"] == "lr_sweep":
        return lr_sweep_block(result, command, ran)
    groups = [g for g in result["groups"] if g["seeds"]]
    paired = {(e["group"], e["metric"]): e for e in result["paired"]}
    titles = {m: t for m, t, _ in comparisons.PAIRED_METRICS}
    head = "| variant | seeds | " + " | ".join(
        f"{titles[m]} (mean ± se) | minus baseline [95% CI]" for m in spec["metrics"]) + " |"
    lines = [produced_line(result, command, ran), "", head,
             "|---|---|" + "---|---|" * len(spec["metrics"])]
    for g in groups:
        cells = []
        for m in spec["metrics"]:
            se = g.get(f"{m}_se")
            cells.append(_fmt(g.get(m)) + ("" if se is None else f" ± {_fmt(se)}"))
            cells.append(paired_cell(paired.get((g["group"], m))))
        lines.append(f"| {g['label']} | {summarize.seeds_cell(g)} | " + " | ".join(cells) + " |")
    unresolved = [e for e in result["paired"] if e["metric"] in spec["metrics"]
                  and not e["significant"] and e["p"] is not None and not e["degenerate"]]
    degenerate = [e for e in result["paired"] if e["metric"] in spec["metrics"]
                  and e["degenerate"]]
    check = result.get("sink_check") or {}
    if check.get("checked"):
        level = (f"the uniform {check['uniform']:.3f}" if check.get("uniform") else
                 "the uniform level")
        if check.get("own_uniform"):
            own = sorted(check["own_uniform"].values())
            level += (" or, at a telemetry point, its own batch's ("
                      + (f"{own[0]:.3f}" if f"{own[0]:.3f}" == f"{own[-1]:.3f}" else
                         f"{own[0]:.3f} to {own[-1]:.3f}") + ")")
        lines += ["", f"Baseline sink check: the baseline formed a sink (F-Attn >= "
                  f"{check['factor']:g}x {level}) in "
                  f"{check['formed']} of {check['checked']} seeds"
                  + (f"; not in {', '.join(check['no_sink'])}" if check["no_sink"] else "")
                  + "." + (" " + comparisons.sink_check_top_text(check)
                           if check.get("checked_top") else "")]
    lines += ["", f"{comparisons.MARK.strip()}: significant at 5% after Holm's correction over "
              "the rows of that column (p: paired t-test over seeds, two-sided, before the "
              "correction; 95% CI: Student t with n - 1 degrees of freedom; where every seed "
              "gave the same difference the t-test is undefined and the row's p is the exact "
              "sign-flip p, 2 / 2^n)."]
    if degenerate:
        lines += ["", "Every seed gave the same difference (no spread: a t interval would be "
                  "a point and a t-test p 0): " + "; ".join(
                      f"{e['label']} {titles[e['metric']]} ({e['diff']:+.3f} at each of "
                      f"{e['n']} seeds, exact sign-flip p {_p(e['p'])})" for e in degenerate)
                  + "."]
    if unresolved:
        lines += ["", "Not significant after Holm, and the seeds a paired t-test at 5% would "
                  "need for 80% power if the mean difference and its spread stayed as observed, "
                  "with the range over the spread's 95% interval (chi-square, n - 1 degrees of "
                  "freedom) in brackets: "
                  + "; ".join(f"{e['label']} {titles[e['metric']]} "
                              f"({e['diff']:+.3f}): {_seeds_for(e, result['paired'])}"
                              for e in unresolved) + "."]
    rho = [r for r in result.get("rankings") or []
           if r["metric"] in ("F-Attn",) and r.get("spearman_bootstrap")]
    for r in rho:
        lines += ["", f"{r['metric']} against the paper's Table 4: "
                  + rank_stats.spearman_text(r["spearman_bootstrap"], "rows")]
    return "\n".join(lines)


def lr_sweep_block(result: Mapping[str, Any], command: str, ran: bool = True) -> str:
    """The summary's learning-rate sweep section without its heading: what it measures, then
    per variant the best loss and the largest stable learning rate, then every point."""
    section = comparisons.lr_sweep_markdown(result["lr_sweep"])
    if not section:
        return produced_line(result, command, ran) + "\n\nNo run of the sweep has finished."
    body = section[1:] if section[0].startswith("## ") else section
    while body and not body[0]:
        body = body[1:]
    while body and not body[-1]:
        body = body[:-1]
    return "\n".join([produced_line(result, command, ran), "", *body])


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.01 else f"{value:.2f}"


def holm_seeds_needed(entry: Mapping[str, Any], m: int
                      ) -> tuple[int | None, tuple[int | None, int | None] | None]:
    """Pairs a t-test at 5% / m needs for 80% power at the entry's observed mean and spread,
    and that number's range over the spread's 95% interval: a p below 5% / m passes Holm's
    correction over m rows whatever the other rows give (the Bonferroni level, the strictest
    Holm uses). (None, None) without a spread; None for a count beyond MAX_SEEDS."""
    if not entry.get("se") or not entry.get("n") or entry["n"] < 2:
        return None, None
    sd = entry["se"] * entry["n"] ** 0.5
    alpha = paired_stats.ALPHA / m
    low_sd, high_sd = paired_stats.sd_interval(sd, entry["n"])
    mean = abs(entry["diff"])
    return (paired_stats.seeds_for(mean / sd, alpha),
            (paired_stats.seeds_for(mean / low_sd, alpha),
             paired_stats.seeds_for(mean / high_sd, alpha)))


def _seeds_for(entry: Mapping[str, Any], paired: Sequence[Mapping[str, Any]]) -> str:
    """The seeds to resolve a difference Holm's correction left unmarked, with their range:
    at 5% where the uncorrected p is above 5%, else at the Bonferroni level of its column."""
    if entry["p"] >= paired_stats.ALPHA:
        return paired_stats.range_text(entry["seeds_needed"], entry["seeds_range"])
    m = sum(1 for e in paired if e["metric"] == entry["metric"] and e["p"] is not None)
    return (f"p < 0.05 before the correction; "
            f"{paired_stats.range_text(*holm_seeds_needed(entry, m))} at 5%/{m} "
            "(enough for Holm's whatever the other rows give)")


def replace_block(text: str, name: str, block: str) -> str:
    pattern = re.compile(rf"(<!-- table:{name} begin -->\n).*?(\n<!-- table:{name} end -->)",
                         re.S)
    if not pattern.search(text):
        raise ValueError(f"no <!-- table:{name} begin/end --> block in the page")
    return pattern.sub(lambda m: m.group(1) + block + m.group(2), text)


def grid_command(name: str, grid_root: pathlib.Path) -> tuple[list[str], str]:
    """run_grid's arguments for a table, and the command as its block names it."""
    spec = TABLES[name]
    args = [spec["grid"], "--root", str(grid_root), "--seeds", spec["seeds"], *spec["args"]]
    text = (f"make tables (python -m experiments.run_grid {' '.join(args)} "
            f"--only <{spec['only_text']}>)")
    return [*args, "--only", ",".join(spec["only"])], text


def make(name: str, root: pathlib.Path, run: bool, xla_flags: str = cpu_pinning.PINNED,
         cores: int = cpu_pinning.PINNED_CORES) -> None:
    """Run a table's grid (its trainings under `xla_flags`, on `cores` cores: 0 for all),
    summarise it, rewrite its block; with run=False only the last two, from the runs already
    under the root."""
    spec = TABLES[name]
    grid_root = root / name
    args, command = grid_command(name, grid_root)
    if run:
        with cpu_pinning.on_cores(cores):
            subprocess.run([sys.executable, "-m", "experiments.run_grid", *args,
                            "--parallel", "1"],
                           cwd=REPO, check=False, env={**os.environ, "XLA_FLAGS": xla_flags})
    result = summarize.summarize(grid_root)
    block = table_block(name, result, command, ran=run)
    if spec.get("curves"):
        block += "\n\n" + "\n".join(curves_lines(grid_root, spec["only"]))
    page = REPO / spec["page"]
    page.write_text(replace_block(page.read_text(), name, block))
    print(f"{spec['page']}: table {name} rewritten from {grid_root}")


def curves_lines(grid_root: pathlib.Path, names: Sequence[str]) -> list[str]:
    """The runs' first-token weight over training (telemetry_curves), with its legend."""
    table = telemetry_curves.curves_markdown(grid_root, names)
    if not table:
        return ["No run has logged telemetry yet."]
    return ["F-Attn of the training batch over training, as a multiple of that batch's "
            "uniform level: over the whole model / in its largest layer (L: that layer, "
            "from 0). A sink at 3x or more shows in the first where it spans the model, in "
            "the second where one layer holds it.", "", *table]


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("root", "runs/tables", "Where the grids' runs go.",
                        flag_values=flag_values)
    flags.DEFINE_string("only", "", "Comma-separated table names (default: every table "
                        "but those marked default False).", flag_values=flag_values)
    flags.DEFINE_bool("no_run", False, "Summarise existing roots only.",
                      flag_values=flag_values)
    flags.DEFINE_string("xla_flags", cpu_pinning.PINNED, "XLA_FLAGS the grids' runs train "
                        "under (recorded in each record.json); empty: the host's defaults.",
                        flag_values=flag_values)
    flags.DEFINE_integer("cores", cpu_pinning.PINNED_CORES, "Cores the grids' runs may use "
                         "(recorded); 0: all the host gives.", flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    cli = cli_flags.Command("experiments.make_tables", __doc__)
    args = cli.parse(define_flags(flags.FlagValues()), argv)
    names = ([n for n in args.only.split(",") if n]
             or [n for n, spec in TABLES.items() if spec.get("default", True)])
    unknown = set(names) - set(TABLES)
    if unknown:
        cli.error(f"--only names {sorted(unknown)}; tables: {', '.join(TABLES)}")
    for name in names:
        make(name, pathlib.Path(args.root), run=not args.no_run, xla_flags=args.xla_flags,
             cores=args.cores)
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
