"""Figures for runs and their analysis: loss curves, per-layer metrics, gate histograms,
attention maps. matplotlib with the Agg backend (no display needed); every function writes
one PNG and returns its path.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from gated_attention.analysis.stability import EMA_DECAY, ema_smooth  # noqa: E402

PathLike = str | os.PathLike[str]


def _save(fig: plt.Figure, path: PathLike) -> str:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def plot_loss_curves(runs: Mapping[str, Sequence[tuple[int, float]]], path: PathLike,
                     ema: float = EMA_DECAY, title: str = "training loss",
                     ylabel: str = "loss") -> str:
    """Raw curves (faint) and EMA-smoothed curves (solid), one colour per run."""
    fig, ax = plt.subplots(figsize=(7, 4))
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
    return _save(fig, path)


def plot_per_layer(values: Mapping[str, Sequence[float]], path: PathLike, ylabel: str,
                   title: str, log: bool = False) -> str:
    """One line per run over layer index (e.g. F-Attn or M-Act per layer)."""
    fig, ax = plt.subplots(figsize=(7, 4))
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
    return _save(fig, path)


def log_axis(ax: plt.Axes, axis: str = "y") -> None:
    """A log scale with plain-number labels dense enough to read: matplotlib's default labels
    only powers of ten, so values within a decade or two (M-Act of 5 to 16) got one label.
    Labels at every 1..9 x 10^k within about a decade, at 1, 2, 5 x 10^k up to three."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    target = ax.yaxis if axis == "y" else ax.xaxis
    (ax.set_yscale if axis == "y" else ax.set_xscale)("log")
    ax.autoscale_view()
    low, high = ax.get_ylim() if axis == "y" else ax.get_xlim()
    decades = np.log10(high / low) if low > 0 and high > low else 3.0
    subs = tuple(range(1, 10)) if decades <= 1.2 else (1, 2, 5) if decades <= 3 else (1,)
    target.set_major_locator(LogLocator(base=10, subs=[float(s) for s in subs], numticks=30))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Tick labels for tokens: <bos>/<eos>/<pad> for the special ids, whitespace made visible
    (space, newline, tab as ␣ ↵ ⇥) so a piece of spaces is not an empty label, and <id> for a
    piece that decodes to nothing."""
    special = {getattr(tokenizer, f"{name}_id", None): f"<{name}>"
               for name in ("pad", "eos", "bos")}
    labels = []
    for i in (int(x) for x in ids):
        if i in special:
            labels.append(special[i])
            continue
        text = tokenizer.decode([i])
        labels.append(text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5")
                      if text else f"<{i}>")
    return labels


def plot_gate_histograms(histograms: Mapping[str, Mapping[str, Any]], path: PathLike,
                         title: str = "gate scores (all layers)") -> str:
    """Overlaid step histograms; each value is a `gate_histogram` dict from model_statistics
    ({"edges": [...], "all": [...]}). Runs without a gate (None) are skipped."""
    fig, ax = plt.subplots(figsize=(7, 4))
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
    return _save(fig, path)


def plot_attention_map(maps: Mapping[str, np.ndarray] | np.ndarray, path: PathLike,
                       layers: Sequence[int], tokens: Sequence[str] | None = None,
                       title: str = "head-averaged attention") -> str:
    """Grid of head-averaged attention maps: one row per run, one column per layer (Figure 2).

    `maps` is {label: [len(layers), q, k]} or one such array.
    """
    if not isinstance(maps, Mapping):
        maps = {"": maps}
    rows, cols = len(maps), len(layers)
    # One colour scale for the figure; row 0 (query 0 sees only itself, weight 1) is left out.
    vmax = max((float(np.max(np.asarray(a)[:, 1:])) for a in maps.values()
                if np.asarray(a).shape[1] > 1), default=1.0) or 1.0
    side = 3.0 if tokens is None else max(3.0, 0.12 * len(tokens) + 1.0)
    fig, axes = plt.subplots(rows, cols, figsize=(side * cols + 0.8, side * rows), squeeze=False)
    for r, (label, arr) in enumerate(maps.items()):
        arr = np.asarray(arr)
        if arr.shape[0] != cols:
            raise ValueError(f"maps[{label!r}] has {arr.shape[0]} layers; layers={list(layers)}")
        for c, layer in enumerate(layers):
            ax = axes[r][c]
            image = ax.imshow(arr[c], cmap="viridis", vmin=0.0, vmax=vmax,
                              interpolation="nearest")
            ax.set_title(f"{label} layer {layer}".strip(), fontsize=9)
            ax.set_xlabel("key token")
            ax.set_ylabel("query token")
            if tokens is not None and len(tokens) == arr.shape[-1]:
                ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
                ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
        # One scale for the whole figure; a bar beside each row's last map shows it.
        fig.colorbar(image, ax=axes[r][-1], fraction=0.046, pad=0.04,
                     label="attention probability")
    fig.suptitle(title)
    return _save(fig, path)
