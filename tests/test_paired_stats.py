"""Paired statistics (experiments/paired_stats.py) against scipy and hand-computed cases."""

import math
import warnings

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
    """analysis.json as `analyze` writes it, with the fields the summary reads."""
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


# Edge cases: no spread, failed runs, the seeds-to-resolve range.

@pytest.mark.parametrize("n", [2, 3, 5])
def test_equal_differences_get_the_exact_sign_flip_p_and_a_degenerate_interval(n):
    # Sink rate moves in steps of 0.25: every seed 0.25 lower. The t statistic is infinite
    # and a plain t-test (scipy's) says p = 0, which n seeds cannot show. Of the 2^n sign
    # patterns only all-minus and all-plus reach |mean| 0.25: p = 2 / 2^n.
    diffs = np.full(n, -0.25)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        naive = scipy_stats.ttest_1samp(diffs, 0.0)
    assert math.isinf(naive.statistic) and naive.pvalue == 0.0
    result = paired_stats.paired(diffs)
    assert result.degenerate and result.p_t is None
    assert result.low is None and result.high is None and result.se == 0.0
    assert result.p == result.p_sign_flip == pytest.approx(2 / 2 ** n)
    exact = scipy_stats.permutation_test((diffs,), np.mean, permutation_type="samples",
                                         n_resamples=np.inf, alternative="two-sided").pvalue
    assert result.p == pytest.approx(exact)
    assert result.seeds_needed is None and result.seeds_range is None
    # Holm over this row and a clear one: 2 x 0.5 stays far from 5% at two seeds.
    assert paired_stats.holm([paired_stats.paired([-0.25, -0.25]).p, 0.001]) == \
        [pytest.approx(0.5), pytest.approx(0.002)]


def test_no_difference_at_all_is_p_one_not_degenerate_significance():
    result = paired_stats.paired([0.0, 0.0, 0.0])
    assert result.degenerate and result.p_t == 1.0 and result.p == 1.0


def test_non_finite_differences_count_as_failures_and_the_rest_matches_scipy():
    diffs = [-0.10, float("nan"), -0.05, float("inf"), -0.18, None]
    result = paired_stats.paired(diffs)
    assert (result.n, result.failed) == (3, 3)
    finite = np.array([-0.10, -0.05, -0.18])
    assert result.p == pytest.approx(scipy_stats.ttest_1samp(finite, 0.0).pvalue, rel=1e-10)
    assert result.mean == pytest.approx(finite.mean())


def test_seeds_to_resolve_come_with_the_range_of_the_spreads_interval():
    # G2 value's F-Attn at seeds 0-2 against the baseline's (docs/sinks.md): the point
    # estimate says 6 seeds; with the spread's 95% interval over 2 degrees of freedom (sd x
    # sqrt(2 / 7.378) to sd x sqrt(2 / 0.0506): x 0.52 to x 6.28) it is 4 to 144.
    diffs = np.array([0.670, 0.904, 0.695]) - np.array([0.550, 0.350, 0.401])
    low, high = paired_stats.sd_interval(1.0, 3)
    assert (low, high) == pytest.approx((math.sqrt(2 / 7.3778), math.sqrt(2 / 0.050636)),
                                        rel=1e-4)
    result = paired_stats.paired(diffs)
    assert result.seeds_needed == 6 and result.seeds_range == (4, 144)
    assert paired_stats.range_text(6, (4, 144)) == "6 (4 to 144)"
    assert paired_stats.range_text(None, (40, None)) == "over 1000 (40 to over 1000)"


def test_power_far_in_the_tail_is_a_number_and_matches_monte_carlo():
    # scipy's noncentral t returns NaN here (effect 6.4, 4 pairs, alpha 0.025).
    rng = np.random.default_rng(1)
    for n in (2, 3, 4):
        sample = rng.normal(6.4, 1.0, size=(40000, n))
        simulated = float(np.mean(scipy_stats.ttest_1samp(sample, 0.0, axis=1).pvalue < 0.025))
        assert paired_stats.t_power(6.4, n, 0.025) == pytest.approx(simulated, abs=0.01)


# Orders that say how sure they are (experiments/rank_stats.py).

def test_one_seed_orders_nothing_and_ties_are_not_ordered():
    from experiments import rank_stats

    # The case: F-Attn 0.017 for both rows at one seed; and three single runs.
    assert rank_stats.tiers({"baseline": {0: 0.017}, "g1": {0: 0.017}}) == [["baseline", "g1"]]
    assert rank_stats.tiers({"a": {0: 3.0}, "b": {0: 1.0}, "c": {0: 2.0}}) == \
        [["b", "c", "a"]]
    # Three seeds, b lower than a by 1.0 +- 0.1 (paired t p 0.0033), c within noise of b.
    rows = {"a": {0: 5.0, 1: 6.0, 2: 7.0}, "b": {0: 4.1, 1: 4.9, 2: 6.0},
            "c": {0: 4.3, 1: 4.7, 2: 6.1}}
    assert scipy_stats.ttest_rel([5.0, 6.0, 7.0], [4.1, 4.9, 6.0]).pvalue < 0.01
    assert scipy_stats.ttest_rel([4.3, 4.7, 6.1], [4.1, 4.9, 6.0]).pvalue > 0.5
    assert rank_stats.tiers(rows) == [["b", "c"], ["a"]]
    assert rank_stats.tiers_text([["b", "c"], ["a"]]) == "b ≈ c < a"
    # Two seeds, the same difference at both: exact sign-flip p 0.5, not resolved.
    assert rank_stats.tiers({"x": {0: 1.0, 1: 2.0}, "y": {0: 3.0, 1: 4.0}}) == [["x", "y"]]


