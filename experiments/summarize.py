"""Summarise a grid: our numbers beside the paper's, and how the variants rank.

    python -m experiments.summarize runs/table1        # or gs://bucket/grids/table1

Reads `<root>/runs.json` and each run's `analysis/analysis.json` (written by
gated_attention.analysis.run_analysis) and `_status/<run>.json`, and writes `<root>/summary.md`,
`<root>/summary.csv` (one row per run group, seeds averaged) and `<root>/runs.csv` (one row per
run). Paper numbers come from experiments/paper_tables.json: PPL (and +Param) from the run's
own table, gate score / M-Act / F-Attn from Table 4 where the variant is one of its rows.
Rankings order groups by each metric (lower is better for all four) in tiers: groups the seeds
cannot tell apart at 5% share one (experiments/rank_stats.py; with one seed nothing is
ordered, and the summary says it holds single runs); with at least three groups that have a
paper value they give Spearman's rank correlation with the paper's order, with a bootstrap
interval over seeds. Each group lists the seeds it holds, and a run that diverged (a
non-finite number) is counted there, never dropped unseen.
A Table 5 grid (experiments/grids/table5.py) adds a long-context section: each continued
run's `length_eval/length_eval.json` (gated_attention.analysis.length) as retrieval score and
perplexity per length, with and without YaRN, beside the paper's RULER numbers at the same
multiple of the training length; it is also written to `<root>/table5.csv`.
Each run's `record.json` (gated_attention/training/run_record.py) gives its final train and held-out
loss, tokens, wall time and code version; its metrics.jsonl gives non-finite steps and loss
spikes where the run was not analysed. A run with no analysis.json (a grid run with
--no_analyze, or its analysis failed) takes its sink numbers (F-Attn, sink rate, M-Act, gate)
from the record's last telemetry point (train.telemetry_every), so the baseline's sink is
still checked; the table's "sink from" column says which source each row's numbers are.
With several seeds, every row is compared with its reference row (the baseline of the same
grid, or `--reference NAME`) seed by seed: `<root>/paired.csv` and a "Paired differences"
section (experiments/comparisons.py, experiments/paired_stats.py); a grid run with
`--lr_multipliers` adds a learning-rate section (`<root>/lr_sweep.csv`); a sink grid says
whether its baseline formed a sink; a G1 elementwise row (at the recipe's learning rate)
is placed on a ladder of published small-scale results.
The root may be local or a bucket: every path is an etils.epath (gated_attention.core.paths).
"""

from __future__ import annotations

import collections
import csv
import io
import json
import math
import re
import statistics
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags
from etils import epath
from scipy import stats as scipy_stats

from experiments import comparisons, grid_lib, rank_stats
from gated_attention.cli import flags as cli_flags
from gated_attention.core import errors, paths
from gated_attention.training import run_record

METRICS = (  # (our key, paper key, column title)
    ("ppl", "avg_ppl", "PPL"),
    ("f_attn", "first_token_attention", "F-Attn"),
    ("m_act", "massive_activation", "M-Act"),
    ("gate", "gate_score", "gate score"),
)
TABLE4 = "table4_sink_and_activation"
# The paper's benchmark columns (Tables 1-3), from a run's lm-eval scores during training
# (train.harness_tasks; record.json final.harness "<task>/<metric>", the first found), in
# percent as the paper prints them: (our key, paper key, column title, lm-eval keys).
BENCHMARKS = (
    ("hellaswag", "hellaswag", "HellaSwag", ("hellaswag/acc_norm", "hellaswag/acc")),
    ("mmlu", "mmlu", "MMLU", ("mmlu/acc",)),
    ("gsm8k", "gsm8k", "GSM8k", ("gsm8k/exact_match,strict-match", "gsm8k/exact_match")),
    ("ceval", "ceval", "C-eval", ("ceval-valid/acc", "ceval/acc")),
)
# The synthetic sink task's metrics (analysis.json "task", gated_attention/analysis/backcopy.py):
# our key -> its key there.
SINK_TASK_KEYS = {
    "f_attn_other": "f_attn_other", "f_attn_trigger": "f_attn_trigger",
    "sink_heads": "sink_head_share", "bos_ratio": "bos_residual_ratio",
    "gate_trigger": "gate_trigger", "gate_other": "gate_other",
    "trigger_acc": "trigger_accuracy", "bigram_excess": "bigram_excess_loss",
}
ONE_SEED_WARNING = ("**One seed per row.** Every number below is a single run: no spread, no "
                    "interval, no test. A difference between rows, or beside the paper's, is "
                    "not a finding at one seed.")
# A variant "removes the sink" when its F-Attn is below this share of the baseline's.
SINK_FREE_SHARE = 1 / 3


def discover_runs(root: epath.Path) -> dict[str, dict[str, Any]]:
    """Run definitions from runs.json, plus any run directory it does not list."""
    manifest = paths.read_json_current(root / "runs.json") or {"runs": {}}
    runs = dict(manifest["runs"])
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if child.name not in runs and (child / "config.json").exists():
            config = json.loads((child / "config.json").read_text())
            runs[child.name] = {"name": child.name, "arch": config.get("arch"),
                                "variant": config.get("variant"),
                                "seed": config.get("seed", 0), "overrides": {}, "table": "",
                                "paper": {}, "label": config.get("variant")}
    return runs


