"""Figures for runs and their analysis: loss curves, per-layer metrics, gate histograms,
attention maps. Every function writes one PNG and returns its path.

Figures are drawn on `matplotlib.figure.Figure` objects, never through pyplot: writing a PNG
needs no display and no backend, and importing or calling this module leaves the caller's
backend alone (a notebook keeps its inline figures; `display(Image(path))` shows these).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, MaxNLocator, NullFormatter

from gated_attention.analysis.stability import EMA_DECAY, ema_smooth

PathLike = str | os.PathLike[str]
END_SLACK = 1.25  # a log axis has a labelled tick within this factor of each end of its data
MAPS_PER_ROW = 2  # one run's attention maps: two layers a row
LAYER_STYLES = ("-", "--", ":", "-.")  # one line style per layer, repeating after four
# Mantissas of log-axis ticks, coarsest first: the first set that labels the data's range
# densely enough is used (see log_ticks).
LOG_MANTISSAS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0, 7.0),
                 (1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0),
                 (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0))


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A figure outside pyplot's registry, laid out by matplotlib's constrained layout (panels
    of a row keep one size beside a colour bar; long tick labels get room)."""
    return Figure(figsize=figsize, layout="constrained")


def save(fig: Figure, path: PathLike) -> str:
    """Write `fig` as a PNG at `path` (its folder made), cropped to what is drawn."""
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")
    return path


def plot_loss_curves(runs: Mapping[str, Sequence[tuple[int, float]]], path: PathLike,
                     ema: float = EMA_DECAY, title: str = "training loss",
                     ylabel: str = "loss") -> str:
    """Raw curves (faint) and EMA-smoothed curves (solid), one colour per run."""
    fig = new_figure((7, 4))
    ax = fig.subplots()
    for i, (label, series) in enumerate(runs.items()):
        if not series:
            continue
        steps, losses = zip(*series, strict=True)
        colour = f"C{i % 10}"
        ax.plot(steps, losses, color=colour, alpha=0.25, linewidth=0.8)
        ax.plot(steps, ema_smooth(losses, ema), color=colour, label=label, linewidth=1.5)
    ax.set_xlabel("step")
    ax.set_ylabel(f"{ylabel} (EMA {ema})")
    ax.set_title(title)
    if runs:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def plot_per_layer(values: Mapping[str, Sequence[float]], path: PathLike, ylabel: str,
                   title: str, log: bool = False) -> str:
    """One line per run over layer index (e.g. F-Attn or M-Act per layer)."""
    fig = new_figure((7, 4))
    ax = fig.subplots()
    for label, ys in values.items():
        ax.plot(range(len(ys)), ys, marker="o", markersize=3, label=label)
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        log_axis(ax)
    if values:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def log_ticks(low: float, high: float, most: int = 12) -> list[float]:
    """Tick values for a log axis showing `low` to `high`: the coarsest mantissa set of
    LOG_MANTISSAS that gives at least four ticks with the lowest and highest within a factor
    END_SLACK of the ends of the range, so the ends of the data are labelled as well as the
    middle: M-Act of 5 to 17 gets 5 6 7 8 9 10 15, not 5 to 10 and nothing above. At most
    `most` ticks; where that leaves an end bare, the next tick beyond it is added (the axis
    then reaches it)."""
    slack = END_SLACK

    def ticks_of(mantissas: Sequence[float]) -> list[float]:
        return [round(m * 10.0 ** k, 12)
                for k in range(math.floor(math.log10(low)) - 1, math.ceil(math.log10(high)) + 1)
                for m in mantissas]

    best: list[float] = []
    for mantissas in LOG_MANTISSAS:
        inside = [t for t in ticks_of(mantissas) if low <= t <= high]
        if len(inside) > most and best:
            break
        best, chosen = inside, mantissas
        if len(inside) >= 4 and inside[0] <= slack * low and inside[-1] * slack >= high:
            return inside
    every = ticks_of(chosen)
    if not best or best[0] > slack * low:
        best = [max(t for t in every if t < low), *best]
    if best[-1] * slack < high:
        best = [*best, min(t for t in every if t > high)]
    return best


def log_axis(ax: Axes, axis: str = "y") -> None:
    """A log scale with plain-number labels (matplotlib's default labels only powers of ten,
    so values within a decade or two got one label), at log_ticks of the axis's limits."""
    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    ax.autoscale_view()
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    if not 0 < low < high:  # nothing positive drawn: matplotlib's own ticks
        return
    ticks = log_ticks(low, high)
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())
    (ax.set_ylim if axis == "y" else ax.set_xlim)(min(low, ticks[0]), max(high, ticks[-1]))


