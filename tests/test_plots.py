"""Figures carry what a reader needs: colour bars, axis labels, token labels as text, tick labels
at both ends of the data, panels of one size with nothing clipped, legends that show each
line's style; and drawing them leaves the caller's matplotlib backend alone."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from gated_attention.analysis import plots, sink_report

pytestmark = pytest.mark.reference("independent")  # hand-made data, read off what is drawn
LONG_TOKENS = ["<bos>", "The", "\u2423", "quick", "brown", "\u2423fox", "jumps", "over"] * 4


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw, kept instead of written."""
    kept = []
    monkeypatch.setattr(plots, "save", lambda fig, path: kept.append(fig) or str(path))
    return kept


def drawn(fig, dpi: int = 90):
    """The figure rendered by Agg, as a reader's PNG would be: (canvas, RGB pixels)."""
    canvas = FigureCanvasAgg(fig)
    fig.set_dpi(dpi)
    canvas.draw()
    return canvas, np.asarray(canvas.buffer_rgba())[..., :3]


def map_axes(fig):
    return [ax for ax in fig.axes if ax.get_images() and ax.get_label() != "<colorbar>"]


def test_attention_maps_have_a_colour_bar_axis_labels_and_tokens(figures, tmp_path):
    tokens = ["<bos>", "The", "cat", "sat"]
    causal = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]
    maps = {"baseline": np.stack([causal, causal]), "g1": np.stack([causal, causal])}
    plots.plot_attention_map(maps, tmp_path / "m.png", layers=[0, 3], tokens=tokens)
    (fig,) = figures
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(map_axes(fig)) == 4 and len(bars) == 1  # one scale, one bar
    assert bars[0].get_ylabel() == "attention probability"
    for ax in map_axes(fig):
        assert (ax.get_xlabel(), ax.get_ylabel()) == ("key token", "query token")
        assert [t.get_text() for t in ax.get_xticklabels()] == tokens
        assert [t.get_text() for t in ax.get_yticklabels()] == tokens
    # One colour scale: the largest weight a query past the first puts on one key (1/2 here).
    assert map_axes(fig)[0].get_images()[0].get_clim() == (0.0, 0.5)
    assert [ax.get_title() for ax in map_axes(fig)] == [
        "baseline layer 0", "baseline layer 3", "g1 layer 0", "g1 layer 3"]


@pytest.mark.slow  # renders up to four maps of 32 labelled tokens each
@pytest.mark.parametrize("runs,layers", [(1, [0, 1, 2, 3]), (1, [0, 2, 3]), (2, [0, 1])])
def test_attention_map_panels_are_one_size_aligned_and_unclipped(figures, tmp_path, runs,
                                                                 layers):
    """The colour bar took its room from the last panel (narrower, out of line) and long key
    labels ran off the figure; every panel now has one size, a row one baseline, and every
    tick label lies inside the figure."""
    n = len(LONG_TOKENS)
    causal = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    maps = {f"run{r}": np.stack([causal] * len(layers)) for r in range(runs)}
    plots.plot_attention_map(maps, tmp_path / "m.png", layers=layers, tokens=LONG_TOKENS)
    (fig,) = figures
    canvas, _ = drawn(fig)
    renderer = canvas.get_renderer()
    boxes = [ax.get_position() for ax in map_axes(fig)]
    assert len(boxes) == runs * len(layers)
    for box in boxes:
        assert box.width == pytest.approx(boxes[0].width, rel=1e-3)
        assert box.height == pytest.approx(boxes[0].height, rel=1e-3)
    rows = {}
    for box in boxes:
        rows.setdefault(round(box.y0, 3), []).append(box)
    for row in rows.values():
        assert max(b.y1 for b in row) - min(b.y1 for b in row) < 1e-3
    inside = fig.bbox
    for ax in map_axes(fig):
        for label in [*ax.get_xticklabels(), *ax.get_yticklabels(), ax.xaxis.label,
                      ax.yaxis.label]:
            box = label.get_window_extent(renderer)
            assert inside.x0 - 0.5 <= box.x0 and box.x1 <= inside.x1 + 0.5, label.get_text()
            assert inside.y0 - 0.5 <= box.y0 and box.y1 <= inside.y1 + 0.5, label.get_text()


