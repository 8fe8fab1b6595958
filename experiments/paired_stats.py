"""Paired comparisons over seeds: is a row's difference to its reference real?

A grid seed fixes the data and the initial weights shared by every variant (grid_lib), so
the runs of two rows with the same seed form a pair, and the per-seed differences
d_i = row_i - reference_i carry the comparison. For n pairs this module gives:

- the mean difference, its standard error sd(d) / sqrt(n) and a 95% Student-t interval
  mean +- t(0.975, n - 1) * se;
- the paired t-test's two-sided p-value (scipy.stats.ttest_rel computes the same);
- the exact two-sided sign-flip permutation p-value: the share of the 2^n sign patterns
  whose |mean| is at least the observed one (no normality assumed; its floor is 2 / 2^n, so
  0.25 at 3 seeds: three seeds can never make it significant);
- Holm's step-down correction over the rows of one table (`holm`), applied to the t-test's
  p-values;
- for a difference not significant, about how many seeds a paired t-test at 5% would need to
  detect it with 80% power if the mean and spread stayed as observed (noncentral t), with
  its range over the 95% chi-square interval of the spread (n - 1 degrees of freedom): the
  spread of three seeds is itself known only to within a factor of about 6.

Edge cases, each stated rather than hidden: all differences equal (no spread; a sink rate
moves in steps of 0.25, so this happens) leave the t-test undefined, so the row's test is
the exact sign-flip p (2 / 2^n for a nonzero difference: 0.5 with 2 seeds) and its interval
is marked degenerate; a non-finite difference (a diverged run) is counted as a failure of
the row, never dropped from it unseen.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
from scipy import integrate as scipy_integrate
from scipy import stats as scipy_stats

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000  # seeds_needed gives up beyond this (reported as "> 1000")
EXACT_UP_TO = 16  # exact sign-flip enumeration up to 2^16 patterns; Monte Carlo beyond


@dataclasses.dataclass(frozen=True)
class Paired:
    n: int                     # finite pairs, the ones every number here is computed from
    mean: float | None
    se: float | None
    low: float | None          # 95% t interval (None when degenerate or n < 2)
    high: float | None
    p_t: float | None          # paired t-test, two-sided (None when degenerate or n < 2)
    p_sign_flip: float | None  # exact sign-flip permutation, two-sided
    seeds_needed: int | None   # for 80% power at the observed mean and spread
    failed: int = 0            # non-finite differences (diverged runs): not in n
    degenerate: bool = False   # n >= 2 differences all equal: no spread, t undefined
    p: float | None = None     # the row's test: p_t, or p_sign_flip when degenerate
    # seeds_needed over the spread's 95% interval: (fewest, most); most None = > MAX_SEEDS
    seeds_range: tuple[int | None, int | None] | None = None


def t_interval(diffs: Sequence[float], alpha: float = ALPHA
               ) -> tuple[float, float, float, float] | None:
    """(mean, se, low, high) of the Student-t interval; None with fewer than 2 pairs."""
    d = np.asarray(diffs, float)
    if d.size < 2:
        return None
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    half = float(scipy_stats.t.ppf(1 - alpha / 2, d.size - 1)) * se
    return mean, se, mean - half, mean + half


def no_spread(diffs: Sequence[float]) -> bool:
    """True when every difference is the same value (to float rounding of the values)."""
    d = np.asarray(diffs, float)
    return bool(d.size >= 1 and np.ptp(d) <= 1e-12 * max(1.0, float(np.abs(d).max())))


def t_test_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test on the differences: None below 2 pairs, and
    None when all differences are equal and nonzero (t is infinite: the test says nothing a
    p of 0 could honestly claim; use sign_flip_p); 1.0 when all are 0."""
    d = np.asarray(diffs, float)
    if d.size < 2:
        return None
    if no_spread(d):
        return 1.0 if not d.any() else None
    sd = float(d.std(ddof=1))
    t = float(d.mean()) / (sd / math.sqrt(d.size))
    return float(2 * scipy_stats.t.sf(abs(t), d.size - 1))


def sign_flip_p(diffs: Sequence[float], *, samples: int = 20_000, seed: int = 0
                ) -> float | None:
    """Two-sided sign-flip permutation p-value of the mean difference (exact up to
    EXACT_UP_TO pairs, else Monte Carlo with `samples` draws, the observed one counted)."""
    d = np.asarray(diffs, float)
    if d.size == 0:
        return None
    observed = abs(d.mean())
    tolerance = 1e-12 * max(1.0, float(np.abs(d).max()))
    if d.size <= EXACT_UP_TO:
        signs = np.array(list(itertools.product((1.0, -1.0), repeat=d.size)))
        means = np.abs(signs @ d) / d.size
        return float(np.mean(means >= observed - tolerance))
    rng = np.random.default_rng(seed)
    signs = rng.choice((1.0, -1.0), size=(samples, d.size))
    hits = np.sum(np.abs(signs @ d) / d.size >= observed - tolerance)
    return float((hits + 1) / (samples + 1))


