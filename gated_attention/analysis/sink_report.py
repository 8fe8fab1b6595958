"""The attention sink forming on a synthetic task, and the gate keeping it away: the second
half of `make demo` (gated_attention.demo runs it; docs/sinks.md explains the task).

On text at CPU scale no sink forms in the baseline, so the demo also trains `sink_tiny`
(baseline and G1 elementwise) on Bigram-Backcopy (configs/sinks.py), saving a checkpoint
every tenth of the run, and measures every checkpoint with analysis.backcopy: F-Attn per layer
over training, trigger accuracy, gate scores at trigger and other queries, attention maps with
the BOS column, the BOS residual.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Mapping
from typing import Any

import numpy as np

SINK_VARIANTS = ("baseline", "g1_sdpa_elementwise")
CONFIG_FILE = "configs/sinks.py"
CHECKPOINTS = 10  # measured points over training (plus the start, step 0, is not saved)
MEASURE_BATCHES = 2


def sink_overrides(steps: int, batch_size: int) -> dict[str, Any]:
    """configs/sinks.py's recipe at the demo's length, with a checkpoint every tenth."""
    every = max(1, steps // CHECKPOINTS)
    return {"train.steps": steps, "train.batch_size": batch_size,
            "optimizer.warmup_steps": max(1, steps // 10), "train.checkpoint_every": every,
            "train.keep_checkpoints": CHECKPOINTS + 1, "train.eval_every": steps,
            "train.log_every": every}


def _checkpoint_steps(run_dir: pathlib.Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def analyze(workdir: pathlib.Path) -> dict[str, dict[str, Any]]:
    """Task metrics of every checkpoint of both runs, and attention maps of the last."""
    from gated_attention.analysis import backcopy, stats
    from gated_attention.data.synthetic import bigram_backcopy
    from gated_attention.training import loop

    results: dict[str, dict[str, Any]] = {}
    for variant in SINK_VARIANTS:
        run_dir = workdir / variant
        over_steps = []
        for step in _checkpoint_steps(run_dir):
            model, config = loop.load_params(run_dir, step=step)
            chain = bigram_backcopy.chain_from_config(config.data, config.model.vocab_size)
            batches = bigram_backcopy.eval_batches(chain, config.data.seq_len, 32,
                                                   MEASURE_BATCHES, seed=config.data.shuffle_seed)
            task = backcopy.task_statistics(model, chain, batches)
            over_steps.append({"step": step, **task})
        final = over_steps[-1]
        ids, labels = backcopy.example_sequence(chain, 24)
        maps = stats.attention_maps(model, ids)
        held = stats.model_statistics(model, batches)
        results[variant] = {"over_steps": over_steps, "final": final, "labels": labels,
                            "maps": maps.tolist(), "massive_activation":
                            held["massive_activation"], "seq_len": int(config.data.seq_len)}
    (workdir / "stats.json").write_text(json.dumps(
        {v: {k: r[k] for k in r if k != "maps"} for v, r in results.items()}, indent=1) + "\n")
    return results


def plot_f_attn_over_steps(results: Mapping[str, Mapping[str, Any]], path: pathlib.Path,
                           uniform: float) -> str:
    """F-Attn per layer (other queries) and trigger accuracy over training, both models."""
    from gated_attention.analysis.plots import LAYER_STYLES, layer_legend, new_figure, save

    fig = new_figure((11, 4))
    ax, acc = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    layers = 0
    for i, (variant, r) in enumerate(results.items()):
        steps = [p["step"] for p in r["over_steps"]]
        per_layer = np.asarray([p["f_attn_other_per_layer"] for p in r["over_steps"]])
        layers = max(layers, per_layer.shape[1])
        for layer in range(per_layer.shape[1]):
            ax.plot(steps, per_layer[:, layer], color=f"C{i}", marker="o", markersize=3,
                    linestyle=LAYER_STYLES[layer % len(LAYER_STYLES)],
                    label=f"{variant}, layer {layer}")
        acc.plot(steps, [p["trigger_accuracy"] for p in r["over_steps"]], color=f"C{i}",
                 marker="o", markersize=3, label=variant)
    ax.axhline(uniform, color="grey", linewidth=0.8, linestyle=":")
    ax.text(0.99, uniform, " uniform attention", color="grey", fontsize=7, ha="right",
            va="bottom", transform=ax.get_yaxis_transform())
    ax.set(xlabel="training step", ylabel="attention on BOS", ylim=(-0.02, 1.02),
           title="the sink: attention on BOS at non-trigger queries")
    acc.set(xlabel="training step", ylabel="accuracy", ylim=(-0.02, 1.02),
            title="the task: copy accuracy at triggers")
    layer_legend(ax, list(results), layers, loc="upper left")
    acc.legend(fontsize=7)
    for a in (ax, acc):
        a.grid(alpha=0.3)
    return save(fig, path)


def plot_gate_scores(final: Mapping[str, Any], path: pathlib.Path, variant: str) -> str:
    """Gate score per layer at trigger queries against the other queries (one gated model)."""
    from gated_attention.analysis.plots import new_figure, save

    trig, other = final["gate_trigger_per_layer"], final["gate_other_per_layer"]
    layers = np.arange(len(trig))
    fig = new_figure((6, 4))
    ax = fig.subplots()
    ax.bar(layers - 0.2, trig, width=0.4, label="trigger queries (the head must copy)")
    ax.bar(layers + 0.2, other, width=0.4, label="other queries (the head must do nothing)")
    for x, (t, o) in enumerate(zip(trig, other, strict=True)):
        ax.text(x - 0.2, t, f"{t:.2f}", ha="center", va="bottom", fontsize=8)
        ax.text(x + 0.2, o, f"{o:.3f}", ha="center", va="bottom", fontsize=8)
    ax.set(xticks=layers, xlabel="layer", ylabel="mean gate score", ylim=(0, 1.1),
           title=f"{variant}: open at triggers, shut elsewhere")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    return save(fig, path)


def plot_maps(results: Mapping[str, Mapping[str, Any]], path: pathlib.Path) -> str:
    from gated_attention.analysis import plots

    maps = {v: np.asarray(r["maps"]) for v, r in results.items()}
    layers = list(range(next(iter(maps.values())).shape[0]))
    labels = next(iter(results.values()))["labels"]
    return plots.plot_attention_map(
        maps, path, layers, tokens=labels,
        title="head-averaged attention (rows: queries; column 0: BOS; T = trigger)")


def uniform_first_token(seq_len: int) -> float:
    """F-Attn of uniform causal attention, query 0 excluded: mean of 1/(q+1), q = 1..S-1."""
    return sum(1.0 / i for i in range(2, seq_len + 1)) / (seq_len - 1)


def gate_rows(base: Mapping[str, Any], gated: Mapping[str, Any]) -> list[str]:
    """Table rows of the gate score at trigger / other queries, one per layer: a mean over
    layers would mix a layer whose gate opens to copy (about 0.8) with one that stays shut
    (about 0.03) into a number neither has."""
    def cell(r: Mapping[str, Any], layer: int) -> str:
        trig, other = r["gate_trigger_per_layer"], r["gate_other_per_layer"]
        return "-" if not trig else f"{trig[layer]:.3f} / {other[layer]:.3f}"

    return [f"| gate score at trigger / other queries, layer {layer} | {cell(base, layer)} | "
            f"{cell(gated, layer)} |" for layer in range(len(gated["gate_trigger_per_layer"]))]


def gate_per_layer(final: Mapping[str, Any]) -> str:
    """'layer 0: 0.04 at triggers, 0.006 elsewhere; layer 1: ...' of one gated model."""
    return "; ".join(f"layer {i}: {t:.2f} at triggers, {o:.3f} elsewhere"
                     for i, (t, o) in enumerate(zip(final["gate_trigger_per_layer"],
                                                    final["gate_other_per_layer"], strict=True)))


def report_lines(workdir: pathlib.Path, results: Mapping[str, Mapping[str, Any]],
                 overrides: Mapping[str, Any], folder: str) -> list[str]:
    """Plots into workdir and the report's markdown section (links relative to `folder`'s
    parent)."""
    base, gated = (results[v] for v in SINK_VARIANTS)
    uniform = uniform_first_token(base["seq_len"])
    plot_f_attn_over_steps(results, workdir / "f_attn_over_steps.png", uniform)
    plot_maps(results, workdir / "attention_maps.png")
    plot_gate_scores(gated["final"], workdir / "gate_scores.png", SINK_VARIANTS[1])
    b, g = base["final"], gated["final"]

    def row(name: str, key: str, fmt: str, source: str = "final") -> str:
        cells = []
        for r in (base, gated):
            value = r[source][key] if source == "final" else r[key]
            cells.append("-" if value is None else format(value, fmt))
        return f"| {name} | {cells[0]} | {cells[1]} |"

    formed = b["f_attn_other"] > 3 * uniform
    removed = g["f_attn_other"] < 2 * uniform
    steps, batch = overrides["train.steps"], overrides["train.batch_size"]
    return [
        "## The attention sink, on a synthetic task",
        "",
        f"`sink_tiny` (2 layers of one head, d_model 64) trained {steps} steps x {batch} "
        f"sequences of {base['seq_len']} tokens on Bigram-Backcopy: BOS, then a random bigram "
        "chain over 64 tokens, except that after one of 3 trigger tokens the next token "
        "copies the one before the trigger. A head is useful only at triggers; elsewhere a "
        "softmax head must do nothing, and it does so by attending to BOS: the sink "
        "(docs/sinks.md). Measured on held-out sequences at every checkpoint.",
        "",
        "| metric | baseline | G1 elementwise |",
        "|---|---|---|",
        row("attention on BOS, all queries (F-Attn)", "f_attn_all", ".3f"),
        row("... at non-trigger queries", "f_attn_other", ".3f"),
        row("... at trigger queries", "f_attn_trigger", ".3f"),
        row("sink heads (F-Attn > 0.3 at non-trigger queries)", "sink_head_share", ".2f"),
        row("BOS residual norm / other tokens' (last layer)", "bos_residual_ratio", ".2f"),
        row("max abs layer output (M-Act)", "massive_activation", ".2f", "top"),
        *gate_rows(b, g),
        row("copy accuracy at triggers", "trigger_accuracy", ".3f"),
        row("bigram loss above the chain's entropy (nats)", "bigram_excess_loss", ".3f"),
        "",
        f"Uniform causal attention would put {uniform:.3f} on BOS.",
        "",
        f"![F-Attn over training]({folder}/f_attn_over_steps.png)",
        f"![attention maps]({folder}/attention_maps.png)",
        f"![gate scores]({folder}/gate_scores.png)",
        "",
        "- Sink: " + (
            f"the baseline's non-trigger queries put {b['f_attn_other']:.2f} of their "
            "attention on BOS: a sink formed." if formed else
            f"the baseline puts only {b['f_attn_other']:.2f} on BOS at non-trigger queries: "
            "no clear sink formed in this run (it needs about 1,000 steps at lr 1e-2; "
            "docs/sinks.md)."),
        "- Gate: " + (
            f"with the G1 gate the same queries put {g['f_attn_other']:.3f} on BOS; the gate "
            f"does the head's \"nothing\" instead (mean gate score {gate_per_layer(g)})."
            if formed and removed else
            f"the G1 model still puts {g['f_attn_other']:.3f} on BOS at non-trigger queries."
            if not removed else
            f"the G1 model puts {g['f_attn_other']:.3f} on BOS at non-trigger queries, but "
            "with no sink in the baseline there was none to remove."),
        f"- Both models learn the task: copy accuracy {b['trigger_accuracy']:.2f} / "
        f"{g['trigger_accuracy']:.2f}.",
        "",
    ]