def paper_row(tables: Mapping[str, Any], table: str, variant: str,
              keys: Mapping[str, Any]) -> dict[str, Any]:
    """The paper's numbers for a run: its table's row (matching `keys`), plus Table 4's."""
    out: dict[str, Any] = {}
    rows = tables.get(table) if table else None
    if isinstance(rows, list):
        for row in rows:
            if row["name"] == variant and all(row.get(k) == v for k, v in keys.items()):
                out.update(row)
                break
    for row in tables[TABLE4]:
        if row["name"] == variant:
            for _, key, _ in METRICS[1:]:
                out[key] = row[key]
    return out


def _train_log(root: epath.Path, name: str, warmup_steps: int) -> dict[str, Any]:
    """Non-finite (skipped) steps and loss spikes from a run's metrics.jsonl."""
    from gated_attention.analysis import stability
    from gated_attention.training.metrics_writer import read_jsonl

    path = root / name / "metrics.jsonl"
    if not path.exists():
        return {}
    trains = [r for r in read_jsonl(path, torn_tail="drop") if r.get("kind") == "train"]
    report = stability.stability_report([(r["step"], r["loss"]) for r in trains],
                                        warmup_steps=warmup_steps)
    return {"skipped": sum(bool(r.get("skipped")) for r in trains),
            "spikes": report["spikes"], "diverged": report["diverged"]}


def top_layer(measured: Mapping[str, Any], key: str) -> float | None:
    """The largest layer's F-Attn (`key`_per_layer): a sink that lives in one layer shows
    there at full size, where the mean over layers dilutes it by the depth."""
    per_layer = measured.get(f"{key}_per_layer")
    return max(per_layer) if per_layer else None


def telemetry_metrics(telemetry: Mapping[str, Any]) -> dict[str, Any]:
    """F-Attn, sink rate, M-Act and gate score from a record's last telemetry point: the sink
    numbers of a run that was never analysed (--no_analyze, or its analysis failed), so the
    baseline's sink is still checked. They are the training-time statistics (one training
    batch, the weights a step started from), not analysis' held-out ones of the final
    checkpoint; `sink_source` says which a row holds. `f_attn_uniform` is the uniform level
    of that same batch, its packed segments counted (telemetry.uniform_first_token_weight;
    absent in records older than it)."""
    return {"f_attn": telemetry.get("f_attn"), "f_attn_top": top_layer(telemetry, "f_attn"),
            "sink_rate": telemetry.get("sink_rate"),
            "m_act": telemetry.get("m_act"), "gate": telemetry.get("gate_mean"),
            "f_attn_uniform": telemetry.get("f_attn_uniform"),
            "sink_source": "telemetry", "sink_step": telemetry.get("step")}


def run_row(root: epath.Path, name: str, run: Mapping[str, Any],
            tables: Mapping[str, Any]) -> dict[str, Any]:
    analysis = paths.read_json_current(root / name / "analysis" / "analysis.json")
    status = paths.read_json_current(root / "_status" / f"{name}.json") or {}
    record = paths.read_json_current(root / name / "record.json")
    overrides = run.get("overrides") or {}
    row: dict[str, Any] = {
        "run": name, "group": re.sub(r"-s\d+$", "", name), "label": run.get("label") or
        run.get("variant"), "variant": run.get("variant"), "seed": run.get("seed"),
        "state": status.get("state", "done" if analysis or record else "not run"),
        "error": status.get("error"), "lr_multiplier": run.get("lr_multiplier"),
        "peak_lr": overrides.get("optimizer.peak_lr"),
    }
    if record:
        final = record.get("final") or {}
        row.update(train_loss=(final.get("train") or {}).get("loss"),
                   eval_loss=(final.get("eval") or {}).get("loss"),
                   tokens=record.get("tokens_seen"), wall_s=record.get("wall_seconds"),
                   commit=(record.get("code") or {}).get("commit"),
                   dirty=(record.get("code") or {}).get("dirty"),
                   dirty_paths=(record.get("code") or {}).get("dirty_paths"),
                   training_code=(record.get("code") or {}).get("training_code"),
                   **host_fields(record.get("hardware") or {}),
                   seq_len=record["config"]["data"]["seq_len"],
                   peak_lr=record["config"]["optimizer"]["peak_lr"])
    if row["state"] == "done" or record:
        warmup = int((record or {}).get("config", {}).get("optimizer", {}).get(
            "warmup_steps", overrides.get("optimizer.warmup_steps", 0)))
        row.update(_train_log(root, name, warmup))
    if analysis:
        stability = analysis.get("stability", {})
        final_eval = stability.get("final_eval") or {}
        row.update(
            ppl=analysis.get("perplexity"), eval_ppl=final_eval.get("perplexity"),
            f_attn=analysis["first_token_attention"], sink_rate=analysis["sink_rate"],
            f_attn_top=top_layer(analysis, "first_token_attention"),
            m_act=analysis["massive_activation"], gate=analysis["gate_score_mean"],
            spikes=stability.get("train", {}).get("spikes", row.get("spikes")),
            diverged=stability.get("train", {}).get("diverged", row.get("diverged")),
            params_added_m=analysis["params"]["params_added_vs_baseline"] / 1e6,
            step=analysis["step"],
        )
        task = analysis.get("task") or {}
        row.update({ours: task.get(key) for ours, key in SINK_TASK_KEYS.items() if task})
        row.update(sink_source="analysis", sink_step=analysis["step"])
    elif record and record.get("telemetry"):
        row.update(telemetry_metrics(record["telemetry"]))
    paper = paper_row(tables, run.get("table", ""), run.get("variant", ""),
                      run.get("paper") or {})
    for ours, key, _ in METRICS:
        row[f"paper_{ours}"] = paper.get(key)
    row["paper_params_added_m"] = paper.get("added_params_millions")
    row.update(benchmark_scores(((record or {}).get("final") or {}).get("harness") or {}))
    for ours, key, _, _ in BENCHMARKS:
        row[f"paper_{ours}"] = paper.get(key)
    return row


