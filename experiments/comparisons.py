"""The summary's comparisons: paired differences to a reference row, LR sweeps, the ladder.

Rows of a grid are run groups (one per arch, variant and overrides; the seeds are its
members). `paired_tables` compares each group with its reference group seed by seed (the
seeds pair runs: grid_lib), `lr_sweep` reads a grid run with --lr_multipliers, `sink_check`
says whether the baseline formed a sink at all, and `LADDER` holds published small-scale
points a G1-vs-baseline loss change can be placed against.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import paired_stats
from gated_attention.analysis.sink_report import uniform_first_token
from gated_attention.core.errors import UserError

# (key in a run row, title, digits): the metrics compared pair by pair.
PAIRED_METRICS = (("eval_loss", "held-out loss", 4), ("ppl", "PPL", 3),
                  ("f_attn", "F-Attn", 3), ("f_attn_top", "F-Attn, top layer", 3),
                  ("sink_rate", "sink rate", 2),
                  ("m_act", "M-Act", 2), ("gate", "gate score", 3),
                  # the paper's benchmark columns (summarize.BENCHMARKS, percent), where run
                  ("hellaswag", "HellaSwag", 2), ("mmlu", "MMLU", 2), ("gsm8k", "GSM8k", 2),
                  ("ceval", "C-eval", 2))
BENCHMARK_KEYS = frozenset({"hellaswag", "mmlu", "gsm8k", "ceval"})  # only where measured
# Metrics read from analysis.json, or from the record's telemetry where a run has none
# (summarize.telemetry_metrics): a pair is only formed from two runs measured the same way.
SINK_KEYS = frozenset({"f_attn", "f_attn_top", "sink_rate", "m_act", "gate"})
MARK = " **\\***"  # a significant difference after Holm's correction
# A baseline formed a sink when its F-Attn is at least this many times the uniform level
# (uniform_first_token: query i of a causal row gives 1 / (i + 1) to the first token).
SINK_FACTOR = 3.0
# A learning rate is stable when the run finished with no non-finite step and its final
# held-out loss is within this share of the variant's best over the sweep.
STABLE_MARGIN = 0.02
LADDER_VARIANT = "g1_sdpa_elementwise"  # the published points' G1: elementwise, sigmoid
# Published G1-vs-baseline held-out loss changes at small scale (relative change; negative =
# the gate helps), each with its source and scale.
LADDER = (
    {"source": "marin speedruns (hackable transformer starter vs attn gate, lr x1)",
     "scale": "130M params (d512, 6 layers), about 3.1B tokens, fineweb-edu",
     "metric": "paloma c4_en bpb", "change": -0.0076},
    {"source": "marin speedruns (same pair)",
     "scale": "300M params (d768, 12 layers), about 6.1B tokens",
     "metric": "paloma c4_en bpb", "change": -0.0090},
    {"source": "the paper, Table 2 (PPL 7.499 -> 7.404)",
     "scale": "1.7B dense, 28 layers, 400B tokens", "metric": "loss", "change": -0.0063},
)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}g}" if abs(value) >= 1000 else f"{value:.{digits}f}"


def _p(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2g}" if value >= 1e-3 else f"{value:.0e}"


def find_reference(groups: Sequence[Mapping[str, Any]], group: Mapping[str, Any],
                   reference: str | None) -> Mapping[str, Any] | None:
    """The group `group` is compared with: `reference` (a group name, label or variant), or
    the group whose name is this one's with the variant replaced by "baseline", or the first
    baseline group. None for the reference itself."""
    if reference:
        for key in ("group", "label", "variant"):
            found = next((g for g in groups if g.get(key) == reference), None)
            if found is not None:
                return None if found is group else found
        return None
    if group.get("variant") == "baseline" and not group.get("lr_multiplier"):
        return None
    variant = group.get("variant") or ""
    twin = re.sub(rf"(^|-){re.escape(variant)}(-|$)", r"\1baseline\2", group["group"])
    found = next((g for g in groups if g["group"] == twin), None)
    if found is None:
        found = next((g for g in groups if g.get("variant") == "baseline"), None)
    return None if found is group else found


def check_reference(groups: Sequence[Mapping[str, Any]], reference: str | None) -> None:
    if reference and not any(reference in (g.get("group"), g.get("label"), g.get("variant"))
                             for g in groups):
        raise UserError(f"--reference={reference!r} names no row; rows: "
                        + ", ".join(g["group"] for g in groups))


def _finite(value: Any) -> bool:
    return value is not None and math.isfinite(float(value))


def _pair(mine: Mapping[str, Any] | None, theirs: Mapping[str, Any] | None,
          key: str) -> str | None:
    """How one seed's two runs enter a comparison of `key`: "pair" (both done, both
    measured and finite, the sink metrics from the same source), "failed" (either run failed,
    or finished with a non-finite value: a diverged run counts against the row), or None
    (not run yet, or not measured the same way: not part of the row)."""
    if mine is None or theirs is None:
        return None
    if "failed" in (mine["state"], theirs["state"]):
        return "failed"
    if mine["state"] != "done" or theirs["state"] != "done":
        return None
    values = (mine.get(key), theirs.get(key))
    if None in values:
        return None
    if not all(_finite(v) for v in values):
        return "failed"
    if key in SINK_KEYS and mine.get("sink_source") != theirs.get("sink_source"):
        return None
    return "pair"


def paired_rows(rows: Sequence[Mapping[str, Any]], groups: Sequence[Mapping[str, Any]],
                reference: str | None = None) -> list[dict[str, Any]]:
    """One entry per (group, metric): the paired difference to its reference over the seeds
    both ran (for the sink metrics, the seeds where both have them from the same source),
    with Holm's correction over the groups of each metric. A seed where either run failed or
    ended non-finite is in `failed_seeds` and counts in the entry's `failed`: the row says
    "k of n failed", and its statistics come from the others."""
    by_group: dict[str, dict[Any, Mapping[str, Any]]] = {}
    for r in rows:
        by_group.setdefault(r["group"], {})[r["seed"]] = r
    out = []
    for key, title, digits in PAIRED_METRICS:
        entries = []
        for g in groups:
            ref = find_reference(groups, g, reference)
            if ref is None:
                continue
            mine, theirs = by_group.get(g["group"], {}), by_group.get(ref["group"], {})
            kinds = {s: _pair(mine.get(s), theirs.get(s), key)
                     for s in sorted(set(mine) | set(theirs))}
            seeds = [s for s, kind in kinds.items() if kind == "pair"]
            failed = [s for s, kind in kinds.items() if kind == "failed"]
            if not seeds and (not failed or key in BENCHMARK_KEYS):
                continue
            diffs = [float(mine[s][key]) - float(theirs[s][key]) for s in seeds]
            result = paired_stats.paired(diffs + [None] * len(failed))
            entries.append({
                "metric": key, "title": title, "digits": digits, "group": g["group"],
                "label": g["label"], "variant": g.get("variant"),
                "lr_multiplier": g.get("lr_multiplier"), "reference": ref["group"],
                "reference_label": ref["label"], "reference_variant": ref.get("variant"),
                "reference_lr_multiplier": ref.get("lr_multiplier"),
                "seeds": seeds, "failed_seeds": failed, "n": result.n,
                "failed": result.failed,
                "reference_mean": (statistics.fmean(float(theirs[s][key]) for s in seeds)
                                   if seeds else None),
                "row_mean": (statistics.fmean(float(mine[s][key]) for s in seeds)
                             if seeds else None),
                "diff": result.mean, "se": result.se, "low": result.low, "high": result.high,
                "degenerate": result.degenerate, "p_t": result.p_t,
                "p_sign_flip": result.p_sign_flip, "p": result.p,
                "seeds_needed": result.seeds_needed, "seeds_range": result.seeds_range,
            })
        for entry, adjusted in zip(entries, paired_stats.holm([e["p"] for e in entries])):
            entry["p_holm"] = adjusted
            entry["significant"] = adjusted is not None and adjusted < paired_stats.ALPHA
        out += entries
    return out


def seeds_text(entry: Mapping[str, Any]) -> str:
    """The seeds a comparison holds, and those it lost: "0, 1, 2" or "0, 2 (1 of 3 failed:
    1)"."""
    held = ", ".join(map(str, entry["seeds"])) or "none"
    failed = entry.get("failed_seeds") or []
    if not failed:
        return held
    total = len(entry["seeds"]) + len(failed)
    return (f"{held} ({len(failed)} of {total} failed or non-finite: "
            f"{', '.join(map(str, failed))})")


