"""The tiniest training the configs allow, as `python -m gated_attention.main` flags, for the
launcher tests that run the real trainer (SLURM, GKE's container command, TPU VM launches):
one layer of width 32, byte tokens, checkpoints every few steps (saved synchronously, so a
stopped run's last save is complete when it exits); and the wait for what a launched process
prints or writes."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(condition: Callable[[], Any], what: str, timeout: float = 240.0) -> Any:
    """`condition()`'s first true value, polled every 0.05 s; AssertionError naming `what`
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def tiny_flags(steps: int, checkpoint_every: int) -> list[str]:
    return ["--config.model.num_layers=1", "--config.model.d_model=32",
            "--config.model.num_heads=2", "--config.model.num_kv_heads=1",
            "--config.model.head_dim=16", "--config.model.mlp_dim=64",
            "--config.model.vocab_size=260", "--config.data.tokenizer=byte",
            "--config.data.seq_len=32", "--config.train.batch_size=4",
            f"--config.train.steps={steps}", f"--config.train.checkpoint_every={checkpoint_every}",
            "--config.train.log_every=1", f"--config.train.eval_every={steps}",
            "--config.train.eval_batches=1", "--config.optimizer.warmup_steps=2",
            "--config.train.async_checkpoint=false"]