def benchmark_scores(harness: Mapping[str, Any]) -> dict[str, float]:
    """The paper's benchmark columns (percent) from a record's final lm-eval scores."""
    out = {}
    for ours, _, _, keys in BENCHMARKS:
        found = [harness[k] for k in keys if isinstance(harness.get(k), (int, float))]
        if found:
            out[ours] = 100.0 * float(found[0])
    return out


def _mean_std(values: Sequence[Any]) -> tuple[float | None, float | None]:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def _count(values: Sequence[Any]) -> int:
    return sum(v is not None and math.isfinite(float(v)) for v in values)


def group_rows(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Average the seeds of each run group (same arch, variant and overrides)."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(row["group"], []).append(row)
    out = []
    for group, members in groups.items():
        done = [m for m in members if m["state"] == "done"]
        first = members[0]
        g: dict[str, Any] = {"group": group, "label": first["label"],
                             "variant": first["variant"], "seeds": len(done),
                             "seed_list": sorted(m["seed"] for m in done),
                             "failed": sum(m["state"] == "failed" for m in members),
                             "unfinished": sum(m["state"] not in ("done", "failed")
                                               for m in members),
                             "lr_multiplier": first.get("lr_multiplier")}
        for key in ("ppl", "eval_ppl", "eval_loss", "train_loss", "f_attn", "f_attn_top",
                    "sink_rate", "m_act", "gate", "spikes", "params_added_m", *SINK_TASK_KEYS,
                    *(b[0] for b in BENCHMARKS)):
            values = [m.get(key) for m in done]
            g[f"{key}_nonfinite"] = sum(v is not None and not math.isfinite(float(v))
                                        for v in values)
            g[key], g[f"{key}_std"] = _mean_std(values)
            n = _count(values)  # standard error of the mean over seeds
            g[f"{key}_se"] = (g[f"{key}_std"] / math.sqrt(n)
                              if g[f"{key}_std"] is not None else None)
        g["diverged"] = sum(bool(m.get("diverged")) for m in done)
        g["sink_source"] = _sources([m.get("sink_source") for m in done])
        for key in ("paper_ppl", "paper_f_attn", "paper_m_act", "paper_gate",
                    "paper_params_added_m", *(f"paper_{b[0]}" for b in BENCHMARKS)):
            g[key] = first.get(key)
        out.append(g)
    return out


def _sources(sources: Sequence[str | None]) -> str | None:
    """Where a group's sink numbers come from: one source, or the count of each over seeds."""
    counts = collections.Counter(s for s in sources if s)
    if len(counts) <= 1:
        return next(iter(counts), None)
    return ", ".join(f"{source} {n}" for source, n in sorted(counts.items()))


def host_fields(hardware: Mapping[str, Any]) -> dict[str, Any]:
    """A run's host CPU and XLA CPU settings from its record (run_record.hardware), for
    tables that must say where their numbers come from."""
    cpu = hardware.get("host_cpu") or {}
    isa = cpu.get("vector_isa") or []
    widest = next((x for x in ("avx512f", "avx2", "avx", "sse4_2") if x in isa), None)
    return {"host_cpu": " ".join(x for x in (cpu.get("model_name"), widest and f"({widest})")
                                 if x) or None,
            "xla_flags": hardware.get("xla_flags"), "cpu_threads": hardware.get("cpu_threads")}


def _distinct(done: Sequence[Mapping[str, Any]], key: str) -> list[Any]:
    return sorted({r.get(key) for r in done if r.get(key) is not None}, key=str)


def one_training_code(done: Sequence[Mapping[str, Any]]) -> bool | None:
    """Whether runs at several commits trained the same code: the trees of the package and
    configs/ (run_record.TRAINING_CODE) equal at every commit (from the record, else from
    git), with no uncommitted change under them. True, False, or None where a record with
    uncommitted changes does not say which files (records older than dirty_paths)."""
    asked = {c: run_record.training_code_trees(c)  # git once per commit, for old records
             for c in {r.get("commit") for r in done if not r.get("training_code")} if c}
    trees = []
    for r in done:
        tree = r.get("training_code") or asked.get(r.get("commit"))
        trees.append(json.dumps(tree, sort_keys=True) if tree else None)
    if None in trees or len(set(trees)) > 1:
        return False
    unknown = False
    for r in done:
        if not r.get("dirty"):
            continue
        if r.get("dirty_paths") is None:
            unknown = True
        elif any(path.split("/")[0] in run_record.TRAINING_CODE for path in r["dirty_paths"]):
            return False
    return None if unknown else True


def provenance_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """Where the finished runs' numbers come from, from their record.json: "at commit(s) ...,
    seeds ..., on <host CPU>, XLA_FLAGS ... (n cores)."; in bold where the runs mix training
    code, hosts or XLA settings, since such rows compare as different seeds do, not bit for
    bit. Commits whose package and configs/ are the same trees (one_training_code) are one
    training code: the block names them and says so, without the bold."""
    done = [r for r in rows if r["state"] == "done"]
    commits = _distinct(done, "commit")
    hosts = _distinct(done, "host_cpu")
    settings = sorted({(r.get("xla_flags") or "(none)", r.get("cpu_threads")) for r in done
                       if r.get("xla_flags") is not None}, key=str)
    same_code = one_training_code(done) if len(commits) > 1 else True
    dirty = [r for r in done if r.get("dirty")]
    folders = "`" + "/`, `".join(run_record.TRAINING_CODE) + "/`"
    notes = ["with uncommitted changes"] if dirty else []
    if len(commits) > 1 and same_code:
        notes.append(f"one training code: {folders} the same trees at each"
                     + (", no uncommitted change under them" if dirty else ""))
    elif len(commits) > 1 and same_code is None:
        notes.append(f"{folders} the same trees at each commit, but a record with uncommitted "
                     "changes does not say which files")
    text = (f"at commit{'s' if len(commits) > 1 else ''} "
            + (", ".join(f"`{c[:10]}`" for c in commits) or "unknown")
            + (f" ({'; '.join(notes)})" if notes else ""))
    text += (f", seeds {', '.join(map(str, sorted({r['seed'] for r in done}))) or 'none'}"
             + (f", on {'; '.join(hosts)}" if hosts else ", host not recorded")
             + (", XLA_FLAGS " + "; ".join(f"`{f}` ({t} core{'' if t == 1 else 's'})"
                                          for f, t in settings)
                if settings else ", XLA settings not recorded") + ".")
    mixed = [what for what, values in (("commits", commits if not same_code else ()),
                                       ("hosts", hosts), ("XLA settings", settings))
             if len(values) > 1]
    if mixed:
        text += (f" **The runs mix {' and '.join(mixed)}**: rows compare as runs of different "
                 "seeds do, not bit for bit.")
    return text


def per_seed(rows: Sequence[Mapping[str, Any]], key: str) -> dict[str, dict[Any, float]]:
    """group label -> {seed: value} of one metric over the finished runs."""
    out: dict[str, dict[Any, float]] = {}
    for r in rows:
        if r["state"] == "done" and r.get(key) is not None:
            out.setdefault(r["label"], {})[r["seed"]] = float(r[key])
    return out


def rankings(groups: Sequence[Mapping[str, Any]],
             rows: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Per metric: our rows in tiers (rank_stats.tiers: rows the seeds cannot tell apart at
    5% share a tier, so one seed orders nothing), the paper's order, and Spearman's rho on the
    shared rows with its bootstrap interval over seeds (rank_stats.spearman_bootstrap). rows:
    the per-run rows; without them every group counts as a single run."""
    out = []
    for ours, _, title in METRICS:
        values = (per_seed(rows, ours) if rows else
                  {g["label"]: {0: g[ours]} for g in groups if g.get(ours) is not None})
        have = [g for g in groups if g.get(ours) is not None and g["label"] in values]
        ordered = rank_stats.tiers({g["label"]: values[g["label"]] for g in have})
        both = [g for g in have if g.get(f"paper_{ours}") is not None]
        paper_order = [g["label"] for g in sorted(both, key=lambda g: g[f"paper_{ours}"])]
        rho = None
        if len(both) >= 3:
            rho = float(scipy_stats.spearmanr([g[ours] for g in both],
                                              [g[f"paper_{ours}"] for g in both]).statistic)
            rho = None if math.isnan(rho) else rho
        boot = rank_stats.spearman_bootstrap(
            {g["label"]: values[g["label"]] for g in both},
            {g["label"]: g[f"paper_{ours}"] for g in both})
        out.append({"metric": title, "ours": [x for tier in ordered for x in tier],
                    "tiers": ordered, "paper": paper_order, "shared": len(both),
                    "spearman": rho, "spearman_bootstrap": boot,
                    "seeds": max((len(v) for v in values.values()), default=0)})
    return out


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def seeds_cell(g: Mapping[str, Any]) -> str:
    """How many seeds a group holds and which: "3 (0, 1, 2)", with the runs whose numbers
    are non-finite (a diverged run) counted: they are left out of the means, never unseen."""
    text = f"{g['seeds']} ({', '.join(map(str, g.get('seed_list') or [])) or '-'})"
    nonfinite = _nonfinite(g)
    return text + (f", {nonfinite} of {g['seeds']} non-finite" if nonfinite else "")


def _nonfinite(g: Mapping[str, Any]) -> int:
    """The most finished runs of a group with a non-finite value in any one metric."""
    return max((v for k, v in g.items() if k.endswith("_nonfinite")), default=0)


def seed_list_cell(g: Mapping[str, Any]) -> str:
    """The seeds a group's finished runs hold, and how many of them ended non-finite."""
    nonfinite = _nonfinite(g)
    return (", ".join(map(str, g.get("seed_list") or [])) or "-") + (
        f" ({nonfinite} non-finite)" if nonfinite else "")


def _pm(g: Mapping[str, Any], key: str, digits: int = 3) -> str:
    """mean ± standard error over the seeds (the std is in summary.csv)."""
    se = g.get(f"{key}_se")
    return _fmt(g.get(key), digits) + (f" ± {_fmt(se, 2)}" if se is not None else "")


def markdown(root: epath.Path, manifest: Mapping[str, Any] | None,
             groups: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]],
             ranks: Sequence[Mapping[str, Any]]) -> str:
    lines = [f"# Grid summary: {root.name}", ""]
    if manifest:
        lines += [f"Grid `{manifest.get('grid')}` at scale `{manifest.get('scale')}`"
                  + (f", settings {manifest.get('settings')}" if manifest.get("settings") else "")
                  + ".", ""]
    if any(r["state"] == "done" for r in rows):
        lines += ["Finished runs " + provenance_text(rows), ""]
    lines += [
        "Ours: held-out PPL and the analysis metrics of each run's last checkpoint (mean ± "
        "standard error over seeds; the std is in summary.csv); F-Attn excludes query 0; "
        "M-Act = mean over layers of max |layer output|. "
        "Paper: the same rows in arXiv 2505.06708 (its scale, not ours). "
        "sink from: where F-Attn, sink rate, M-Act and gate come from (with the number of "
        "seeds where they differ): analysis = analysis/analysis.json (the last checkpoint on "
        "held-out batches); telemetry = the last training-time telemetry point in the run's "
        "record.json, for a run with no analysis (one training batch, with the weights that "
        "step started from: not the same measurement); - = neither.", "",
        *([ONE_SEED_WARNING, ""] if groups and max(g["seeds"] for g in groups) <= 1 else []),
        "| run | seeds | seed list | PPL | paper PPL | F-Attn | paper F-Attn | sink rate | M-Act "
        "| paper M-Act | gate | paper gate | spikes | diverged | +params (M) | paper +params (M) "
        "| sink from |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        lines.append(
            f"| {g['label']} (`{g['group']}`) | {g['seeds']}"
            + (f" ({g['failed']} failed)" if g["failed"] else "")
            + (f" ({g['unfinished']} not done)" if g["unfinished"] else "")
            + f" | {seed_list_cell(g)} | {_pm(g, 'ppl')} | {_fmt(g['paper_ppl'])} "
            f"| {_pm(g, 'f_attn')} "
            f"| {_fmt(g['paper_f_attn'])} | {_pm(g, 'sink_rate', 2)} | {_pm(g, 'm_act')} "
            f"| {_fmt(g['paper_m_act'])} | {_pm(g, 'gate')} | {_fmt(g['paper_gate'])} "
            f"| {_fmt(g['spikes'], 2)} | {g['diverged']} | {_fmt(g['params_added_m'])} "
            f"| {_fmt(g['paper_params_added_m'])} | {g.get('sink_source') or '-'} |")
    telemetry = [r for r in rows if r.get("sink_source") == "telemetry"]
    if telemetry:
        lines += ["", "Sink numbers from training telemetry (no analysis.json): "
                  + ", ".join(f"`{r['run']}` (step {r.get('sink_step', '?')})"
                              for r in telemetry) + "."]
    lines += benchmarks_markdown(groups)
    lines += ["", *rankings_markdown(ranks)]
    if any(g.get("trigger_acc") is not None for g in groups):
        lines += ["", *sink_section(groups, rows)]
    bad = [r for r in rows if r["state"] != "done"]
    if bad:
        lines += ["", "## Runs not done", ""]
        lines += [f"- `{r['run']}`: {r['state']}" + (f" ({r['error']})" if r["error"] else "")
                  for r in bad]
    return "\n".join(lines) + "\n"

