"""Regenerate the CPU-scale tables in docs/ from their grids: `make tables`.

    python -m experiments.make_tables [--root runs/tables] [--only sinks_cpu] [--no_run]

Each table in TABLES is a block of a docs page between `<!-- table:NAME begin -->` and
`<!-- table:NAME end -->`. For each, the grid is run (resumable: finished runs are kept; one
run at a time), summarised, and the block rewritten with the table (kind "paired": the paired
table against the baseline; kind "lr_sweep": the summary's learning-rate sweep tables) and a
line naming the command, the commits the runs' record.json name and the seeds. --no_run only
summarises roots already there. The block names the seeds and commits, so a rerun can be
compared with it; this script does not itself check that a rerun reproduces the numbers.

    sinks_cpu  docs/sinks.md     the seven Table 4 rows of experiments/grids/sinks_cpu.py, seeds 0-2
    lr_cpu     docs/analysis.md  experiments/grids/lr_cpu.py shortened (batch 4, 200 steps),
                                 baseline and G1 elementwise at lr x1, x8 (seed 0), x32, x128
                                 (seeds 0, 1): 12 runs of 1 to 9 minutes on a shared 2-core CPU
"""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from experiments import comparisons, paired_stats, summarize
from gated_attention import cli_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
SINK_VARIANTS = ("baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise", "g1_sdpa_head_shared",
                 "g2_value_elementwise", "g1_input_independent", "g1_ns_sigmoid")
LR_VARIANTS = ("baseline", "g1_sdpa_elementwise")
# name -> kind ("paired" or "lr_sweep"), docs page, grid file, seeds, run_grid's other
# arguments, the runs (--only) and how the command line names them, and for "paired" the
# metrics of the table.
TABLES: dict[str, dict[str, Any]] = {
    "sinks_cpu": {
        "kind": "paired", "page": "docs/sinks.md", "grid": "experiments/grids/sinks_cpu.py",
        "seeds": "0,1,2", "args": (),
        "only": tuple(f"sink_tiny-h2-{v}-s{s}" for v in SINK_VARIANTS for s in (0, 1, 2)),
        "only_text": "its 7 Table 4 rows",
        "metrics": ("f_attn", "sink_rate", "m_act", "eval_loss"),
    },
    "lr_cpu": {
        "kind": "lr_sweep", "page": "docs/analysis.md", "grid": "experiments/grids/lr_cpu.py",
        "seeds": "0,1",
        "args": ("--lr_multipliers", "1,8,32,128", "--no_analyze",
                 "--set", "train.batch_size=4", "--set", "train.steps=200",
                 "--set", "train.eval_every=200", "--set", "train.checkpoint_every=200"),
        "only": tuple(f"tiny-l12-{v}-lrx{m}-s{s}" for v in LR_VARIANTS
                      for m, seeds in ((1, (0,)), (8, (0,)), (32, (0, 1)), (128, (0, 1)))
                      for s in seeds),
        "only_text": "its 12 runs: baseline and G1 elementwise, seed 0 at x1 and x8, "
                     "seeds 0 and 1 at x32 and x128",
    },
}