def interval_text(entry: Mapping[str, Any], digits: int) -> str:
    """The 95% interval, or why there is none."""
    if entry.get("degenerate"):
        return f"degenerate: all {entry['n']} differences equal"
    if entry["low"] is None:
        return "- (one seed)" if entry["n"] == 1 else "-"
    return f"[{_fmt(entry['low'], digits)}, {_fmt(entry['high'], digits)}]"


def paired_markdown(entries: Sequence[Mapping[str, Any]],
                    sink: Mapping[str, Any] | None = None) -> list[str]:
    if not entries:
        return []
    lines = [
        "## Paired differences to the reference row", "",
        "Each row minus its reference, seed by seed (the same seed gives both runs the same "
        "data and the same initial shared weights). seeds: the seeds paired, and any where "
        "either run failed or ended non-finite (counted, not dropped; the statistics come "
        "from the others). diff: mean over the paired seeds; 95% CI: Student t with n - 1 "
        "degrees of freedom (degenerate when every seed gave the same difference: no spread, "
        "no t); p (t): paired t-test, two-sided; p (flip): exact sign-flip permutation test, "
        "two-sided (its floor is 2 / 2^n: 0.25 at 3 seeds, the row's test where the t-test is "
        "degenerate); Holm: the row's p after Holm's correction over the rows of that metric's "
        "table; **\\*** marks a difference significant at 5% after it. seeds for 80%: pairs a "
        "paired t-test would need to detect the observed mean difference at the observed "
        "spread with 80% power, and in brackets its range over the 95% chi-square interval of "
        "that spread (given where the difference is not significant).", ""]
    for key, title, _ in PAIRED_METRICS:
        mine = [e for e in entries if e["metric"] == key]
        if not mine:
            continue
        lines += [f"### {title}", "",
                  "| row | reference | seeds | reference mean | row mean | diff ± se | 95% CI "
                  "| p (t) | p (flip) | Holm | seeds for 80% |",
                  "|---|---|---|---|---|---|---|---|---|---|---|"]
        for e in mine:
            d = e["digits"] + 1
            se = "" if not e["se"] else f" ± {_fmt(e['se'], d)}"
            need_text = ("-" if e["significant"] or e["p"] is None or e["degenerate"]
                         else paired_stats.range_text(e["seeds_needed"], e["seeds_range"]))
            lines.append(
                f"| {e['label']} | {e['reference_label']} | {seeds_text(e)} "
                f"| {_fmt(e['reference_mean'], e['digits'])} | {_fmt(e['row_mean'], e['digits'])} "
                f"| {_fmt(e['diff'], d)}{se} | {interval_text(e, d)} | {_p(e['p_t'])} "
                f"| {_p(e['p_sign_flip'])} "
                f"| {_p(e.get('p_holm'))}{MARK if e['significant'] else ''} "
                f"| {need_text} |")
        if key in ("f_attn", "sink_rate") and sink is not None and sink.get("checked"):
            if sink["formed"] < sink["checked"]:
                lines += ["", f"Read with care: the baseline formed a sink in "
                          f"{sink['formed']} of {sink['checked']} seeds (see below); a "
                          "difference in the sink is only a cure where there was a sink."]
        lines.append("")
    return lines


