"""Orders and rank correlations that say how sure they are.

A grid's rows are ordered by their means over seeds, but two rows whose seeds cannot tell
them apart are not ordered: `tiers` puts them in one tier (a row joins the tier above it
unless the paired test of paired_stats separates it from every row there at 5%; with one seed
nothing is separated). `spearman_bootstrap` gives Spearman's rho of the rows' means against
the paper's values with a percentile interval from resampling the seeds (all rows at once:
a seed pairs the rows, grid_lib), exact over every resample when there are few, and rho
with each row left out, since over a handful of rows one row can carry the whole correlation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from experiments import paired_stats

PerSeed = Mapping[Hashable, float]  # seed -> a row's value at that seed
BOOTSTRAP_SAMPLES = 4000
EXACT_RESAMPLES = 20_000  # enumerate every resample of the seeds up to this many (n^n)


def finite_values(values: PerSeed) -> dict[Hashable, float]:
    return {s: float(v) for s, v in values.items()
            if v is not None and math.isfinite(float(v))}


def resolved(a: PerSeed, b: PerSeed, alpha: float = paired_stats.ALPHA) -> bool:
    """True when rows a and b differ at `alpha` by the paired test over the seeds both hold
    (paired_stats.paired: the t-test, or the exact sign-flip test without spread); never with
    fewer than 2 shared seeds."""
    a, b = finite_values(a), finite_values(b)
    common = sorted(set(a) & set(b), key=str)
    if len(common) < 2:
        return False
    result = paired_stats.paired([a[s] - b[s] for s in common], alpha)
    return result.p is not None and result.p < alpha


def tiers(rows: Mapping[str, PerSeed], alpha: float = paired_stats.ALPHA
          ) -> list[list[str]]:
    """The rows (name -> per-seed values) ordered by mean, lowest first, in tiers: a row
    starts a new tier only when it is resolved from every row of the tier before it."""
    means = {name: float(np.mean(list(finite_values(v).values())))
             for name, v in rows.items() if finite_values(v)}
    out: list[list[str]] = []
    for name in sorted(means, key=lambda n: means[n]):
        if out and not all(resolved(rows[name], rows[other], alpha) for other in out[-1]):
            out[-1].append(name)
        else:
            out.append([name])
    return out


def tiers_text(ordered: Sequence[Sequence[str]]) -> str:
    """'a < b ≈ c': ≈ joins rows the seeds do not tell apart."""
    return " < ".join(" ≈ ".join(tier) for tier in ordered)


def _spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    rho = float(scipy_stats.spearmanr(x, y).statistic)
    return None if math.isnan(rho) else rho


def spearman_bootstrap(rows: Mapping[str, PerSeed], paper: Mapping[str, float], *,
                       alpha: float = paired_stats.ALPHA, samples: int = BOOTSTRAP_SAMPLES,
                       seed: int = 0) -> dict[str, Any] | None:
    """Spearman's rho of the rows' means (over the seeds every row holds) against `paper`,
    with its 1 - alpha percentile bootstrap interval over seeds and rho without each row.
    None with fewer than 3 rows that have both. A resample whose means tie throughout has no
    rho and is counted in `undefined`, not in the interval."""
    names = [n for n in rows if n in paper and paper[n] is not None and finite_values(rows[n])]
    if len(names) < 3:
        return None
    values = {n: finite_values(rows[n]) for n in names}
    seeds = sorted(set.intersection(*(set(v) for v in values.values())), key=str)
    if not seeds:
        return None
    table = np.array([[values[n][s] for s in seeds] for n in names])  # rows x seeds
    target = [float(paper[n]) for n in names]
    rho = _spearman(table.mean(axis=1), target)
    out: dict[str, Any] = {"rho": rho, "rows": names, "seeds": seeds, "low": None,
                           "high": None, "resamples": 0, "exact": False, "undefined": 0}
    n = len(seeds)
    if n >= 2:
        exact = n ** n <= EXACT_RESAMPLES
        draws = (np.array(list(itertools.product(range(n), repeat=n))) if exact
                 else np.random.default_rng(seed).integers(0, n, size=(samples, n)))
        rhos = [_spearman(table[:, d].mean(axis=1), target) for d in draws]
        found = np.array([r for r in rhos if r is not None])
        out.update(resamples=len(draws), exact=exact, undefined=len(rhos) - len(found))
        if found.size:
            out["low"], out["high"] = (float(np.quantile(found, q, method="inverted_cdf"))
                                       for q in (alpha / 2, 1 - alpha / 2))
    if len(names) >= 4:
        means = table.mean(axis=1)
        out["without"] = {
            left: _spearman([m for i, m in enumerate(means) if i != k],
                            [t for i, t in enumerate(target) if i != k])
            for k, left in enumerate(names)}
    return out


def spearman_text(result: Mapping[str, Any] | None, what: str = "rows") -> str:
    """One sentence: rho, over which rows and seeds, its interval, and the row it hangs on."""
    if result is None:
        return f"Spearman's rho needs at least 3 {what} with both values."
    seeds = result["seeds"]
    head = (f"Spearman's rho = {result['rho']:.2f}" if result["rho"] is not None
            else "Spearman's rho undefined (ties throughout)")
    text = (f"{head} over {len(result['rows'])} {what}, {len(seeds)} seed"
            f"{'s' if len(seeds) != 1 else ''} ({', '.join(map(str, seeds))})")
    if result["low"] is None:
        text += "; one seed: no interval, a single run per row"
    else:
        how = "every" if result["exact"] else f"{result['resamples']} random"
        text += (f"; 95% bootstrap interval over seeds [{result['low']:.2f}, "
                 f"{result['high']:.2f}] ({how} resample{'s' if how != 'every' else ''} of the "
                 "seeds" + (f", {result['undefined']} without a rho" if result["undefined"]
                            else "") + ")")
    without = {k: v for k, v in (result.get("without") or {}).items() if v is not None}
    if without and result["rho"] is not None:
        row, value = max(without.items(), key=lambda kv: abs(kv[1] - result["rho"]))
        text += f"; without {row} it is {value:.2f}, the row it depends on most"
    return text + "."