def benchmarks_markdown(groups: Sequence[Mapping[str, Any]]) -> list[str]:
    """The benchmark columns beside the paper's, for grids whose runs scored them."""
    if not any(g.get(b[0]) is not None for g in groups for b in BENCHMARKS):
        return []
    head = " | ".join(f"{title} | paper {title}" for _, _, title, _ in BENCHMARKS)
    lines = ["", "## Benchmarks (lm-eval, percent)", "",
             "Ours: each run's last train.harness_tasks scores (mean ± standard error over "
             "seeds); paper: Tables 1-3 of arXiv 2505.06708, at its scale and few-shot "
             "settings (docs/evaluation.md).", "", f"| run | seeds | {head} |",
             "|---|---|" + "---|---|" * len(BENCHMARKS)]
    for g in groups:
        cells = " | ".join(f"{_pm(g, ours, 2)} | {_fmt(g[f'paper_{ours}'], 2)}"
                           for ours, _, _, _ in BENCHMARKS)
        lines.append(f"| {g['label']} (`{g['group']}`) | {seeds_cell(g)} | {cells} |")
    return lines


def rankings_markdown(ranks: Sequence[Mapping[str, Any]]) -> list[str]:
    """The Rankings section: our tiers (≈ where the seeds cannot tell rows apart, and for
    every row when there is one seed), the paper's order, and rho with its seeds and interval."""
    ranked = [r for r in ranks if r["ours"]]
    if not ranked:
        return []
    one_seed = max(r["seeds"] for r in ranked) <= 1
    lines = ["## Rankings (lower first)", "",
             "Rows in the order of their means over seeds; ≈ joins rows the seeds do not tell "
             "apart at 5% (paired over seeds: the t-test, or the exact sign-flip test where "
             "every seed gave the same difference). One seed tells nothing apart.", ""]
    if one_seed:
        lines += ["**One seed per row: these are single runs.** No row is ranked above "
                  "another and no difference here is a finding; run more seeds "
                  "(`run_grid --seeds 0,1,2,...`) to order them.", ""]
    for r in ranked:
        lines.append(f"- **{r['metric']}** ours: {rank_stats.tiers_text(r['tiers'])}")
        if r["paper"]:
            boot = r.get("spearman_bootstrap")
            rho = ("" if r["spearman"] is None
                   else f"; Spearman rho = {r['spearman']:.2f} over {r['shared']} rows")
            if rho and boot is not None:
                rho += (" (single runs, no interval)" if boot["low"] is None else
                        f" (95% bootstrap interval over {len(boot['seeds'])} seeds "
                        f"[{boot['low']:.2f}, {boot['high']:.2f}])")
            lines.append(f"  paper: {' < '.join(r['paper'])}{rho}")
    return lines