def sink_check(rows: Sequence[Mapping[str, Any]], seq_len: int | None) -> dict[str, Any]:
    """Per seed: did the baseline form a sink (F-Attn >= SINK_FACTOR x uniform)? F-Attn is
    analysis' where the run was analysed, else its record's last telemetry point (summarize).
    A telemetry point is judged against the uniform level of its own batch where the record
    has it (f_attn_uniform: packed documents restart the causal rows and raise it), else,
    like analysis, against one unbroken `seq_len`-token row. The same test on the largest
    layer's F-Attn (f_attn_top, where measured) catches a sink that lives in one layer, which
    the mean over layers dilutes by the depth: `formed_top`, `no_sink_top`, `ratios_top`."""
    base = sorted((r for r in rows if r["state"] == "done" and r.get("variant") == "baseline"
                   and r.get("f_attn") is not None and not r.get("lr_multiplier")),
                  key=lambda r: r["run"])  # listed in name order
    own = {r["run"]: r["f_attn_uniform"] for r in base
           if r.get("sink_source") == "telemetry" and r.get("f_attn_uniform")}
    if not seq_len and not (base and len(own) == len(base)):
        return {"checked": 0}
    uniform = uniform_first_token(seq_len) if seq_len else None
    level = {r["run"]: own.get(r["run"], uniform) for r in base}
    missing = [r["run"] for r in base if r["f_attn"] < SINK_FACTOR * level[r["run"]]]
    top = [r for r in base if r.get("f_attn_top") is not None]
    return {"checked": len(base), "formed": len(base) - len(missing), "uniform": uniform,
            "factor": SINK_FACTOR, "seq_len": seq_len, "no_sink": missing,
            "ratios": {r["run"]: r["f_attn"] / level[r["run"]] for r in base},
            "checked_top": len(top),
            "formed_top": sum(r["f_attn_top"] >= SINK_FACTOR * level[r["run"]] for r in top),
            "no_sink_top": [r["run"] for r in top
                            if r["f_attn_top"] < SINK_FACTOR * level[r["run"]]],
            "ratios_top": {r["run"]: r["f_attn_top"] / level[r["run"]] for r in top},
            "own_uniform": own,
            "telemetry": {r["run"]: r.get("sink_step") for r in base
                          if r.get("sink_source") == "telemetry"}}


