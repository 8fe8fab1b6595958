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


def _analysis(f_attn: float) -> dict:
    """analysis.json as gated_attention.analyze writes it, with the fields the summary reads."""
    return {"perplexity": 20.0, "first_token_attention": f_attn, "sink_rate": 0.5,
            "massive_activation": 10.0, "gate_score_mean": None, "step": 30,
            "params": {"params_added_vs_baseline": 0}}


def _section(text: str, title: str) -> list[str]:
    lines = text.split(f"## {title}", 1)[1].split("\n## ", 1)[0].splitlines()
    return [line for line in lines if line.startswith("|")]


def test_summary_warns_of_a_baseline_without_sink_and_places_g1_on_the_ladder(tmp_path):
    from experiments import summarize
    from tests import grid_fixtures

    # Held-out losses per seed; G1 SiLU gains far more, so that it shows if it is taken for
    # G1 (its name starts with G1's). Baseline seed 1 has F-Attn 0.10: below 3x uniform.
    losses = {"baseline": [3.10, 3.00, 3.20], "g1_sdpa_elementwise": [3.08, 2.97, 3.19],
              "g1_sdpa_elementwise_silu": [2.50, 2.40, 2.60]}
    f_attn = {"baseline": [0.40, 0.10, 0.35], "g1_sdpa_elementwise": [0.05, 0.04, 0.06],
              "g1_sdpa_elementwise_silu": [0.20, 0.10, 0.30]}
    runs = {}
    for variant, values in losses.items():
        for seed, value in enumerate(values):
            name = f"tiny-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=value,
                                                 analysis=_analysis(f_attn[variant][seed]))
    grid_fixtures.write_manifest(tmp_path, runs)
    summarize.summarize(tmp_path)
    text = (tmp_path / "summary.md").read_text()

    # Uniform causal attention over the fixture's 64-token rows: query q (1..63) gives
    # 1 / (q + 1) to the first token; the stated factor is 3.
    uniform = float(np.mean(1.0 / np.arange(2, 65)))
    assert uniform == pytest.approx(0.0594, abs=1e-4)
    ratios = [f / uniform for f in f_attn["baseline"]]
    assert [r >= 3 for r in ratios] == [True, False, True]
    assert f"puts {uniform:.3f} on the first token" in text and "claimed at 3x that" in text
    assert "**The baseline formed no sink in 1 of 3 runs** (`tiny-baseline-s1`)" in text
    assert f"`tiny-baseline-s1` {ratios[1]:.1f}x" in text
    assert "the baseline formed a sink in 2 of 3 seeds" in text  # beside the paired F-Attn

    ladder = _section(text, "Reference ladder")
    assert any(line.startswith("| marin speedruns") and line.endswith("| -0.76% |")
               for line in ladder)
    assert any(line.endswith("| paloma c4_en bpb | -0.90% |") for line in ladder)
    assert any(line.startswith("| the paper, Table 2") and line.endswith("| -0.63% |")
               for line in ladder)
    ours = [line for line in ladder if line.startswith("| this grid")]
    base, gated = np.array(losses["baseline"]), np.array(losses["g1_sdpa_elementwise"])
    # By hand: diffs (-0.02, -0.03, -0.01), relative to the baseline's mean 3.10 = -0.65%;
    # the t interval's half width 4.303 x 0.01 / sqrt 3 = 0.0248 -> -1.45% to +0.16%.
    ci = scipy_stats.ttest_rel(gated, base).confidence_interval(0.95)
    rel, low, high = (100 * x / base.mean() for x in ((gated - base).mean(), ci.low, ci.high))
    assert (f"{rel:+.2f}", f"{low:+.2f}", f"{high:+.2f}") == ("-0.65", "-1.45", "+0.16")
    assert ours == [f"| this grid: g1_sdpa_elementwise vs baseline, 3 seeds | tiny "
                    f"| held-out loss | {rel:+.2f}% (95% CI {low:+.2f}% to {high:+.2f}%) |"]


def test_the_ladder_takes_the_lr_sweeps_multiplier_1_row_only(tmp_path):
    from experiments import summarize
    from tests import grid_fixtures

    # An LR sweep (x1, x2) of baseline and G1: x2 gains more, but measures the learning rate.
    losses = {("baseline", 1): [3.00, 3.10], ("g1_sdpa_elementwise", 1): [2.97, 3.08],
              ("baseline", 2): [2.90, 3.00], ("g1_sdpa_elementwise", 2): [2.60, 2.80]}
    runs = {}
    for (variant, m), values in losses.items():
        for seed, value in enumerate(values):
            name = f"tiny-{variant}-lrx{m}-s{seed}"
            runs[name] = grid_fixtures.write_run(
                tmp_path, name, variant=variant, seed=seed, eval_loss=value, lr_multiplier=m,
                label=f"{variant} lr x{m}", peak_lr=1e-2 * m)
    grid_fixtures.write_manifest(tmp_path, runs)
    summarize.summarize(tmp_path)
    ours = [line for line in _section((tmp_path / "summary.md").read_text(), "Reference ladder")
            if line.startswith("| this grid")]
    base, gated = (np.array(losses[(v, 1)]) for v in ("baseline", "g1_sdpa_elementwise"))
    ci = scipy_stats.ttest_rel(gated, base).confidence_interval(0.95)  # 1 degree of freedom
    rel, low, high = (100 * x / base.mean() for x in ((gated - base).mean(), ci.low, ci.high))
    assert f"{rel:+.2f}" == "-0.82"  # diffs (-0.03, -0.02): -0.025 / 3.05
    assert ours == [f"| this grid: g1_sdpa_elementwise lr x1 vs baseline lr x1, 2 seeds | tiny "
                    f"| held-out loss | {rel:+.2f}% (95% CI {low:+.2f}% to {high:+.2f}%) |"]