TABLE5 = "table5_ruler"
# (our variant, RoPE scaling evaluated, the paper's row in table5_ruler, title)
TABLE5_ROWS = (("baseline", "none", "baseline", "baseline"),
               ("g1_sdpa_elementwise", "none", "g1", "G1 gate"),
               ("baseline", "yarn", "baseline_yarn", "baseline + YaRN"),
               ("g1_sdpa_elementwise", "yarn", "g1_yarn", "G1 gate + YaRN"))
PAPER_TRAIN_LENGTH = 32768  # the paper's continued-training length


def _ratio_label(ratio: float) -> str:
    return f"{ratio:g}x" if ratio >= 1 else f"1/{1 / ratio:g}x"


def table5(root: epath.Path, runs: Mapping[str, Mapping[str, Any]],
           tables: Mapping[str, Any]) -> dict[str, Any] | None:
    """Retrieval score (x100) and perplexity per length of the continued runs, seeds averaged,
    beside the paper's RULER score at the same multiple of the training length."""
    continued = [(name, run) for name, run in runs.items() if run.get("table") == TABLE5
                 and (run.get("overrides") or {}).get("train.init_from")]
    if not continued:
        return None
    evals = {name: paths.read_json_current(root / name / "length_eval" / "length_eval.json")
             for name, _ in continued}
    done = [e for e in evals.values() if e]
    train_lengths = {e["settings"]["train_length"] for e in done}
    lengths = sorted({int(x) for e in done for x in e["settings"]["lengths"]})
    paper = tables[TABLE5]
    paper_at = {length / PAPER_TRAIN_LENGTH: i for i, length in enumerate(paper["lengths"])}
    train_length = min(train_lengths) if len(train_lengths) == 1 else None
    rows = []
    for variant, scaling, paper_name, title in TABLE5_ROWS:
        members = [evals[name] for name, run in continued
                   if run.get("variant") == variant and evals[name]]
        row: dict[str, Any] = {"method": title, "variant": variant, "scaling": scaling,
                               "seeds": len(members)}
        for length in lengths:
            found = [m["results"].get(scaling, {}).get(str(length)) for m in members]
            found = [f for f in found if f]
            score = _mean_std([f["retrieval_score"] for f in found])[0]
            ppl = _mean_std([f.get("perplexity", {}).get("perplexity") for f in found])[0]
            index = paper_at.get(length / train_length) if train_length else None
            row[f"score_{length}"] = None if score is None else 100 * score
            row[f"ppl_{length}"] = ppl
            row[f"paper_{length}"] = (None if index is None
                                      else paper["rows"][paper_name][index])
        rows.append(row)
    tasks = sorted({t for e in done for t in e["settings"].get("tasks", [])})
    return {"train_length": train_length, "lengths": lengths, "rows": rows, "tasks": tasks,
            "missing": [name for name, e in evals.items() if not e]}


