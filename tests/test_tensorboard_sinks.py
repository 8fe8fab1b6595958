"""What a user sees in TensorBoard: the sink forms in the baseline and not in G1 while they
train on the synthetic task (docs/sinks.md, "When the sink forms").

The event files are those of two runs of the sinks grid (`make tables`, seed 0: the
baseline and G1 elementwise, same data and same initial shared weights), kept in
tests/fixtures/sink_telemetry/ with their record.json. They are read with tensorflow's own
event reader (summary_iterator, which also checks the files' CRC framing), not with the
project's code; tensorflow comes with the seqio extra.
"""

import importlib.util
import json
import pathlib

import pytest

pytestmark = pytest.mark.reference("independent")  # tensorflow's reader, a hand-computed level
FIXTURES = pathlib.Path(__file__).parent / "fixtures" / "sink_telemetry"
RUNS = {"baseline": FIXTURES / "baseline", "g1": FIXTURES / "g1_sdpa_elementwise"}
SEQ_LEN = 64  # sink_tiny's sequence length
# Uniform causal attention puts 1/(q+1) on the first token at query q (q = 1..63; query 0
# has nothing else to attend to): mean (H_64 - 1) / 63, by hand.
UNIFORM = (sum(1 / n for n in range(1, SEQ_LEN + 1)) - 1) / (SEQ_LEN - 1)
FACTOR = 3.0  # a sink is claimed at 3x the uniform level (experiments/comparisons.py)


def _tf_scalars(run: pathlib.Path) -> dict[str, list[tuple[int, float]]]:
    import tensorflow as tf

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted((run / "tb").glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return {tag: sorted(points) for tag, points in out.items()}


@pytest.fixture(scope="module")
def scalars():
    return {name: _tf_scalars(run) for name, run in RUNS.items()}


@pytest.mark.needs("seqio")
def test_the_baseline_forms_a_sink_as_it_trains_and_g1_does_not(scalars):
    assert UNIFORM == pytest.approx(0.0594, abs=1e-4)
    base, g1 = scalars["baseline"]["telemetry/f_attn"], scalars["g1"]["telemetry/f_attn"]
    assert [s for s, _ in base] == [s for s, _ in g1] and len(base) >= 5
    # the baseline starts near uniform and ends above FACTOR x uniform: the sink forms
    assert base[0][1] < FACTOR * UNIFORM <= base[-1][1]
    # G1 never reaches it, and ends well below the baseline
    assert max(v for _, v in g1) < FACTOR * UNIFORM
    assert g1[-1][1] < base[-1][1] / 3
    # per layer: some baseline layer holds a sink at the end, no G1 layer ever does
    layers = sorted(t for t in scalars["baseline"] if t.startswith("telemetry/f_attn/layer")
                    and "_head" not in t)
    assert layers == ["telemetry/f_attn/layer0", "telemetry/f_attn/layer1"]
    assert max(scalars["baseline"][t][-1][1] for t in layers) >= FACTOR * UNIFORM
    assert all(v < FACTOR * UNIFORM for t in layers for _, v in scalars["g1"][t])
    # the sink rate (share of heads above 0.3) rises in the baseline and stays 0 in G1
    assert scalars["baseline"]["telemetry/sink_rate"][-1][1] > 0
    assert all(v == 0 for _, v in scalars["g1"]["telemetry/sink_rate"])


@pytest.mark.needs("seqio")
def test_the_event_files_hold_what_the_run_recorded(scalars):
    """TensorBoard's last telemetry point is the run's record.json telemetry, and the figure
    script's own event reader (docs/figures/sink_emergence_tb.py) reads the same values."""
    spec = importlib.util.spec_from_file_location(
        "sink_emergence_tb", FIXTURES.parents[2] / "docs" / "figures" / "sink_emergence_tb.py")
    figure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(figure)
    for name, run in RUNS.items():
        record = json.loads((run / "record.json").read_text())
        last = record["telemetry"]
        assert scalars[name]["telemetry/f_attn"][-1] == (last["step"],
                                                          pytest.approx(last["f_attn"], 1e-6))
        for i, value in enumerate(last["f_attn_per_layer"]):
            assert scalars[name][f"telemetry/f_attn/layer{i}"][-1][1] == pytest.approx(value,
                                                                                      1e-6)
        mine = figure.scalars(run / "tb")
        theirs = {t: v for t, v in scalars[name].items() if t.startswith("telemetry/")}
        assert mine.keys() == theirs.keys()
        for tag, points in theirs.items():
            assert mine[tag] == points