def layer_legend(ax: Axes, runs: Sequence[str], layers: int, *, loc: str = "best",
                 extra: Sequence[Line2D] = ()) -> None:
    """A legend for lines coloured by run (C0, C1, ...) and styled by layer (LAYER_STYLES):
    one entry per run, one per layer, drawn without markers and long enough to show a dash
    (a marker in the middle of a short handle hid the gap of a dashed one)."""
    handles = [Line2D([], [], color=f"C{i % 10}", label=run) for i, run in enumerate(runs)]
    handles += [Line2D([], [], color="black", linewidth=1.2,
                       linestyle=LAYER_STYLES[layer % len(LAYER_STYLES)],
                       label=f"layer {layer}") for layer in range(layers)]
    ax.legend(handles=[*handles, *extra], fontsize=7, handlelength=4.0, loc=loc)


def _piece_text(tokenizer: Any, token: int) -> str:
    """The vocabulary entry of a token whose decoded text is empty (SentencePiece decodes its
    lone word-boundary piece '▁' to nothing), with '▁' shown as a space; '' if none."""
    processor = getattr(tokenizer, "processor", None)
    for name in ("id_to_piece", "id_to_token"):  # SentencePiece, Hugging Face tokenizers
        lookup = getattr(processor, name, None)
        if lookup is not None:
            piece = lookup(int(token))
            return (piece or "").replace("\u2581", " ")
    return ""


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Tick labels for tokens: <bos>/<eos>/<pad> for the special ids, whitespace made visible
    (space, newline, tab as ␣ ↵ ⇥) so a piece of spaces is not an empty label, the
    vocabulary's piece where a token decodes to nothing, and <id> only where neither has
    text."""
    special = {getattr(tokenizer, f"{name}_id", None): f"<{name}>"
               for name in ("pad", "eos", "bos")}
    labels = []
    for i in (int(x) for x in ids):
        if i in special:
            labels.append(special[i])
            continue
        text = tokenizer.decode([i]) or _piece_text(tokenizer, i)
        labels.append(text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
                      if text else f"<{i}>")
    return labels


def plot_gate_histograms(histograms: Mapping[str, Mapping[str, Any]], path: PathLike,
                         title: str = "gate scores (all layers)") -> str:
    """Overlaid step histograms; each value is a `gate_histogram` dict from model_statistics
    ({"edges": [...], "all": [...]}). Runs without a gate (None) are skipped."""
    fig = new_figure((7, 4))
    ax = fig.subplots()
    shown = 0
    for label, hist in histograms.items():
        if not hist:
            continue
        edges = np.asarray(hist["edges"])
        ax.stairs(np.asarray(hist["all"]), edges, label=label, linewidth=1.5)
        shown += 1
    ax.set_xlabel("gate score act(XW)")
    ax.set_ylabel("fraction of scores")
    ax.set_title(title if shown else title + " (no gated runs)")
    if shown:
        ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)


def plot_attention_map(maps: Mapping[str, np.ndarray] | np.ndarray, path: PathLike,
                       layers: Sequence[int], tokens: Sequence[str] | None = None,
                       title: str = "head-averaged attention") -> str:
    """Grid of head-averaged attention maps (the paper's Figure 2): one row per run, one
    column per layer; one run's layers wrap two to a row, so a map keeps a readable size.

    `maps` is {label: [len(layers), q, k]} or one such array. One colour scale for the whole
    figure, shown by one bar; constrained layout keeps the panels one size.
    """
    if not isinstance(maps, Mapping):
        maps = {"": maps}
    for label, arr in maps.items():
        if np.asarray(arr).shape[0] != len(layers):
            raise ValueError(f"maps[{label!r}] has {np.asarray(arr).shape[0]} layers; "
                             f"layers={list(layers)}")
    panels = [(label, c, layer) for label in maps for c, layer in enumerate(layers)]
    cols = len(layers) if len(maps) > 1 else min(len(layers), MAPS_PER_ROW)
    rows = -(-len(panels) // cols)
    # One colour scale for the figure; row 0 (query 0 sees only itself, weight 1) is left out.
    vmax = max((float(np.max(np.asarray(a)[:, 1:])) for a in maps.values()
                if np.asarray(a).shape[1] > 1), default=1.0) or 1.0
    side = 3.0 if tokens is None else max(3.0, 0.11 * len(tokens) + 1.2)
    fig = new_figure((side * cols + 1.2, side * rows + 0.6))
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax, (label, c, layer) in zip(axes, panels, strict=False):
        arr = np.asarray(maps[label])
        image = ax.imshow(arr[c], cmap="viridis", vmin=0.0, vmax=vmax, interpolation="nearest")
        ax.set_title(f"{label} layer {layer}".strip(), fontsize=9)
        ax.set_xlabel("key token")
        ax.set_ylabel("query token")
        if tokens is not None and len(tokens) == arr.shape[-1]:
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    fig.colorbar(image, ax=list(axes[:len(panels)]), shrink=0.6, label="attention probability")
    fig.suptitle(title)
    return save(fig, path)