def table5_markdown(result: Mapping[str, Any]) -> list[str]:
    lengths, train_length = result["lengths"], result["train_length"]

    def head(length: int) -> str:
        return (f"{length} ({_ratio_label(length / train_length)})" if train_length
                else str(length))

    header = "| method | seeds | " + " | ".join(head(n) for n in lengths) + " |"
    rule = "|---|---|" + "---|" * len(lengths)
    lines = ["", "## Table 5: long context", "",
             f"Continued runs trained at {train_length} tokens (paper: {PAPER_TRAIN_LENGTH}), "
             "evaluated at each length with plain RoPE or YaRN. Retrieval: mean exact score "
             f"x100 over the synthetic tasks ({', '.join(result.get('tasks') or ['none'])}); "
             "paper: RULER at the same multiple of its training length. "
             "Cells: ours / paper.", "", header, rule]
    for row in result["rows"]:
        cells = [f"{_fmt(row[f'score_{n}'], 1)} / {_fmt(row[f'paper_{n}'], 2)}" for n in lengths]
        lines.append(f"| {row['method']} | {row['seeds']} | " + " | ".join(cells) + " |")
    lines += ["", "Held-out perplexity at the same lengths (lower is better):", "", header, rule]
    for row in result["rows"]:
        cells = [_fmt(row[f"ppl_{n}"], 3) for n in lengths]
        lines.append(f"| {row['method']} | {row['seeds']} | " + " | ".join(cells) + " |")
    by = {(r["variant"], r["scaling"]): r for r in result["rows"]}
    gated, base = by[("g1_sdpa_elementwise", "yarn")], by[("baseline", "yarn")]
    beyond = [n for n in lengths if train_length and n > train_length]
    gaps = []
    for n in beyond:
        ours = (None if gated[f"score_{n}"] is None or base[f"score_{n}"] is None
                else gated[f"score_{n}"] - base[f"score_{n}"])
        theirs = (None if gated[f"paper_{n}"] is None or base[f"paper_{n}"] is None
                  else gated[f"paper_{n}"] - base[f"paper_{n}"])
        gaps.append(f"{head(n)}: ours {_fmt(ours, 1)}, paper {_fmt(theirs, 1)}")
    if gaps:
        lines += ["", "G1 + YaRN minus baseline + YaRN beyond the training length (retrieval "
                  "points): " + "; ".join(gaps) + "."]
    if result["missing"]:
        lines += ["", "Not evaluated yet: " + ", ".join(f"`{m}`" for m in result["missing"])]
    return lines


