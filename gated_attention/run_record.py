"""record.json: one file that says what a finished run was, for grids to collect.

Written by train.finish once train.steps are done: the full config, the code version when
the training loop started (git commit and whether tracked files had uncommitted changes;
None outside a git checkout), the
hardware and mesh, tokens seen, model FLOPs (accounting.train_flops_per_token x tokens), the
wall time of the training call that finished the run (and of the whole run where earlier
calls were recorded), the final train and held-out metrics, and the last telemetry values.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import platform
import subprocess
from collections.abc import Mapping
from typing import Any

import jax

RECORD_FILE = "record.json"
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


def code_version(root: pathlib.Path = REPO_ROOT) -> dict[str, Any]:
    """{"commit": sha or None, "dirty": bool or None} of the checkout this code runs from."""

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                                 text=True, timeout=20, check=True)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit.strip(), "dirty": None if status is None else bool(status.strip())}


def hardware(mesh: Any) -> dict[str, Any]:
    devices = list(mesh.devices.flat)
    first = devices[0]
    return {"platform": first.platform, "device_kind": getattr(first, "device_kind", None),
            "devices": len(devices), "processes": jax.process_count(),
            "mesh": {k: int(v) for k, v in dict(mesh.shape).items()},
            "host": platform.node(), "python": platform.python_version(),
            "jax": jax.__version__}


def build(config: Any, *, mesh: Any, steps: int, train: Mapping[str, Any],
          eval_metrics: Mapping[str, Any] | None, telemetry: Mapping[str, Any] | None,
          wall_seconds: float, flops_per_token: float | None,
          code: Mapping[str, Any] | None = None) -> dict[str, Any]:
    tokens = int(steps) * int(config.train.batch_size) * int(config.data.seq_len)
    return {
        "config": config.to_dict() if hasattr(config, "to_dict") else dict(config),
        "code": dict(code) if code is not None else code_version(),
        "hardware": hardware(mesh),
        "steps": int(steps), "tokens_seen": tokens,
        "model_flops_per_token": flops_per_token,
        "model_flops": None if flops_per_token is None else flops_per_token * tokens,
        "wall_seconds": wall_seconds,
        "final": {"train": dict(train), "eval": None if eval_metrics is None
                  else dict(eval_metrics)},
        "telemetry": None if telemetry is None else dict(telemetry),
        "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def read(workdir: Any) -> dict[str, Any] | None:
    """A run's record, or None when it has none (not finished, or written before records)."""
    path = workdir / RECORD_FILE
    return json.loads(path.read_text()) if path.exists() else None
