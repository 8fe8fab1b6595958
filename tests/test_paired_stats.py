"""Paired statistics (experiments/paired_stats.py) against scipy and hand-computed cases."""

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments import paired_stats

REF = np.array([3.10, 2.95, 3.30, 3.05, 3.20])
ROW = np.array([3.00, 2.90, 3.12, 3.01, 3.02])


def test_t_test_and_interval_match_scipy_ttest_rel():
    result = paired_stats.paired(ROW - REF)
    expected = scipy_stats.ttest_rel(ROW, REF)
    assert result.p_t == pytest.approx(expected.pvalue, rel=1e-10)
    ci = expected.confidence_interval(0.95)
    assert (result.low, result.high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert result.mean == pytest.approx(float(np.mean(ROW - REF)))
    assert result.se == pytest.approx(float(np.std(ROW - REF, ddof=1)) / math.sqrt(5))


def test_sign_flip_is_exact_on_a_hand_case():
    # d = (1, 2, 3): the 8 sign patterns have |sum| 6, 0, 2, 4, 4, 2, 0, 6; two reach 6.
    assert paired_stats.sign_flip_p([1.0, 2.0, 3.0]) == pytest.approx(2 / 8)
    # d = (1, -1): |sum| is 0 or 2 and the observed 0 is reached by all four patterns.
    assert paired_stats.sign_flip_p([1.0, -1.0]) == pytest.approx(1.0)


def test_sign_flip_matches_scipy_permutation_test():
    d = ROW - REF
    expected = scipy_stats.permutation_test(
        (d,), np.mean, permutation_type="samples", n_resamples=np.inf,
        alternative="two-sided").pvalue
    assert paired_stats.sign_flip_p(d) == pytest.approx(expected)


def test_holm_by_hand():
    # m = 3: sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 -> max(0.06, 0.04) = 0.06.
    assert paired_stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert paired_stats.holm([None, 0.2, 0.9]) == [None, pytest.approx(0.4), pytest.approx(0.9)]


def test_seeds_needed_matches_the_published_paired_t_sample_size():
    # A paired t-test at alpha 0.05 and 80% power needs 34 pairs for d = 0.5 and 12 for
    # d = 0.9 (G*Power's "means: difference from constant" tables give the same).
    for effect, n in ((0.5, 34), (0.9, 12)):
        diffs = effect + np.array([1.0, -1.0]) / math.sqrt(2)  # mean = effect, sd = 1
        assert np.std(diffs, ddof=1) == pytest.approx(1.0)
        assert paired_stats.seeds_needed(diffs) == n


def test_significant_difference_needs_no_more_seeds():
    result = paired_stats.paired([-0.10, -0.05, -0.18, -0.04, -0.18])
    assert result.p_t < 0.05 and result.seeds_needed is None
    one = paired_stats.paired([0.3])
    assert one.n == 1 and one.p_t is None and one.low is None


def test_summary_pairs_each_row_with_the_baseline_seed_by_seed(tmp_path):
    from experiments import summarize
    from tests import grid_fixtures

    losses = {"baseline": REF, "g1_sdpa_elementwise": ROW,
              "g1_sdpa_headwise": REF + np.array([0.02, -0.03, 0.01, 0.0, -0.01])}
    runs = {}
    for variant, values in losses.items():
        for seed, value in enumerate(values):
            name = f"tiny-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=float(value))
    grid_fixtures.write_manifest(tmp_path, runs)
    result = summarize.summarize(tmp_path)
    entries = {e["label"]: e for e in result["paired"] if e["metric"] == "eval_loss"}
    assert set(entries) == {"g1_sdpa_elementwise", "g1_sdpa_headwise"}
    g1 = entries["g1_sdpa_elementwise"]
    assert g1["reference"] == "tiny-baseline" and g1["n"] == 5
    assert g1["p_t"] == pytest.approx(scipy_stats.ttest_rel(ROW, REF).pvalue)
    p_head = scipy_stats.ttest_rel(losses["g1_sdpa_headwise"], REF).pvalue
    assert g1["p_holm"] == pytest.approx(min(1.0, 2 * min(g1["p_t"], p_head)))
    assert g1["significant"] and not entries["g1_sdpa_headwise"]["significant"]
    assert entries["g1_sdpa_headwise"]["seeds_needed"] > 5
    text = (tmp_path / "summary.md").read_text()
    assert "## Paired differences to the reference row" in text
    assert text.count(" **\\*** |") == 1  # one row marked
    assert (tmp_path / "paired.csv").exists()
    # --reference names another row: the baseline is then compared with it.
    other = summarize.summarize(tmp_path, reference="g1_sdpa_headwise")
    labels = {e["label"] for e in other["paired"] if e["metric"] == "eval_loss"}
    assert labels == {"baseline", "g1_sdpa_elementwise"}
    with pytest.raises(ValueError, match="--reference='nope' names no row"):
        summarize.summarize(tmp_path, reference="nope")