@pytest.mark.parametrize("values", [
    {"baseline": [16.9, 17.2, 16.6, 16.4], "g1": [3.2, 4.8, 5.3, 6.0]},  # the demo's M-Act
    {"resid": [0.44, 0.5, 0.6], "ffn": [3.3, 2.7, 6.0]},
    {"a": [0.021, 0.9]},
    {"a": [3.0, 40.0, 300.0]},
])
def test_a_log_axis_labels_both_ends_of_the_data(figures, tmp_path, values):
    """Tick labels at plain values, and a labelled tick near each end of the data (within a
    factor 1.25): the demo's axis stopped at 10 with the baseline at 17."""
    plots.plot_per_layer(values, tmp_path / "p.png", "max |layer output|", "t", log=True)
    (fig,) = figures
    drawn(fig)
    (ax,) = fig.axes
    low, high = ax.get_ylim()
    shown = [(t.get_loc(), t.label1.get_text()) for t in ax.yaxis.get_major_ticks()
             if low <= t.get_loc() <= high and t.label1.get_visible()]
    data = [v for ys in values.values() for v in ys]
    assert len(shown) >= 4
    assert all(label == f"{loc:g}" for loc, label in shown)
    assert min(loc for loc, _ in shown) <= 1.25 * min(data)
    assert max(loc for loc, _ in shown) * 1.25 >= max(data)


def dash_gaps(pixels: np.ndarray, handle) -> int:
    """Gaps a reader sees along a legend handle: background runs between its first and last
    inked pixel on the handle's middle row of the rendered figure."""
    (x0, y), (x1, _) = handle.get_transform().transform(handle.get_xydata())[[0, -1]]
    row = pixels[pixels.shape[0] - int(round(y)), int(x0):int(x1) + 1]
    (inked,) = np.nonzero((row < 200).any(axis=-1))
    if inked.size == 0:
        return 0
    return int(np.sum(np.diff(inked) > 1))


def legend_styles_seen(fig) -> dict[str, tuple[str, int]]:
    """For each plotted line (label 'run, layer i'), the style of the legend entry a reader
    matches it by (the entry with its label, else the 'layer i' entry) and the gaps drawn."""
    _, pixels = drawn(fig, dpi=200)
    seen = {}
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        entries = {t.get_text(): h for t, h in zip(legend.get_texts(), legend.legend_handles,
                                                   strict=True)}
        for line in ax.get_lines():
            match = re.fullmatch(r"(.+), layer (\d+)", line.get_label())
            if not match:
                continue
            handle = entries.get(line.get_label()) or entries[f"layer {match[2]}"]
            seen[line.get_label()] = (line.get_linestyle(), handle.get_linestyle(),
                                      dash_gaps(pixels, handle))
    return seen


def check_legend_matches_lines(seen: dict) -> None:
    assert seen
    for label, (line_style, handle_style, gaps) in seen.items():
        assert handle_style == line_style, label
        if line_style == "-":
            assert gaps == 0, label
        else:  # a dashed or dotted line: its entry shows at least two gaps
            assert gaps >= 2, (label, gaps)


def sink_results(steps=(100, 500, 1000)):
    """Hand-made measurements of two 2-layer models in sink_report.analyze's format: layer 1
    of the gated model opens its gate at triggers (0.83), layer 0 stays shut (0.03)."""
    labels = ["<bos>", "44", "T2", "26"]
    causal = np.tril(np.ones((4, 4))) / np.arange(1, 5)[:, None]

    def final(f_other, gates):
        trig, other = (None, None) if gates is None else gates
        return {"f_attn_all": f_other, "f_attn_other": f_other, "f_attn_trigger": 0.2,
                "sink_head_share": 1.0 if f_other > 0.3 else 0.0, "bos_residual_ratio": 1.5,
                "trigger_accuracy": 1.0, "bigram_excess_loss": 0.001,
                "gate_trigger_per_layer": trig, "gate_other_per_layer": other,
                "gate_trigger": None if trig is None else float(np.mean(trig)),
                "gate_other": None if other is None else float(np.mean(other)),
                "f_attn_other_per_layer": [f_other, f_other / 2]}

    out = {}
    for variant, f_other, gates in (("baseline", 0.7, None),
                                    ("g1_sdpa_elementwise", 0.04, ([0.03, 0.83], [0.006, 0.005]))):
        over = [{"step": s, **final(f_other * s / steps[-1], gates)} for s in steps]
        out[variant] = {"over_steps": over, "final": over[-1], "labels": labels,
                        "maps": np.stack([causal, causal]).tolist(), "massive_activation": 1.4,
                        "seq_len": 64}
    return out


