"""Checks of the run config's `train` section (its defaults: run_config.train_section).

Field checks only: `train.init_from` names another run, whose files are read where they are
opened (init_from.check_source, before anything is compiled)."""

from __future__ import annotations

import os
from typing import Any

from gated_attention.core.checks import choice, require

ON_NONFINITE = ("stop", "skip")
LOSS_TILES = ("vocab", "tokens")  # the axis the chunked loss tiles (run_config.train_section)
# A loss spike: a loss above SPIKE_FACTOR x the EMA (decay EMA_DECAY) of the previous losses
# (train.spike_factor, train.spike_ema; analysis/stability.py).
SPIKE_FACTOR = 1.5
EMA_DECAY = 0.9
LOGITS_DTYPES = ("float32", "compute")  # what the logits matmul writes (train.logits_dtype)


def check_section(train: Any) -> None:
    """Raise ConfigError naming the first `train.*` field out of its range."""
    require(train.steps > 0, f"train.steps={train.steps} must be > 0")
    require(train.batch_size > 0, f"train.batch_size={train.batch_size} must be > 0")
    require(train.grad_accum >= 1, f"train.grad_accum={train.grad_accum} must be >= 1")
    require(train.batch_size % train.grad_accum == 0,
            f"train.batch_size={train.batch_size} must be divisible by "
            f"train.grad_accum={train.grad_accum} (micro-batches of equal size)")
    for name in ("eval_every", "eval_batches", "checkpoint_every"):
        require(train[name] >= 0, f"train.{name}={train[name]} must be >= 0 (0 disables it)")
    require(train.log_every > 0, f"train.log_every={train.log_every} must be > 0")
    require(train.keep_checkpoints >= 1,
            f"train.keep_checkpoints={train.keep_checkpoints} must be >= 1")
    for name in ("z_loss", "moe_aux_weight", "moe_z_loss_weight"):
        require(train[name] >= 0, f"train.{name}={train[name]} must be >= 0")
    require(train.get("init_from_step", 0) >= 0, f"train.init_from_step="
            f"{train.get('init_from_step')} must be >= 0 (0 = the latest checkpoint)")
    require(train.spike_factor > 1.0, f"train.spike_factor={train.spike_factor} must be > 1")
    require(0.0 <= train.spike_ema < 1.0, f"train.spike_ema={train.spike_ema} must be in [0, 1)")
    choice("train.on_nonfinite", train.get("on_nonfinite", "stop"), ON_NONFINITE)
    require(train.get("max_skipped", 1) >= 1,
            f"train.max_skipped={train.get('max_skipped')} must be >= 1")
    require(isinstance(train.get("init_by_name", False), bool),
            f"train.init_by_name={train.get('init_by_name')!r} must be True or False")
    every = train.get("telemetry_every", 0)
    require(isinstance(every, int) and not isinstance(every, bool) and every >= 0,
            f"train.telemetry_every={every!r} must be an integer >= 0 (0 = off)")
    chunk = train.get("loss_chunk_size", 0)
    require(isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 0,
            f"train.loss_chunk_size={chunk!r} must be an integer >= 0 (entries per tile of the "
            "chunked loss along train.loss_tiles; 0 = the plain loss)")
    choice("train.loss_tiles", train.get("loss_tiles", "vocab"), LOSS_TILES)
    choice("train.logits_dtype", train.get("logits_dtype", "float32"), LOGITS_DTYPES)
    for name in ("step_timeout_s", "first_step_timeout_s"):
        require(train.get(name, 0.0) >= 0,
                f"train.{name}={train.get(name)} must be >= 0 seconds (0 turns the watchdog off)")


HARNESS_FIELDS = dict(harness_every=0, harness_tasks="", harness_include_path="", harness_limit=0,
              harness_batch_size=16)


def check_harness_fields(train: Any) -> None:
    """ConfigError naming the first harness field out of range (run before anything runs)."""
    every = train.get("harness_every", 0)
    require(isinstance(every, int) and not isinstance(every, bool) and every >= 0,
            f"train.harness_every={every!r} must be an integer >= 0 (0 = off)")
    tasks = train.get("harness_tasks", "")
    require(isinstance(tasks, str), f"train.harness_tasks={tasks!r} must be a comma-separated "
            "string of lm-eval task names")
    require(not every or bool(harness_task_names(train)), "train.harness_every="
            f"{every} needs train.harness_tasks (comma-separated lm-eval task names)")
    include = train.get("harness_include_path", "")
    require(not include or os.path.isdir(include), f"train.harness_include_path={include!r} "
            "is not a folder (lm-eval task YAML files)")
    for name in ("harness_limit", "harness_batch_size"):
        value = train.get(name, HARNESS_FIELDS[name])
        require(isinstance(value, int) and value >= (1 if name == "harness_batch_size" else 0),
                f"train.{name}={value!r} must be an integer >= "
                f"{1 if name == 'harness_batch_size' else '0 (0 = every example)'}")


def harness_task_names(train: Any) -> list[str]:
    return [t.strip() for t in str(train.get("harness_tasks", "")).split(",") if t.strip()]