def sink_comparison(groups: Sequence[Mapping[str, Any]],
                    runs: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """F-Attn of the synthetic task against Table 4: Spearman's rho over the Table 4 rows we
    ran (with its bootstrap interval over the seeds of `runs`, the per-run rows, and rho
    without each row), and the rows where we and the paper disagree on whether the sink is
    removed (F-Attn below SINK_FREE_SHARE of the baseline's)."""
    rows = [g for g in groups if g.get("f_attn") is not None and g.get("paper_f_attn")
            is not None]
    rho = None
    if len(rows) >= 3:
        rho = float(scipy_stats.spearmanr([g["f_attn"] for g in rows],
                                          [g["paper_f_attn"] for g in rows]).statistic)
        rho = None if math.isnan(rho) else rho
    base = next((g for g in rows if g["variant"] == "baseline"), None)
    disagree = []
    if base is not None and base["f_attn"] > 0:
        for g in rows:
            ours = g["f_attn"] < SINK_FREE_SHARE * base["f_attn"]
            paper = g["paper_f_attn"] < SINK_FREE_SHARE * base["paper_f_attn"]
            if ours != paper:
                disagree.append({"label": g["label"], "ours_sink_free": ours,
                                 "ratio": g["f_attn"] / base["f_attn"],
                                 "paper_ratio": g["paper_f_attn"] / base["paper_f_attn"]})
    # M-Act: the paper's gated rows all lie below its baseline; name ours that do not.
    m_act_up = [g["label"] for g in rows if base is not None and g is not base
                and g.get("m_act") is not None and base.get("m_act") is not None
                and g.get("paper_m_act") is not None and base.get("paper_m_act") is not None
                and g["paper_m_act"] < base["paper_m_act"] and g["m_act"] > base["m_act"]]
    seeds = per_seed(runs, "f_attn")
    boot = rank_stats.spearman_bootstrap(
        {g["label"]: seeds[g["label"]] for g in rows if g["label"] in seeds},
        {g["label"]: g["paper_f_attn"] for g in rows}) if runs else None
    return {"rows": len(rows), "spearman": rho, "baseline": base is not None,
            "disagree": disagree, "m_act_up": m_act_up, "bootstrap": boot}


def sink_section(groups: Sequence[Mapping[str, Any]],
                 runs: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """Markdown: the synthetic sink task beside Table 4, and where the small scale disagrees."""
    lines = [
        "## Attention sink on the synthetic task, beside Table 4", "",
        "F-Attn: attention on BOS (all queries but BOS; split into other and trigger "
        "queries); sink heads: share of heads with F-Attn above 0.3 at other queries; BOS "
        "ratio: the last layer's output norm at BOS over its mean elsewhere; gate: mean score "
        "at trigger / other queries; acc: accuracy of the copy at triggers; excess: bigram "
        "loss above the chain's entropy (nats). Mean (± standard error) over seeds.", "",
        "| run | seeds | F-Attn | paper F-Attn | F-Attn other / trigger | sink heads | BOS ratio "
        "| M-Act | paper M-Act | gate trigger / other | paper gate | acc | excess |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in groups:
        lines.append(
            f"| {g['label']} | {g['seeds']} | {_pm(g, 'f_attn')} | {_fmt(g['paper_f_attn'])} "
            f"| {_fmt(g.get('f_attn_other'))} / {_fmt(g.get('f_attn_trigger'))} "
            f"| {_fmt(g.get('sink_heads'), 2)} | {_fmt(g.get('bos_ratio'), 2)} "
            f"| {_fmt(g.get('m_act'), 2)} | {_fmt(g['paper_m_act'])} "
            f"| {_fmt(g.get('gate_trigger'))} / {_fmt(g.get('gate_other'))} "
            f"| {_fmt(g['paper_gate'])} | {_fmt(g.get('trigger_acc'))} "
            f"| {_fmt(g.get('bigram_excess'))} |")
    cmp = sink_comparison(groups, runs)
    lines.append("")
    if cmp["spearman"] is None:
        lines.append(f"Spearman's rho of F-Attn against Table 4: needs at least 3 of its rows "
                     f"(have {cmp['rows']}).")
    else:
        lines.append(f"Spearman's rho of F-Attn against Table 4: **{cmp['spearman']:.2f}** over "
                     f"{cmp['rows']} rows.")
        if cmp["bootstrap"] is not None:
            lines.append("Over the seeds every row holds: "
                         + rank_stats.spearman_text(cmp["bootstrap"], "Table 4 rows"))
    if not cmp["baseline"] or cmp["rows"] < 2:
        lines.append("Which variants remove the sink needs a baseline run and another Table 4 "
                     "row.")
    elif not cmp["disagree"]:
        lines.append("Every Table 4 row we ran agrees with the paper on whether the sink is "
                     f"removed (F-Attn below {SINK_FREE_SHARE:.2f} of the baseline's).")
    else:
        lines.append("Where the small scale disagrees with the paper on whether the sink is "
                     f"removed (F-Attn below {SINK_FREE_SHARE:.2f} of the baseline's):")
        lines += [f"- {d['label']}: ours {d['ratio']:.2f} of the baseline "
                  f"({'sink-free' if d['ours_sink_free'] else 'sink kept'}), paper "
                  f"{d['paper_ratio']:.2f} ({'sink kept' if d['ours_sink_free'] else 'sink-free'})"
                  for d in cmp["disagree"]]
    if cmp["m_act_up"]:
        lines.append("M-Act above the baseline's, where the paper's is below it: "
                     + ", ".join(cmp["m_act_up"]) + ".")
    return lines


def csv_text(rows: Sequence[Mapping[str, Any]]) -> str:
    fields = list(dict.fromkeys(k for row in rows for k in row))
    out = io.StringIO(newline="")
    writer = csv.DictWriter(out, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def write_csv(path: paths.PathLike, rows: Sequence[Mapping[str, Any]]) -> None:
    paths.write_atomic(path, csv_text(rows))


def summarize(root: paths.PathLike, reference: str | None = None) -> dict[str, Any]:
    """Write summary.md, summary.csv, runs.csv (and paired.csv, lr_sweep.csv where there is
    something to compare) under `root`; returns what they hold."""
    root = paths.resolve(root)
    if not root.is_dir():
        raise FileNotFoundError(f"grid root {root} does not exist")
    runs = discover_runs(root)
    if not runs:
        raise FileNotFoundError(f"{root} holds no runs.json and no run directories")
    tables = json.loads(grid_lib.PAPER_TABLES_FILE.read_text())
    rows = [run_row(root, name, run, tables) for name, run in runs.items()]
    groups = group_rows(rows)
    ranks = rankings(groups, rows)
    manifest = paths.read_json_current(root / "runs.json")
    comparisons.check_reference(groups, reference)
    text = markdown(root, manifest, groups, rows, ranks)
    paired = comparisons.paired_rows(rows, groups, reference)
    seq_lens = {r.get("seq_len") for r in rows if r.get("seq_len")}
    sink = comparisons.sink_check(rows, seq_lens.pop() if len(seq_lens) == 1 else None)
    sweeps = comparisons.lr_sweep(rows)
    extra = comparisons.paired_markdown(paired, sink)
    if any(g.get("f_attn") is not None for g in groups):
        extra += comparisons.sink_check_markdown(sink)
    extra += comparisons.lr_sweep_markdown(sweeps)
    if any(e["metric"] == "eval_loss" for e in paired):
        extra += comparisons.ladder(paired, (manifest or {}).get("scale"))
    if extra:
        text += "\n" + "\n".join(extra)
    if paired:
        write_csv(root / "paired.csv", [{k: v for k, v in e.items() if k != "digits"}
                                        for e in paired])
    if sweeps:
        write_csv(root / "lr_sweep.csv", [{"variant": s["variant"],
                                           **{k: v for k, v in p.items() if k != "by_seed"},
                                           "best": p is s["best"],
                                           "largest_stable": p is s["largest_stable"]}
                                          for s in sweeps for p in s["points"]])
    long_context = table5(root, runs, tables)
    if long_context:
        text += "\n".join(table5_markdown(long_context)) + "\n"
        write_csv(root / "table5.csv", long_context["rows"])
    paths.write_atomic(root / "summary.md", text)
    write_csv(root / "summary.csv", groups)
    write_csv(root / "runs.csv", rows)
    return {"groups": groups, "runs": rows, "rankings": ranks, "table5": long_context,
            "paired": paired, "sink_check": sink, "lr_sweep": sweeps}


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none); the grid's
    root (as given to run_grid --root) is the one positional argument."""
    flags.DEFINE_string("reference", None, "The row every other row is compared with (a group "
                        "name, label or variant; default: the baseline).",
                        flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    args = cli_flags.Command("experiments.summarize", __doc__, positional=("root",)).parse(
        define_flags(flags.FlagValues()), argv)
    try:
        result = summarize(args.root, args.reference)
    except (errors.UserError, FileNotFoundError) as err:
        errors.fail(err)
    print((paths.resolve(args.root) / "summary.md").read_text())
    pending = sum(r["state"] != "done" for r in result["runs"])
    if pending:
        print(f"({pending} run(s) not done are listed at the end of summary.md)")
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