def sink_check_top_text(check: Mapping[str, Any]) -> str:
    """One sentence on the largest-layer check, with each run's multiple of uniform; empty
    where no run measured per-layer F-Attn."""
    if not check.get("checked_top"):
        return ""
    ratios = ", ".join(f"`{k}` {v:.1f}x" for k, v in check["ratios_top"].items())
    return (f"In its largest layer (that layer's F-Attn against the same level) the baseline "
            f"formed a sink in {check['formed_top']} of {check['checked_top']} runs "
            f"({ratios}).")


def sink_check_markdown(check: Mapping[str, Any]) -> list[str]:
    if not check.get("checked"):
        return []
    own = check.get("own_uniform") or {}
    head = (f"Did the baseline form a sink? Uniform causal attention puts "
            f"{check['uniform']:.3f} on the first token (mean of 1/(i+1) over the queries of a "
            f"{check['seq_len']}-token row)" if check.get("uniform") else
            "Did the baseline form a sink? Uniform causal attention puts 1/(i+1) on the "
            "first token at query i")
    if own:
        head += ("; a telemetry point is judged against the uniform level of its own batch, "
                 "packed documents counted")
    head += f"; a sink is claimed at {check['factor']:g}x that. "
    telemetry = check.get("telemetry") or {}

    def where(run: str) -> str:
        if run not in telemetry:
            return ""
        return (f" (telemetry, step {telemetry[run]}"
                + (f", uniform {own[run]:.3f}" if run in own else "") + ")")

    ratios = ", ".join(f"`{k}` {v:.1f}x" + where(k) for k, v in check["ratios"].items())
    top = sink_check_top_text(check)
    if check["no_sink"]:
        return ["## Baseline sink check", "", head + f"**The baseline formed no sink in "
                f"{len(check['no_sink'])} of {check['checked']} runs** "
                f"({', '.join(f'`{r}`' for r in check['no_sink'])}): a sink result on those "
                f"seeds says nothing about a cure. Per run: {ratios}." + (" " + top if top
                                                                           else ""), ""]
    return ["## Baseline sink check", "", head + f"It did in all {check['checked']} runs "
            f"({ratios})." + (" " + top if top else ""), ""]


def _at_recipe_lr(multiplier: float | None) -> bool:
    """The published points ran at their recipe's learning rate: no sweep, or its x1 row."""
    return multiplier is None or float(multiplier) == 1.0


