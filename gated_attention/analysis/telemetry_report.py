"""Sink-emergence curves from the telemetry of runs (train.telemetry_every).

Reads each run's metrics.jsonl records of kind "telemetry" (training/telemetry.py) and
draws, per run, F-Attn of every layer against the training step, with the level uniform
attention gives; says at which step (and after how many tokens) each layer's F-Attn first
reached SINK_FACTOR x that level. The demo's report and docs/sinks.md use it.
"""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

from gated_attention.analysis.sink_report import uniform_first_token

SINK_FACTOR = 3.0  # as experiments/comparisons.py: a sink is claimed at 3x uniform


def telemetry_points(run_dir: pathlib.Path) -> list[dict[str, Any]]:
    from gated_attention.training.metrics_writer import read_jsonl

    return [r for r in read_jsonl(run_dir / "metrics.jsonl", torn_tail="drop")
            if r.get("kind") == "telemetry"]


def uniform_level(points: Sequence[Mapping[str, Any]], seq_len: int) -> float:
    """The uniform-attention F-Attn the points were measured against: the mean of their own
    `f_attn_uniform` (the rows' segment layout) where they record it, else the whole row's."""
    levels = [p["f_attn_uniform"] for p in points if p.get("f_attn_uniform") is not None]
    return sum(levels) / len(levels) if levels else uniform_first_token(seq_len)


def emergence(points: Sequence[Mapping[str, Any]], uniform: float) -> list[int | None]:
    """Per layer: the first telemetry step whose F-Attn is >= SINK_FACTOR x uniform."""
    if not points:
        return []
    layers = len(points[0]["f_attn_per_layer"])
    return [next((p["step"] for p in points if p["f_attn_per_layer"][i] is not None
                  and p["f_attn_per_layer"][i] >= SINK_FACTOR * uniform), None)
            for i in range(layers)]


def plot(runs: Mapping[str, Sequence[Mapping[str, Any]]], path: pathlib.Path,
         uniform: float) -> None:
    from gated_attention.analysis.plots import LAYER_STYLES, layer_legend, new_figure, save

    fig = new_figure((7, 4))
    ax = fig.subplots()
    layers = 0
    for colour, (label, points) in enumerate(runs.items()):
        if not points:
            continue
        steps = [p["step"] for p in points]
        layers = max(layers, len(points[0]["f_attn_per_layer"]))
        for layer in range(len(points[0]["f_attn_per_layer"])):
            ax.plot(steps, [p["f_attn_per_layer"][layer] for p in points], marker="o",
                    markersize=3, color=f"C{colour}",
                    linestyle=LAYER_STYLES[layer % len(LAYER_STYLES)],
                    label=f"{label}, layer {layer}")
    levels = [ax.axhline(uniform, color="grey", linewidth=0.8, label="uniform attention"),
              ax.axhline(SINK_FACTOR * uniform, color="grey", linestyle=":", linewidth=0.8,
                         label=f"{SINK_FACTOR:g}x uniform")]
    ax.set(xlabel="training step", ylabel="F-Attn (attention on the first token)",
           title="The sink forming while training (telemetry)")
    layer_legend(ax, list(runs), layers, extra=levels)
    save(fig, path)


def report_lines(folder: pathlib.Path, variants: Sequence[str], seq_len: int,
                 tokens_per_step: int, link: str) -> list[str]:
    """Markdown: the curves (drawn into folder/sink_emergence.png) and the emergence steps."""
    runs = {v: telemetry_points(folder / v) for v in variants}
    if not any(runs.values()):
        return []
    uniform = uniform_level([p for points in runs.values() for p in points], seq_len)
    plot(runs, folder / "sink_emergence.png", uniform)
    lines = ["### The sink forming while training", "",
             f"Every `train.telemetry_every` steps each run measured, on its own training "
             f"batch, the attention every query puts on the first token of its segment "
             f"(F-Attn), per layer. Uniform attention gives {uniform:.3f} on those rows; the "
             f"table gives the first measured step "
             f"(and tokens seen) at which a layer reached {SINK_FACTOR:g}x that.", "",
             f"![sink emergence]({link}/sink_emergence.png)", "",
             "| run | layer | first step at 3x uniform | tokens | F-Attn at the end |",
             "|---|---|---|---|---|"]
    for v, points in runs.items():
        if not points:
            continue
        for layer, step in enumerate(emergence(points, uniform)):
            end = points[-1]["f_attn_per_layer"][layer]
            lines.append(f"| {v} | {layer} | {'never' if step is None else step} | "
                         f"{'-' if step is None else f'{step * tokens_per_step:,}'} | "
                         f"{'-' if end is None else f'{end:.3f}'} |")
    return lines + [""]
