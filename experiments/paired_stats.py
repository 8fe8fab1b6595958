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
  detect it with 80% power if the mean and spread stayed as observed (noncentral t).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

ALPHA = 0.05
POWER = 0.8
MAX_SEEDS = 1000  # seeds_needed gives up beyond this (reported as "> 1000")
EXACT_UP_TO = 16  # exact sign-flip enumeration up to 2^16 patterns; Monte Carlo beyond


@dataclasses.dataclass(frozen=True)
class Paired:
    n: int
    mean: float | None
    se: float | None
    low: float | None          # 95% t interval
    high: float | None
    p_t: float | None          # paired t-test, two-sided
    p_sign_flip: float | None  # exact sign-flip permutation, two-sided
    seeds_needed: int | None   # for 80% power at the observed mean and spread


def t_interval(diffs: Sequence[float], alpha: float = ALPHA
               ) -> tuple[float, float, float, float] | None:
    """(mean, se, low, high) of the Student-t interval; None with fewer than 2 pairs."""
    d = np.asarray(diffs, float)
    if d.size < 2:
        return None
    mean, se = float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size))
    half = float(scipy_stats.t.ppf(1 - alpha / 2, d.size - 1)) * se
    return mean, se, mean - half, mean + half


def t_test_p(diffs: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test on the differences (None below 2 pairs)."""
    d = np.asarray(diffs, float)
    if d.size < 2:
        return None
    sd = float(d.std(ddof=1))
    if sd == 0.0:
        return 1.0 if d.mean() == 0 else 0.0
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
    return float(scipy_stats.nct.sf(crit, df, nc) + scipy_stats.nct.cdf(-crit, df, nc))


def seeds_needed(diffs: Sequence[float], alpha: float = ALPHA, power: float = POWER
                 ) -> int | None:
    """Smallest n >= 2 whose paired t-test reaches `power` at the observed mean / sd; None
    when there is no spread to go on (fewer than 2 pairs, or sd 0) or beyond MAX_SEEDS."""
    d = np.asarray(diffs, float)
    if d.size < 2 or float(d.std(ddof=1)) == 0.0:
        return None
    effect = abs(float(d.mean())) / float(d.std(ddof=1))
    if effect == 0.0:
        return None
    for n in range(2, MAX_SEEDS + 1):
        if t_power(effect, n, alpha) >= power:
            return n
    return None


def paired(diffs: Sequence[float]) -> Paired:
    d = [float(x) for x in diffs if x is not None and math.isfinite(float(x))]
    interval = t_interval(d)
    if interval is None:
        mean = d[0] if d else None
        return Paired(len(d), mean, None, None, None, None, sign_flip_p(d), None)
    mean, se, low, high = interval
    p = t_test_p(d)
    return Paired(len(d), mean, se, low, high, p, sign_flip_p(d),
                  seeds_needed(d) if p is not None and p >= ALPHA else None)


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
