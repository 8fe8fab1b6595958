"""Grid summaries gain the paper's benchmark columns from runs' lm-eval scores (record.json
final.harness), averaged and paired over seeds like the other columns, beside Table 1."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from tests import grid_fixtures

# hellaswag acc_norm per seed for the baseline and G1 (fractions, as lm-eval reports them)
SCORES = {"baseline": [0.30, 0.32, 0.31], "g1_sdpa_elementwise": [0.34, 0.35, 0.37]}


def write_grid(root):
    runs = {}
    for variant, values in SCORES.items():
        for seed, value in enumerate(values):
            name = f"{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(root, name, variant=variant, seed=seed,
                                                 eval_loss=3.0 - value)
            runs[name]["table"] = "table1_moe"
            record_path = root / name / "record.json"
            record = json.loads(record_path.read_text())
            record["final"]["harness"] = {"step": 30, "kind": "harness",
                                          "hellaswag/acc_norm": value, "hellaswag/acc": 0.1,
                                          "gsm8k/exact_match,strict-match": value / 2}
            record_path.write_text(json.dumps(record))
    grid_fixtures.write_manifest(root, runs)


def test_benchmark_columns_mean_se_paper_and_paired_difference(tmp_path):
    from experiments import summarize

    write_grid(tmp_path)
    out = summarize.summarize(tmp_path)
    groups = {g["variant"]: g for g in out["groups"]}
    for variant, values in SCORES.items():
        percent = 100 * np.asarray(values)
        assert groups[variant]["hellaswag"] == pytest.approx(percent.mean())
        assert groups[variant]["hellaswag_se"] == pytest.approx(
            percent.std(ddof=1) / np.sqrt(len(values)))
        assert groups[variant]["gsm8k"] == pytest.approx(percent.mean() / 2)
        assert groups[variant]["mmlu"] is None
    assert groups["baseline"]["paper_hellaswag"] == 73.07  # Table 1, row 1
    assert groups["g1_sdpa_elementwise"]["paper_hellaswag"] == 74.64  # row 5
    paired = [e for e in out["paired"] if e["metric"] == "hellaswag"]
    assert len(paired) == 1 and not [e for e in out["paired"] if e["metric"] == "mmlu"]
    diff = 100 * (np.asarray(SCORES["g1_sdpa_elementwise"]) - np.asarray(SCORES["baseline"]))
    assert paired[0]["diff"] == pytest.approx(diff.mean())
    assert paired[0]["p"] == pytest.approx(stats.ttest_1samp(diff, 0.0).pvalue, rel=1e-6)
    text = (tmp_path / "summary.md").read_text()
    assert "## Benchmarks (lm-eval, percent)" in text and "| 74.64 |" in text


def test_no_benchmark_section_without_scores(tmp_path):
    from experiments import summarize

    runs = {f"baseline-s{s}": grid_fixtures.write_run(tmp_path, f"baseline-s{s}",
                                                      variant="baseline", seed=s, eval_loss=2.0)
            for s in range(2)}
    grid_fixtures.write_manifest(tmp_path, runs)
    summarize.summarize(tmp_path)
    assert "Benchmarks" not in (tmp_path / "summary.md").read_text()
