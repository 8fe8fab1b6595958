"""Figures carry what a reader needs: colour bars, axis labels, token labels."""

import numpy as np

from gated_attention.analysis import plots


def test_attention_maps_have_colour_bars_axis_labels_and_tokens(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or str(path))
    tokens = ["<bos>", "The", "cat", "sat"]
    causal = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    maps = {"baseline": np.stack([causal, causal]), "g1": np.stack([causal, causal])}
    plots.plot_attention_map(maps, tmp_path / "m.png", layers=[0, 3], tokens=tokens)
    (fig,) = figures
    maps_axes = [ax for ax in fig.axes if ax.get_images()]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(maps_axes) == 4 and len(bars) == 2  # one bar per row of maps
    assert bars[0].get_ylabel() == "attention probability"
    for ax in maps_axes:
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("key token", "query token")
        assert [t.get_text() for t in ax.get_xticklabels()] == tokens
        assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    # One colour scale: the largest weight a query past the first puts on one key (1/2 here).
    assert maps_axes[0].get_images()[0].get_clim() == (0.0, 0.5)
