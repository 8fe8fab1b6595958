"""Run records (gated_attention/run_record.py) and the tables rebuilt from them
(experiments/make_tables.py). A real run's record.json: tests/test_telemetry.py."""

import pathlib
import subprocess

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments import make_tables, summarize
from gated_attention import run_record
from tests import grid_fixtures


def test_code_version_is_the_checkouts_commit_and_none_outside_git(tmp_path):
    repo = pathlib.Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    version = run_record.code_version(repo)
    if head.returncode == 0:
        assert version["commit"] == head.stdout.strip()
        assert isinstance(version["dirty"], bool)
    assert run_record.code_version(tmp_path) == {"commit": None, "dirty": None}


def test_tables_are_rebuilt_from_records_with_command_commit_and_seeds(tmp_path):
    base, gated = [3.10, 3.00, 3.20], [3.00, 2.95, 3.05]
    runs = {}
    for variant, values in (("baseline", base), ("g1_sdpa_elementwise", gated)):
        for seed, value in enumerate(values):
            name = f"sink_tiny-h2-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=value)
    grid_fixtures.write_manifest(tmp_path, runs)
    result = summarize.summarize(tmp_path)
    block = make_tables.table_block("sinks_cpu", result, "make tables")
    assert "Produced by `make tables`" in block and "commit `abc`" in block
    assert "seeds 0, 1, 2" in block
    row = next(line for line in block.splitlines() if line.startswith("| g1_sdpa_elementwise"))
    assert "3.000 ± 0.029" in row  # mean (3.00, 2.95, 3.05) and its standard error
    assert "-0.100 [" in row  # paired difference to the baseline
    # diffs (-0.10, -0.05, -0.15): t = -0.1 / (0.05 / sqrt 3) = -3.464, 2 df -> p 0.074
    assert scipy_stats.ttest_rel(gated, base).pvalue == pytest.approx(0.0742, abs=1e-4)
    assert ", p 0.07" in row and "**\\***" not in row
    # effect 0.1 / 0.05 = 2: a paired t-test at 5% reaches 80% power at 5 pairs (noncentral t)
    assert "g1_sdpa_elementwise held-out loss (-0.100): 5" in block
    page = "intro\n<!-- table:sinks_cpu begin -->\nold\n<!-- table:sinks_cpu end -->\nrest\n"
    new = make_tables.replace_block(page, "sinks_cpu", block)
    assert new.startswith("intro\n<!-- table:sinks_cpu begin -->\nProduced by")
    assert new.endswith("<!-- table:sinks_cpu end -->\nrest\n") and "old" not in new
    with pytest.raises(ValueError, match="table:other"):
        make_tables.replace_block(page, "other", block)


def test_a_difference_significant_only_before_holm_gets_the_seeds_holm_needs(tmp_path):
    # Two rows, each with diffs (-0.10, -0.07, -0.13) to the baseline: paired t p 0.029 each
    # (scipy), Holm over 2 rows -> 0.057, so neither is marked. The seeds to resolve them are
    # those a t-test at 5% / 2 needs for 80% power at effect 0.1 / 0.03.
    base = [3.00, 3.10, 3.20]
    runs = {}
    for variant in ("baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise"):
        shift = (0.0, 0.0, 0.0) if variant == "baseline" else (-0.10, -0.07, -0.13)
        for seed, (value, d) in enumerate(zip(base, shift)):
            name = f"sink_tiny-h2-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=value + d)
    grid_fixtures.write_manifest(tmp_path, runs)
    diffs = np.array([-0.10, -0.07, -0.13])
    assert scipy_stats.ttest_1samp(diffs, 0.0).pvalue == pytest.approx(0.0287, abs=1e-4)
    block = make_tables.table_block("sinks_cpu", summarize.summarize(tmp_path), "make tables")
    rows = [line for line in block.splitlines() if line.startswith("| g1_")]
    assert len(rows) == 2 and all("p 0.03" in r and "**\\***" not in r for r in rows)
    # Independent reference: Monte Carlo power of the two-sided t-test at alpha 0.025 for
    # normal diffs of standardised effect 0.1 / 0.03: n = 3 falls short of 80%, n = 4 passes.
    rng = np.random.default_rng(0)
    effect = 0.1 / 0.03
    for n, below in ((3, True), (4, False)):
        sample = rng.normal(effect, 1.0, size=(20000, n))
        power = float(np.mean(scipy_stats.ttest_1samp(sample, 0.0, axis=1).pvalue < 0.025))
        assert (power < 0.8) == below, (n, power)
    assert ("g1_sdpa_elementwise held-out loss (-0.100): p < 0.05 before the correction; "
            "4 at 5%/2") in block
    assert "no spread to go on" not in block
