"""experiments/telemetry_curves.py: first-token weight over training from hand-written logs."""

import json

import pytest

from experiments import make_tables, telemetry_curves

pytestmark = pytest.mark.reference("independent")


def _write(workdir, lines):
    workdir.mkdir(parents=True)
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_each_point_is_f_attn_over_its_batchs_uniform_level_over_the_model_and_its_top_layer(
        tmp_path):
    _write(tmp_path / "a", [
        {"step": 10, "kind": "train", "loss": 3.0},
        {"step": 250, "kind": "telemetry", "f_attn": 0.030, "f_attn_uniform": 0.020,
         "f_attn_per_layer": [0.010, 0.020, 0.030, 0.060]},
        # a resumed run logs step 500 twice: the later line is the run's
        {"step": 500, "kind": "telemetry", "f_attn": 0.040, "f_attn_uniform": 0.020,
         "f_attn_per_layer": [0.1, 0.0, 0.0, 0.0]},
        {"step": 500, "kind": "telemetry", "f_attn": 0.050, "f_attn_uniform": 0.025,
         "f_attn_per_layer": [0.090, 0.010, 0.050, 0.050]},
    ])
    _write(tmp_path / "b", [{"step": 500, "kind": "telemetry", "f_attn": 0.021,
                             "f_attn_uniform": 0.021, "f_attn_per_layer": [0.021, 0.042]}])
    points = telemetry_curves.curve(tmp_path / "a")
    assert [p["step"] for p in points] == [250, 500]
    assert points[0]["whole"] == pytest.approx(1.5) and points[0]["top"] == pytest.approx(3.0)
    assert points[0]["layer"] == 3
    assert points[1]["whole"] == pytest.approx(2.0) and points[1]["top"] == pytest.approx(3.6)
    assert points[1]["layer"] == 0
    assert telemetry_curves.curve(tmp_path / "missing") == []
    table = telemetry_curves.curves_markdown(tmp_path, ["a", "b", "missing"])
    assert table == ["| run | step 250 | step 500 |", "|---|---|---|",
                     "| a | 1.5 / 3.0 (L3) | 2.0 / 3.6 (L0) |",
                     "| b | - | 1.0 / 2.0 (L1) |"]
    lines = make_tables.curves_lines(tmp_path, ["a", "b"])
    assert lines[0].startswith("F-Attn of the training batch over training")
    assert lines[2:] == table
    assert make_tables.curves_lines(tmp_path, ["missing"]) == [
        "No run has logged telemetry yet."]
