"""Training stability from metrics.jsonl: EMA-smoothed curves, loss spikes, divergence.

Loss-spike rule (LOSS_SPIKE_RULE; one implementation, metrics_writer.SpikeDetector, serves both
this report and the `loss_spike` flag loop.py logs with config.train.spike_factor /
spike_ema): a step is a spike
when its loss exceeds SPIKE_FACTOR (1.5) x the EMA (decay 0.9) of the *previous* losses, once
the step is past the warm-up (the optimizer's warm-up steps). The EMA starts at the first
finite loss and every finite loss (spike or not) updates it; non-finite losses never do (they
count as divergence instead).

Divergence: a non-finite loss, or an EMA-smoothed loss past the warm-up above
`divergence_threshold` (default: DIVERGENCE_FACTOR x the first logged loss, i.e. far worse
than the untrained model). Smoothing keeps a single spike from counting as divergence.

Curves are smoothed like the paper's figures: an EMA of 0.9, debiased the way TensorBoard's
smoothing slider is (so the first points are not pulled towards 0).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gated_attention.config.train_config import EMA_DECAY, SPIKE_FACTOR
from gated_attention.core import paths
from gated_attention.training.metrics_writer import SpikeDetector, read_jsonl

SPIKE_WARMUP_STEPS = 100
DIVERGENCE_FACTOR = 1.5
LOSS_SPIKE_RULE = (f"loss > {SPIKE_FACTOR} x EMA({EMA_DECAY}) of previous losses, "
                   "after warm-up")


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a run's metrics.jsonl (the training loop's own reader); the file must exist."""
    if not paths.resolve(path).exists():
        raise FileNotFoundError(f"{path}: no metrics.jsonl here")
    return read_jsonl(path)


def loss_series(records: Iterable[Mapping[str, Any]], key: str = "loss"
                ) -> list[tuple[int, float]]:
    """(step, value) pairs for records that carry `key` and a step, in step order."""
    pairs = [(int(r["step"]), float(r[key])) for r in records
             if key in r and "step" in r and r[key] is not None]
    return sorted(pairs)


def ema_smooth(values: Sequence[float], decay: float = EMA_DECAY) -> list[float]:
    """Debiased EMA (TensorBoard's smoothing): s_t = decay s_{t-1} + (1-decay) x_t, / (1-decay^n).

    Non-finite values are passed through unchanged and do not enter the average.
    """
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"ema decay={decay} must be in [0, 1)")
    out, last, weight = [], 0.0, 0.0
    for x in values:
        if not math.isfinite(x):
            out.append(x)
            continue
        last = decay * last + (1.0 - decay) * x
        weight = decay * weight + (1.0 - decay)
        out.append(last / weight)
    return out


def stability_report(series: Sequence[tuple[int, float]], *,
                     warmup_steps: int = SPIKE_WARMUP_STEPS, factor: float = SPIKE_FACTOR,
                     decay: float = EMA_DECAY, divergence_threshold: float | None = None
                     ) -> dict[str, Any]:
    """Spikes and divergence of one run's (step, loss) series, as plain Python."""
    if not series:
        return {"points": 0, "spikes": 0, "spike_steps": [], "diverged": False,
                "divergence_step": None, "rule": LOSS_SPIKE_RULE}
    detector = SpikeDetector(factor=factor, decay=decay, warmup_steps=warmup_steps)
    spike_steps = [step for step, loss in series if detector.update(step, loss)]
    finite = [loss for _, loss in series if math.isfinite(loss)]
    if divergence_threshold is None and finite:
        divergence_threshold = DIVERGENCE_FACTOR * finite[0]
    smoothed = ema_smooth([loss for _, loss in series], decay)
    divergence_step = next(
        (step for (step, loss), smooth in zip(series, smoothed, strict=True)
         if not math.isfinite(loss)
         or (step >= warmup_steps and divergence_threshold is not None
             and smooth > divergence_threshold)), None)
    return {
        "points": len(series),
        "spikes": len(spike_steps),
        "spike_steps": spike_steps,
        "diverged": divergence_step is not None,
        "divergence_step": divergence_step,
        "divergence_threshold": divergence_threshold,
        "final_loss": series[-1][1],
        "final_loss_ema": smoothed[-1],
        "min_loss": min(finite) if finite else None,
        "rule": LOSS_SPIKE_RULE,
        "warmup_steps": warmup_steps,
    }