def test_spearman_bootstrap_over_seeds_by_hand():
    from experiments import rank_stats

    paper = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
    # Rows far apart at both seeds: every resample keeps the order, the interval is a point.
    far = {"a": {0: 0.1, 1: 0.2}, "b": {0: 1.1, 1: 1.3}, "c": {0: 2.0, 1: 2.2},
           "d": {0: 3.0, 1: 3.1}}
    result = rank_stats.spearman_bootstrap(far, paper)
    assert result["rho"] == 1.0 and (result["low"], result["high"]) == (1.0, 1.0)
    assert result["exact"] and result["resamples"] == 4  # 2 seeds: 2^2 resamples
    # c and d swap between seeds. The four resamples of seeds (0,0), (0,1), (1,0), (1,1) give
    # means ordered a<b<c<d at seed 0 (rho 1), a<b<d<c at seed 1 (rho 0.8), and for the two
    # mixed ones c = 2.5 = d... made unequal: c (2.0, 3.2) -> 2.6, d (3.0, 2.0) -> 2.5: rho 0.8.
    swap = {"a": {0: 0.1, 1: 0.2}, "b": {0: 1.1, 1: 1.3}, "c": {0: 2.0, 1: 3.2},
            "d": {0: 3.0, 1: 2.0}}
    result = rank_stats.spearman_bootstrap(swap, paper)
    assert result["rho"] == pytest.approx(0.8)  # means 2.6 > 2.5: c and d swapped
    assert (result["low"], result["high"]) == (pytest.approx(0.8), pytest.approx(1.0))
    # Without each row, over three rows: without d, a < b < c agrees fully (1.0); without
    # a, b or the other swapped row c, one swap among three ranks: 1 - 6 x 2 / 24 = 0.5.
    assert result["without"] == {"a": pytest.approx(0.5), "b": pytest.approx(0.5),
                                 "c": pytest.approx(1.0), "d": pytest.approx(1.0)}
    text = rank_stats.spearman_text(result)
    assert text.startswith("Spearman's rho = 0.80 over 4 rows, 2 seeds (0, 1); 95% bootstrap "
                           "interval over seeds [0.80, 1.00] (every resample of the seeds)")
    one = rank_stats.spearman_bootstrap({k: {0: v[0]} for k, v in swap.items()}, paper)
    assert one["low"] is None and "one seed: no interval" in rank_stats.spearman_text(one)


@pytest.mark.reference("golden")
def test_a_one_seed_summary_warns_ranks_nothing_and_places_no_effect_beside_the_paper(tmp_path):
    from experiments import summarize
    from tests import grid_fixtures

    # The grid: one seed, G1 12.28% below the baseline's held-out loss, F-Attn 0.017
    # for both.
    runs = {}
    for variant, loss in (("baseline", 6.0), ("g1_sdpa_elementwise", 6.0 * (1 - 0.1228))):
        name = f"tiny-{variant}-s0"
        runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=0,
                                             eval_loss=loss, analysis=_analysis(0.017))
    grid_fixtures.write_manifest(tmp_path, runs)
    summarize.summarize(tmp_path)
    text = (tmp_path / "summary.md").read_text()
    assert summarize.ONE_SEED_WARNING in text
    assert "**One seed per row: these are single runs.** No row is ranked" in text
    assert "- **F-Attn** ours: baseline ≈ g1_sdpa_elementwise" in text
    assert " < g1" not in text and "baseline < " not in text
    (ours,) = [line for line in _section(text, "Reference ladder")
               if line.startswith("| this grid")]
    assert "-12.28%" not in ours and "1 seed" in ours
    assert "not placed beside the published changes: one seed has no interval" in ours


@pytest.mark.reference("golden")
def test_failed_and_non_finite_runs_are_counted_in_the_row_not_dropped(tmp_path):
    from experiments import summarize
    from tests import grid_fixtures

    # Baseline seeds 0-3; G1 seed 2 diverged (held-out loss NaN), seed 3 failed outright.
    base, gated = [3.10, 3.00, 3.20, 3.05], [3.00, 2.95, float("nan"), None]
    runs = {}
    for variant, values in (("baseline", base), ("g1_sdpa_elementwise", gated)):
        for seed, value in enumerate(values):
            name = f"tiny-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(
                tmp_path, name, variant=variant, seed=seed,
                eval_loss=3.0 if value is None else value,
                state="failed" if value is None else "done")
    grid_fixtures.write_manifest(tmp_path, runs)
    result = summarize.summarize(tmp_path)
    (entry,) = [e for e in result["paired"] if e["metric"] == "eval_loss"]
    assert entry["seeds"] == [0, 1] and entry["failed_seeds"] == [2, 3]
    assert (entry["n"], entry["failed"]) == (2, 2)
    assert entry["p"] == pytest.approx(scipy_stats.ttest_rel([3.00, 2.95], [3.10, 3.00]).pvalue)
    text = (tmp_path / "summary.md").read_text()
    assert "| g1_sdpa_elementwise | baseline | 0, 1 (2 of 4 failed or non-finite: 2, 3) |" in text
    group = next(g for g in result["groups"] if g["variant"] == "g1_sdpa_elementwise")
    assert group["seed_list"] == [0, 1, 2] and group["eval_loss_nonfinite"] == 1
    assert "| 3 (1 failed) | 0, 1, 2 (1 non-finite) |" in text