def ladder_entries(entries: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The paired held-out loss entries comparable with LADDER: exactly the G1 elementwise
    sigmoid variant (not G1 with SiLU or another gate whose name starts the same) against
    the baseline, both at the recipe's learning rate (an LR sweep's other multipliers would
    measure the learning rate, not the gate)."""
    return [e for e in entries if e["metric"] == "eval_loss" and e["reference_mean"]
            and e.get("variant") == LADDER_VARIANT and e.get("reference_variant") == "baseline"
            and _at_recipe_lr(e.get("lr_multiplier"))
            and _at_recipe_lr(e.get("reference_lr_multiplier"))]


def ladder(entries: Sequence[Mapping[str, Any]], scale: str | None) -> list[str]:
    """G1-vs-baseline held-out loss change of this grid beside the published points."""
    ours = ladder_entries(entries)
    lines = ["## Reference ladder: G1 (elementwise, sigmoid) against its baseline", "",
             "| source | scale | metric | change |", "|---|---|---|---|"]
    for point in LADDER:
        lines.append(f"| {point['source']} | {point['scale']} | {point['metric']} "
                     f"| {100 * point['change']:+.2f}% |")
    for e in ours:
        seeds = f"{e['n']} seed{'s' if e['n'] != 1 else ''}"
        if e["low"] is None:  # one seed, or no spread: an effect size with nothing to judge it
            change = ("not placed beside the published changes: "
                      + ("one seed has no interval" if e["n"] < 2 else
                         "every seed gave the same difference, no interval")
                      + " (the value is in paired.csv); run more seeds")
        else:
            rel = e["diff"] / e["reference_mean"]
            change = (f"{100 * rel:+.2f}% (95% CI {100 * e['low'] / e['reference_mean']:+.2f}% "
                      f"to {100 * e['high'] / e['reference_mean']:+.2f}%)")
        lines.append(f"| this grid: {e['label']} vs {e['reference_label']}, {seeds} "
                     f"| {scale or '-'} | held-out loss | {change} |")
    if not ours:
        lines.append(f"| this grid | - | held-out loss | no {LADDER_VARIANT} row paired with the "
                     "baseline at the recipe's learning rate |")
    return lines + [""]


def lr_sweep(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per variant of a learning-rate sweep: each rate's mean final held-out loss (train loss
    where a run evaluated nothing), its best rate, and its largest stable one."""
    swept = [r for r in rows if r.get("lr_multiplier") is not None]
    out = []
    for base_label in dict.fromkeys(re.sub(r" lr x[^ ]+$", "", r["label"]) for r in swept):
        members = [r for r in swept if re.sub(r" lr x[^ ]+$", "", r["label"]) == base_label]
        points = []
        for m in sorted({r["lr_multiplier"] for r in members}):
            runs = [r for r in members if r["lr_multiplier"] == m]
            done = [r for r in runs if r["state"] == "done"]
            losses = [r.get("eval_loss", r.get("train_loss")) for r in done]
            nonfinite = sum(x is not None and not _finite(x) for x in losses)
            losses = [float(x) for x in losses if _finite(x)]
            points.append({
                "multiplier": m, "peak_lr": runs[0].get("peak_lr"), "runs": len(runs),
                # seed -> final loss; None where the run failed or ended non-finite
                "by_seed": {r["seed"]: (float(r.get("eval_loss", r.get("train_loss")))
                                        if r["state"] == "done"
                                        and _finite(r.get("eval_loss", r.get("train_loss")))
                                        else None) for r in runs},
                "finished": len(done), "nonfinite_final": nonfinite,
                "seeds": sorted(r["seed"] for r in done),
                "nonfinite_steps": sum(r.get("skipped") or 0 for r in runs),
                "failed": len(runs) - len(done),
                "spikes": [r.get("spikes") for r in runs],
                "loss": statistics.fmean(losses) if losses else None,
                "loss_std": statistics.stdev(losses) if len(losses) > 1 else None,
            })
        finite = [p for p in points if p["loss"] is not None]
        best = min(finite, key=lambda p: p["loss"]) if finite else None
        stable = [p for p in finite if p["failed"] == 0 and p["nonfinite_steps"] == 0
                  and p["nonfinite_final"] == 0
                  and p["loss"] <= best["loss"] * (1 + STABLE_MARGIN)]
        largest = max(stable, key=lambda p: p["multiplier"]) if stable else None
        out.append({"variant": base_label, "points": points, "best": best,
                    "largest_stable": largest})
    return out