def _fmt(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def produced_line(result: Mapping[str, Any], command: str) -> str:
    """The command, the commits the finished runs' record.json name, and their seeds."""
    done = [r for r in result["runs"] if r["state"] == "done"]
    commits = sorted({r.get("commit") for r in done if r.get("commit")})
    dirty = any(r.get("dirty") for r in done)
    seeds = sorted({r["seed"] for r in done})
    return (f"Produced by `{command}`, then `python -m experiments.summarize`, at "
            f"commit{'s' if len(commits) > 1 else ''} "
            + (", ".join(f"`{c[:10]}`" for c in commits) or "unknown")
            + (" (with uncommitted changes)" if dirty else "")
            + f", seeds {', '.join(map(str, seeds))}.")


def table_block(name: str, result: Mapping[str, Any], command: str) -> str:
    """Markdown of one table, by its kind: "lr_sweep" (lr_sweep_block) or "paired": per row
    mean ± se over seeds and the paired difference to the baseline with its 95% t interval,
    t-test p-value and Holm mark, for each metric; then, for each difference that is not
    significant, the seeds that would resolve it."""
    spec = TABLES[name]
    if spec["kind"] == "lr_sweep":
        return lr_sweep_block(result, command)
    groups = [g for g in result["groups"] if g["seeds"]]
    paired = {(e["group"], e["metric"]): e for e in result["paired"]}
    titles = {m: t for m, t, _ in comparisons.PAIRED_METRICS}
    head = "| variant | seeds | " + " | ".join(
        f"{titles[m]} (mean ± se) | minus baseline [95% CI]" for m in spec["metrics"]) + " |"
    lines = [produced_line(result, command), "", head,
             "|---|---|" + "---|---|" * len(spec["metrics"])]
    for g in groups:
        cells = []
        for m in spec["metrics"]:
            se = g.get(f"{m}_se")
            cells.append(_fmt(g.get(m)) + ("" if se is None else f" ± {_fmt(se)}"))
            e = paired.get((g["group"], m))
            if e is None:
                cells.append("-")
            else:
                ci = "" if e["low"] is None else f" [{_fmt(e['low'])}, {_fmt(e['high'])}]"
                p = "" if e["p_t"] is None else f", p {_p(e['p_t'])}"
                cells.append(f"{e['diff']:+.3f}{ci}{p}"
                             f"{comparisons.MARK if e['significant'] else ''}")
        lines.append(f"| {g['label']} | {g['seeds']} | " + " | ".join(cells) + " |")
    unresolved = [e for e in result["paired"] if e["metric"] in spec["metrics"]
                  and not e["significant"] and e["p_t"] is not None]
    check = result.get("sink_check") or {}
    if check.get("checked"):
        lines += ["", f"Baseline sink check: the baseline formed a sink (F-Attn >= "
                  f"{check['factor']:g}x the uniform {check['uniform']:.3f}) in "
                  f"{check['formed']} of {check['checked']} seeds"
                  + (f"; not in {', '.join(check['no_sink'])}" if check["no_sink"] else "")
                  + "."]
    lines += ["", f"{comparisons.MARK.strip()}: significant at 5% after Holm's correction over "
              "the rows of that column (p: paired t-test over seeds, two-sided, before the "
              "correction; 95% CI: Student t with n - 1 degrees of freedom)."]
    if unresolved:
        titles_short = {m: titles[m] for m in spec["metrics"]}
        lines += ["", "Not significant after Holm, and the seeds a paired t-test at 5% would "
                  "need for 80% power if the mean difference and its spread stayed as observed: "
                  + "; ".join(f"{e['label']} {titles_short[e['metric']]} "
                              f"({e['diff']:+.3f}): {_seeds_for(e, result['paired'])}"
                              for e in unresolved) + "."]
    return "\n".join(lines)


def lr_sweep_block(result: Mapping[str, Any], command: str) -> str:
    """The summary's learning-rate sweep section without its heading: what it measures, then
    per variant the best loss and the largest stable learning rate, then every point."""
    section = comparisons.lr_sweep_markdown(result["lr_sweep"])
    if not section:
        return produced_line(result, command) + "\n\nNo run of the sweep has finished."
    body = section[1:] if section[0].startswith("## ") else section
    while body and not body[0]:
        body = body[1:]
    while body and not body[-1]:
        body = body[:-1]
    return "\n".join([produced_line(result, command), "", *body])


def _p(value: float) -> str:
    return f"{value:.2g}" if value < 0.01 else f"{value:.2f}"


def _seeds(needed: int | None) -> str:
    return "no spread to go on, or over 1000" if needed is None else str(needed)


def holm_seeds_needed(entry: Mapping[str, Any], m: int) -> int | None:
    """Pairs a t-test at 5% / m needs for 80% power at the entry's observed mean and spread:
    a p below that passes Holm's correction over m rows whatever the other rows give (the
    Bonferroni level, the strictest Holm uses). None without a spread or beyond MAX_SEEDS."""
    if not entry.get("se") or not entry.get("n") or entry["n"] < 2:
        return None
    effect = abs(entry["diff"]) / (entry["se"] * entry["n"] ** 0.5)
    alpha = paired_stats.ALPHA / m
    return next((n for n in range(2, paired_stats.MAX_SEEDS + 1)
                 if paired_stats.t_power(effect, n, alpha) >= paired_stats.POWER), None)


def _seeds_for(entry: Mapping[str, Any], paired: Sequence[Mapping[str, Any]]) -> str:
    """The seeds to resolve a difference Holm's correction left unmarked: at 5% where the
    uncorrected p is above 5%, else at the Bonferroni level of its column."""
    if entry["seeds_needed"] is not None or entry["p_t"] >= paired_stats.ALPHA:
        return _seeds(entry["seeds_needed"])
    m = sum(1 for e in paired if e["metric"] == entry["metric"] and e["p_t"] is not None)
    needed = holm_seeds_needed(entry, m)
    return (f"p < 0.05 before the correction; {_seeds(needed)} at 5%/{m} "
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


def make(name: str, root: pathlib.Path, run: bool) -> None:
    spec = TABLES[name]
    grid_root = root / name
    args, command = grid_command(name, grid_root)
    if run:
        subprocess.run([sys.executable, "-m", "experiments.run_grid", *args],
                       cwd=REPO, check=False)
    result = summarize.summarize(grid_root)
    page = REPO / spec["page"]
    page.write_text(replace_block(page.read_text(), name, table_block(name, result, command)))
    print(f"{spec['page']}: table {name} rewritten from {grid_root}")


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("root", "runs/tables", "Where the grids' runs go.",
                        flag_values=flag_values)
    flags.DEFINE_string("only", "", "Comma-separated table names.", flag_values=flag_values)
    flags.DEFINE_bool("no_run", False, "Summarise existing roots only.",
                      flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    cli = cli_flags.Command("experiments.make_tables", __doc__)
    args = cli.parse(define_flags(flags.FlagValues()), argv)
    names = [n for n in args.only.split(",") if n] or list(TABLES)
    unknown = set(names) - set(TABLES)
    if unknown:
        cli.error(f"--only names {sorted(unknown)}; tables: {', '.join(TABLES)}")
    for name in names:
        make(name, pathlib.Path(args.root), run=not args.no_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
