"""AdamW with the paper's schedule: linear warm-up to peak_lr, cosine decay to final_lr.

Weight decay skips every parameter that is not a matrix (norm scales, sink logits) and the
input-independent gate's theta (a bias in all but name). Gradients are clipped by global
norm first (clip_norm=0 turns clipping off).
"""

from __future__ import annotations

from typing import Any

import jax
import optax

from gated_attention.config.optimizer_config import schedule_span

NO_DECAY_NAMES = ("theta", "sink_logits", "scale", "bias")


def learning_rate_schedule(opt: Any, total_steps: int) -> optax.Schedule:
    """lr(step): 0 -> peak_lr linearly over warmup_steps, then cosine to final_lr at T
    (optimizer_config.schedule_span: total_steps unless optimizer.schedule_steps names another).

    lr(t) = peak * t / W for t < W, else final + (peak - final) * (1 + cos(pi * (t - W) /
    (T - W))) / 2, constant final_lr after T (optax.warmup_cosine_decay_schedule).
    """
    span = schedule_span(opt, total_steps)
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=opt.peak_lr, warmup_steps=opt.warmup_steps,
        decay_steps=max(span, opt.warmup_steps + 1), end_value=opt.final_lr)


def _path_names(path: tuple[Any, ...]) -> list[str]:
    return [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]


def decay_mask(params: Any) -> Any:
    """True for parameters that get weight decay: matrices, except gate thetas / biases."""

    def decays(path: tuple[Any, ...], leaf: Any) -> bool:
        names = _path_names(path)
        return leaf.ndim >= 2 and not any(n in NO_DECAY_NAMES for n in names)

    return jax.tree_util.tree_map_with_path(decays, params)


def make_optimizer(opt: Any, total_steps: int) -> optax.GradientTransformation:
    schedule = learning_rate_schedule(opt, total_steps)
    adamw = optax.adamw(schedule, b1=opt.b1, b2=opt.b2, eps=opt.eps,
                        weight_decay=opt.weight_decay, mask=decay_mask)
    parts = [optax.clip_by_global_norm(opt.clip_norm)] if opt.clip_norm > 0 else []
    return optax.chain(*parts, adamw)