def test_f_attn_over_steps_legend_shows_each_layers_line_style(figures, tmp_path):
    """Layer 1 is dashed; its legend entry was too (a short handle with a marker over its one
    gap), so both layers looked alike. Read from the rendered pixels."""
    sink_report.plot_f_attn_over_steps(sink_results(), tmp_path / "f.png", 0.059)
    (fig,) = figures
    seen = legend_styles_seen(fig)
    assert set(seen) == {f"{v}, layer {i}" for v in ("baseline", "g1_sdpa_elementwise")
                         for i in (0, 1)}
    check_legend_matches_lines(seen)


def test_sink_emergence_legend_shows_each_layers_line_style_and_the_last_step(figures,
                                                                               tmp_path):
    from gated_attention.analysis import telemetry_report

    points = {v: [{"step": s, "f_attn_per_layer": [0.1 * s / 1000 + f, 0.05 + f]}
                  for s in range(100, 1001, 100)] for v, f in (("baseline", 0.5),
                                                               ("g1", 0.0))}
    telemetry_report.plot(points, tmp_path / "s.png", 0.059)
    (fig,) = figures
    check_legend_matches_lines(legend_styles_seen(fig))
    (ax,) = fig.axes
    assert {line.get_xdata()[-1] for line in ax.get_lines() if ", layer" in line.get_label()
            } == {1000}


@pytest.mark.reference("golden")
def test_the_sink_table_gives_the_gate_score_per_layer(figures, tmp_path):
    """The table said 'gate score at trigger queries 0.433': the mean of layer 0's 0.03 and
    layer 1's 0.83, a number no layer has. One row per layer now."""
    lines = sink_report.report_lines(tmp_path, sink_results(), {"train.steps": 1000,
                                                                "train.batch_size": 32},
                                     "sinks")
    gate = [line for line in lines if line.startswith("| gate score")]
    assert gate == [
        "| gate score at trigger / other queries, layer 0 | - | 0.030 / 0.006 |",
        "| gate score at trigger / other queries, layer 1 | - | 0.830 / 0.005 |"]
    text = "\n".join(lines)
    assert "0.43" not in text and "0.005 at other queries" not in text
    assert "layer 0: 0.03 at triggers, 0.006 elsewhere; layer 1: 0.83 at triggers" in text
    assert len(figures) == 3  # F-Attn over training, attention maps, gate scores


@pytest.mark.slow  # trains a SentencePiece vocabulary
def test_a_space_piece_is_labelled_as_text_not_by_its_id(tmp_path):
    """SentencePiece decodes its lone word-boundary piece to nothing; the maps labelled it
    '<934>'. Every piece of a real SentencePiece vocabulary now has a text label."""
    from data_fixtures import texts

    from gated_attention.data import corpus, tokenizer

    model = tmp_path / "spm.model"
    tokenizer.train_sentencepiece([corpus.Document(str(i), t) for i, t in enumerate(texts())],
                                  400, model)
    sp = tokenizer.SentencePieceTokenizer(model)
    ids = list(range(sp.vocab_size))
    labels = plots.token_labels(sp, ids)
    space = sp.processor.piece_to_id("\u2581")
    assert sp.decode([space]) == ""  # the case that showed as an id
    assert labels[space] == "\u2423"
    assert not [(i, label) for i, label in enumerate(labels) if re.fullmatch(r"<\d+>", label)]
    word = sp.processor.piece_to_id("\u2581the")
    assert labels[word] == "the"  # decoded text where there is some


@pytest.mark.slow  # a fresh interpreter imports matplotlib and the package
def test_plotting_chooses_no_backend(tmp_path):
    """plots.py switched every importer to Agg at import, so a notebook lost its inline
    figures. Drawing every kind of figure now neither changes the backend nor loads pyplot."""
    code = f"""
import json, sys
import matplotlib
matplotlib.use("svg")
import numpy as np
from gated_attention.analysis import plots, sink_report
from gated_attention.analysis import run_analysis as analyze
from gated_attention.analysis import telemetry_report
out = {str(tmp_path)!r}
plots.plot_per_layer({{"a": [1.0, 17.0]}}, out + "/p.png", "y", "t", log=True)
plots.plot_loss_curves({{"a": [(1, 3.0), (2, 2.5)]}}, out + "/l.png")
plots.plot_gate_histograms({{"a": {{"edges": [0, 0.5, 1], "all": [0.2, 0.8]}}}}, out + "/h.png")
plots.plot_attention_map(np.eye(3)[None], out + "/m.png", layers=[0])
telemetry_report.plot({{"a": [{{"step": 1, "f_attn_per_layer": [0.1]}}]}}, out + "/s.png", 0.1)
print(json.dumps([matplotlib.get_backend(), "matplotlib.pyplot" in sys.modules]))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == ["svg", False]