def lr_sweep_paired(sweeps: Sequence[Mapping[str, Any]], reference: str = "baseline"
                    ) -> list[dict[str, Any]]:
    """Per swept variant and learning rate: its final loss minus the reference's at the same
    rate, paired over the seeds both ran (paired_stats.paired: a failed or non-finite run on
    either side is a failure of the pair, counted, never dropped)."""
    base = next((s for s in sweeps if s["variant"] == reference), None)
    if base is None:
        return []
    base_points = {p["multiplier"]: p["by_seed"] for p in base["points"]}
    out = []
    for s in sweeps:
        if s is base:
            continue
        for p in s["points"]:
            theirs = base_points.get(p["multiplier"])
            if theirs is None:
                continue
            seeds = sorted(set(p["by_seed"]) & set(theirs))
            diffs = [None if p["by_seed"][k] is None or theirs[k] is None
                     else p["by_seed"][k] - theirs[k] for k in seeds]
            out.append({"variant": s["variant"], "multiplier": p["multiplier"],
                        "seeds": seeds, "stats": paired_stats.paired(diffs)})
    return out


def lr_paired_cell(stats: paired_stats.Paired) -> str:
    """A paired loss difference as text: mean [95% CI], p; or why there is no interval."""
    failed = (f", {stats.failed} of {stats.n + stats.failed} pairs failed"
              if stats.failed else "")
    if stats.mean is None:
        return f"- (no finite pair){failed}"
    if stats.degenerate:
        return (f"{stats.mean:+.4f} (all {stats.n} seeds equal: no interval), p (exact "
                f"sign-flip) {stats.p:.2g}{failed}")
    if stats.low is None:
        return f"{stats.mean:+.4f} (one seed: no interval, no test){failed}"
    return (f"{stats.mean:+.4f} [{stats.low:+.4f}, {stats.high:+.4f}], p "
            f"{stats.p:.2g}{failed}")


def lr_sweep_markdown(sweeps: Sequence[Mapping[str, Any]]) -> list[str]:
    if not sweeps:
        return []
    lines = ["## Learning-rate sweep", "",
             "Per variant: the recipe's peak (and final) learning rate times each multiplier. "
             "loss: final held-out loss, mean ± std over seeds (train loss where a run had no "
             "evaluation). Stable: every run finished with no non-finite step and the loss is "
             f"within {100 * STABLE_MARGIN:g}% of the variant's best. Spikes: the training "
             "loss's spike detector (metrics_writer.SpikeDetector) per run.", "",
             "| variant | best loss (at lr) | largest stable lr |", "|---|---|---|"]
    for s in sweeps:
        best, big = s["best"], s["largest_stable"]
        lines.append(f"| {s['variant']} | "
                     + ("-" if best is None else
                        f"{_fmt(best['loss'], 4)} (x{best['multiplier']:g} = "
                        f"{_fmt(best['peak_lr'], 3)})")
                     + " | " + ("none" if big is None else
                                f"x{big['multiplier']:g} = {_fmt(big['peak_lr'], 3)}") + " |")
    lines += ["", "| variant | lr x | peak lr | runs done (seeds) | non-finite steps "
              "| spikes per run | loss |", "|---|---|---|---|---|---|---|"]
    for s in sweeps:
        for p in s["points"]:
            spikes = ", ".join("-" if x is None else str(int(x)) for x in p["spikes"])
            std = "" if p["loss_std"] is None else f" ± {_fmt(p['loss_std'], 3)}"
            lines.append(f"| {s['variant']} | {p['multiplier']:g} | {_fmt(p['peak_lr'], 3)} "
                         f"| {p['finished']}/{p['runs']} ({', '.join(map(str, p['seeds']))})"
                         + (f", {p['nonfinite_final']} ended non-finite"
                            if p["nonfinite_final"] else "")
                         + f" | {p['nonfinite_steps']} | {spikes} "
                         f"| {_fmt(p['loss'], 4)}{std} |")
    paired = lr_sweep_paired(sweeps)
    if paired:
        lines += ["", "Paired with the baseline at the same learning rate over the seeds both "
                  "ran (final loss minus the baseline's; 95% Student t interval; p: paired "
                  "t-test, two-sided, or the exact sign-flip p where every seed gave the same "
                  "difference):", "",
                  "| variant | lr x | seeds | loss minus baseline [95% CI], p |",
                  "|---|---|---|---|"]
        lines += [f"| {e['variant']} | {e['multiplier']:g} | "
                  f"{', '.join(map(str, e['seeds']))} | {lr_paired_cell(e['stats'])} |"
                  for e in paired]
    return lines + [""]
