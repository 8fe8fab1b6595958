"""Grid roots written by hand: the files run_grid, train and analyze leave behind."""

from __future__ import annotations

import json
import pathlib
from collections.abc import Sequence
from typing import Any


def write_run(root: pathlib.Path, name: str, *, variant: str, seed: int, eval_loss: float,
              label: str | None = None, lr_multiplier: float | None = None,
              peak_lr: float = 1e-2, losses: Sequence[float] = (3.0, 2.5, 2.0),
              skipped: Sequence[int] = (), state: str = "done",
              analysis: dict[str, Any] | None = None) -> dict[str, Any]:
    """One run's status, record.json and metrics.jsonl; returns its runs.json entry."""
    (root / "_status").mkdir(parents=True, exist_ok=True)
    (root / "_status" / f"{name}.json").write_text(json.dumps({"state": state}))
    workdir = root / name
    workdir.mkdir(parents=True, exist_ok=True)
    lines = [{"step": 10 * (i + 1), "kind": "train", "loss": loss,
              **({"skipped": 1} if i in skipped else {})} for i, loss in enumerate(losses)]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    if state == "done":
        (workdir / "record.json").write_text(json.dumps({
            "config": {"data": {"seq_len": 64},
                       "optimizer": {"peak_lr": peak_lr, "warmup_steps": 0}},
            "code": {"commit": "abc", "dirty": False}, "tokens_seen": 1000,
            "wall_seconds": 1.0,
            "final": {"train": {"loss": losses[-1]}, "eval": {"loss": eval_loss}}}))
    if analysis is not None:
        (workdir / "analysis").mkdir(exist_ok=True)
        (workdir / "analysis" / "analysis.json").write_text(json.dumps(analysis))
    return {"name": name, "arch": "tiny", "variant": variant, "seed": seed,
            "overrides": {"optimizer.peak_lr": peak_lr}, "table": "", "paper": {},
            "label": label or variant, "lr_multiplier": lr_multiplier}


def write_manifest(root: pathlib.Path, runs: dict[str, dict[str, Any]]) -> None:
    (root / "runs.json").write_text(json.dumps({"grid": "g.py", "scale": "tiny",
                                                "runs": runs}))
