"""Checks of the run config's `optimizer` section (its defaults: run_config.optimizer_section;
what they build: training/optim.py)."""

from __future__ import annotations

from typing import Any

from gated_attention.core.checks import require


def schedule_span(opt: Any, total_steps: int) -> int:
    """The step T the cosine reaches final_lr at: optimizer.schedule_steps, or train.steps
    (`total_steps`) when it is 0. A longer span trains the first steps of a longer run, step
    for step."""
    return int(opt.get("schedule_steps", 0)) or total_steps


def check_section(opt: Any, total_steps: int) -> None:
    """Raise ConfigError naming the first `optimizer.*` field out of its range (the schedule
    spans `total_steps`, train.steps)."""
    require(opt.peak_lr > 0, f"optimizer.peak_lr={opt.peak_lr} must be > 0")
    require(0 <= opt.final_lr <= opt.peak_lr,
            f"optimizer.final_lr={opt.final_lr} must be in [0, peak_lr={opt.peak_lr}]")
    span = opt.get("schedule_steps", 0)
    require(isinstance(span, int) and span >= 0, f"optimizer.schedule_steps={span!r} must be "
            "an integer >= 0 (0 = train.steps)")
    span_name = f"optimizer.schedule_steps={span}" if span else f"train.steps={total_steps}"
    require(0 <= opt.warmup_steps <= schedule_span(opt, total_steps),
            f"optimizer.warmup_steps={opt.warmup_steps} must be in [0, {span_name}]")
    for name in ("b1", "b2"):
        require(0.0 <= opt[name] < 1.0, f"optimizer.{name}={opt[name]} must be in [0, 1)")
    require(opt.eps > 0, f"optimizer.eps={opt.eps} must be > 0")
    require(opt.weight_decay >= 0, f"optimizer.weight_decay={opt.weight_decay} must be >= 0")
    require(opt.clip_norm >= 0, f"optimizer.clip_norm={opt.clip_norm} must be >= 0 (0 = off)")