def t_power(effect: float, n: int, alpha: float = ALPHA) -> float:
    """Power of a two-sided paired t-test with n pairs at standardised effect mean / sd."""
    df = n - 1
    crit = float(scipy_stats.t.ppf(1 - alpha / 2, df))
    nc = effect * math.sqrt(n)
    power = float(scipy_stats.nct.sf(crit, df, nc) + scipy_stats.nct.cdf(-crit, df, nc))
    if not math.isfinite(power):  # scipy's noncentral t gives NaN far in its tail (nc >> crit)
        power = _t_power_by_integral(crit, df, nc)
    return power


def _t_power_by_integral(crit: float, df: int, nc: float) -> float:
    """P(|T| > crit) for T = (Z + nc) / sqrt(V / df), V chi-square with df degrees of
    freedom, integrated over V: the noncentral t's tails where scipy's own gives NaN."""

    def given(v: float) -> float:
        scale = crit * math.sqrt(v / df)
        return (float(scipy_stats.norm.sf(scale - nc) + scipy_stats.norm.cdf(-scale - nc))
                * float(scipy_stats.chi2.pdf(v, df)))

    return float(scipy_integrate.quad(given, 0.0, math.inf, limit=200)[0])


def seeds_for(effect: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Smallest n >= 2 whose paired t-test at `alpha` reaches `power` at the standardised
    effect |mean| / sd; None for no effect or beyond MAX_SEEDS."""
    if not effect or not math.isfinite(effect):
        return None
    return next((n for n in range(2, MAX_SEEDS + 1) if t_power(effect, n, alpha) >= power),
                None)


def seeds_needed(diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER
                 ) -> int | None:
    """seeds_for at the observed mean / sd; None when there is no spread to go on (fewer
    than 2 pairs, or all differences equal) or beyond MAX_SEEDS."""
    d = np.asarray(diffs, float)
    if d.size < 2 or no_spread(d):
        return None
    return seeds_for(abs(float(d.mean())) / float(d.std(ddof=1)), alpha, power)


def sd_interval(sd: float, n: int, alpha: float = ALPHA) -> tuple[float, float]:
    """The 1 - alpha chi-square interval of a normal sample's standard deviation from its
    estimate `sd` over n values (n - 1 degrees of freedom)."""
    df = n - 1
    return (sd * math.sqrt(df / float(scipy_stats.chi2.ppf(1 - alpha / 2, df))),
            sd * math.sqrt(df / float(scipy_stats.chi2.ppf(alpha / 2, df))))


def seeds_range(diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER
                ) -> tuple[int | None, int | None] | None:
    """The seeds a paired t-test at `alpha` needs for `power` if the mean stayed as observed
    and the true spread were either end of its 95% interval: (fewest, most), most None when
    over MAX_SEEDS. None where seeds_needed has nothing to go on."""
    d = np.asarray(diffs, float)
    if d.size < 2 or no_spread(d) or not d.mean():
        return None
    low_sd, high_sd = sd_interval(float(d.std(ddof=1)), d.size)
    mean = abs(float(d.mean()))
    return seeds_for(mean / low_sd, alpha, power), seeds_for(mean / high_sd, alpha, power)


def range_text(needed: int | None, bounds: tuple[int | None, int | None] | None) -> str:
    """"6 (4 to 144)": the seeds needed and their range over the spread's interval."""

    def one(n: int | None) -> str:
        return f"over {MAX_SEEDS}" if n is None else str(n)

    if bounds is None:
        return "no spread to go on" if needed is None else one(needed)
    return f"{one(needed)} ({one(bounds[0])} to {one(bounds[1])})"


def paired(diffs: Sequence[float | None], alpha: float = ALPHA) -> Paired:
    """The paired comparison of per-seed differences. None or non-finite entries (a run
    that diverged or failed) are counted in `failed`, and every number is computed from the
    finite pairs alone; the caller reports both."""
    d = [float(x) for x in diffs if x is not None and math.isfinite(float(x))]
    failed = len(diffs) - len(d)
    flip = sign_flip_p(d)
    if len(d) < 2:
        return Paired(len(d), d[0] if d else None, None, None, None, None, flip, None,
                      failed=failed, p=None)
    if no_spread(d):
        return Paired(len(d), float(np.mean(d)), 0.0, None, None, t_test_p(d), flip, None,
                      failed=failed, degenerate=True, p=flip)
    mean, se, low, high = t_interval(d, alpha)
    p = t_test_p(d)
    unresolved = p is not None and p >= alpha
    return Paired(len(d), mean, se, low, high, p, flip,
                  seeds_needed(d, alpha) if unresolved else None, failed=failed, p=p,
                  seeds_range=seeds_range(d, alpha) if unresolved else None)


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None and does not count in m)."""
    indexed = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(indexed)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, (p, i) in enumerate(indexed):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out
