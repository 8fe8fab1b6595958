"""record.json: one file that says what a finished run was, for grids to collect.

Written by loop.finish once train.steps are done: the full config, the code version when
the training loop started (git commit, which tracked files had uncommitted changes, and the
git trees of the package and configs/: code_version; None outside a git checkout), the
hardware and mesh (on a CPU also the XLA_FLAGS and cores the run compiled and ran with:
cpu_settings), tokens seen, model FLOPs
(accounting.train_flops_per_token x tokens), the wall time of the run, the final train and
held-out metrics, and the last telemetry values.

Wall time: a run may take several training calls (stopped, preempted, resumed, extended), and
only the last one writes the record, so each call appends its own loop time to the
workdir's ledger (`add_call`, CALLS_FILE) when it ends, finished or not, and the record's
`wall_seconds` is the sum over the ledger (`train_calls` lists them). A call that starts
from step 0 starts the ledger afresh (what came before it was thrown away); a call killed
outright (SIGKILL, a lost VM) leaves no entry, and `wall_seconds_complete` is then False:
the calls no longer chain from step 0 to the last step, and the sum is a lower bound.
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
import re
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any

import jax

from gated_attention.core import paths

RECORD_FILE = "record.json"
CALLS_FILE = "train_calls.json"  # the ledger of training calls (add_call)
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]


# The folders whose files decide what a training computes: the package and its configs. Runs
# at two commits whose trees of these folders are the same trained the same code.
TRAINING_CODE = ("gated_attention", "configs")


def _git(root: pathlib.Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True,
                             text=True, timeout=20, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout


def training_code_trees(commit: str, root: pathlib.Path | None = None) -> dict[str, str] | None:
    """{folder: git tree sha} of TRAINING_CODE at `commit` in the checkout at `root` (default:
    this code's); None where git does not know it."""
    out = _git(REPO_ROOT if root is None else root, "rev-parse",
               *(f"{commit}:{folder}" for folder in TRAINING_CODE))
    if out is None:
        return None
    shas = out.split()
    return dict(zip(TRAINING_CODE, shas)) if len(shas) == len(TRAINING_CODE) else None


def code_version(root: pathlib.Path = REPO_ROOT) -> dict[str, Any]:
    """{"commit": sha, "dirty": bool, "dirty_paths": the tracked files with uncommitted
    changes, "training_code": training_code_trees at the commit} of the checkout this code
    runs from; {"commit": None, "dirty": None} outside git. The trees and paths let a table
    whose runs span commits say whether they trained the same code."""
    commit = _git(root, "rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    commit = commit.strip()
    status = _git(root, "status", "--porcelain", "--untracked-files=no")
    paths = None if status is None else sorted(
        line[3:].split(" -> ")[-1] for line in status.splitlines() if line.strip())
    return {"commit": commit, "dirty": None if paths is None else bool(paths),
            "dirty_paths": paths, "training_code": training_code_trees(commit, root)}


def host_cpu(cpuinfo: str | None = None) -> dict[str, Any]:
    """The host CPU: its model and vector extensions. XLA:CPU compiles for the host's ISA, so
    a CPU run repeats bit for bit on the same kind of CPU only (AVX-512 against AVX2 changes
    how reductions are vectorised, hence their rounding). cpuinfo: /proc/cpuinfo's text."""
    if cpuinfo is None:
        try:
            cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
        except OSError:  # not Linux
            return {"model_name": platform.processor() or None, "machine": platform.machine()}
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields:
                break  # the first processor's block is enough
            continue
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags", "").split()
    return {"model_name": fields.get("model name"), "family": fields.get("cpu family"),
            "model": fields.get("model"), "machine": platform.machine(),
            "vector_isa": sorted(f for f in flags if f.startswith(("avx", "sse4", "fma", "amx")))}


def cpu_settings(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """What else fixes a CPU run's rounding besides the host: the XLA_FLAGS it compiled under
    (an instruction-set limit, `--xla_cpu_max_isa`, and the thread settings), the limit read
    out of them, and the cores the process may run on (taskset). Two runs on different hosts
    can only agree bit for bit under the same limit and thread settings."""
    environ = os.environ if environ is None else environ
    xla_flags = environ.get("XLA_FLAGS", "")
    found = re.findall(r"--xla_cpu_max_isa=(\S+)", xla_flags)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count()
    return {"xla_flags": xla_flags, "max_isa": found[-1] if found else None,
            "cpu_threads": cores}


def hardware(mesh: Any) -> dict[str, Any]:
    devices = list(mesh.devices.flat)
    first = devices[0]
    return {"platform": first.platform, "device_kind": getattr(first, "device_kind", None),
            "devices": len(devices), "processes": jax.process_count(),
            "mesh": {k: int(v) for k, v in dict(mesh.shape).items()},
            "host": platform.node(), "host_cpu": host_cpu(), **cpu_settings(),
            "python": platform.python_version(), "jax": jax.__version__}


def read_calls(workdir: Any) -> list[dict[str, Any]]:
    """The run's training calls so far (add_call), oldest first; [] when none was recorded."""
    found = paths.read_json_current(workdir / CALLS_FILE)
    return list(found["calls"]) if found else []


def add_call(workdir: Any, *, start_step: int, end_step: int,
             wall_seconds: float) -> list[dict[str, Any]]:
    """Append one training call (the step it started from, the step it reached, its loop's
    wall time) to the workdir's ledger, and return the ledger. Every call records itself as
    it ends, finished, stopped or failed: the call that writes record.json is only the last.
    A call from step 0 replaces the ledger (a fresh start throws the earlier calls' work
    away). Primary process only."""
    calls = [] if int(start_step) == 0 else read_calls(workdir)
    calls.append({"start_step": int(start_step), "end_step": int(end_step),
                  "wall_seconds": float(wall_seconds)})
    paths.write_atomic(workdir / CALLS_FILE, json.dumps({"calls": calls}, indent=2) + "\n")
    return calls


def calls_chain(calls: Sequence[Mapping[str, Any]], steps: int) -> bool:
    """True when the calls cover the run from step 0 to `steps` with none missing: each
    resumes from a checkpoint at or before the step the one before it reached."""
    if not calls or calls[0]["start_step"] != 0 or calls[-1]["end_step"] != int(steps):
        return False
    return all(b["start_step"] <= a["end_step"] for a, b in zip(calls, calls[1:]))


def build(config: Any, *, mesh: Any, steps: int, train: Mapping[str, Any],
          eval_metrics: Mapping[str, Any] | None, telemetry: Mapping[str, Any] | None,
          wall_seconds: float, flops_per_token: float | None,
          code: Mapping[str, Any] | None = None,
          calls: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The record of a finished run. wall_seconds: the loop time of the call writing it;
    calls: the run's ledger (read_calls), that call included. The record's wall time is the
    ledger's sum; without a ledger, this call's time alone (wall_seconds_complete None: no
    one knows whether earlier calls trained part of the run)."""
    tokens = int(steps) * int(config.train.batch_size) * int(config.data.seq_len)
    if calls:
        calls = [dict(c) for c in calls]
        total = sum(float(c["wall_seconds"]) for c in calls)
    else:
        calls, total = [], wall_seconds
    return {
        "config": config.to_dict() if hasattr(config, "to_dict") else dict(config),
        "code": dict(code) if code is not None else code_version(),
        "hardware": hardware(mesh),
        "steps": int(steps), "tokens_seen": tokens,
        "model_flops_per_token": flops_per_token,
        "model_flops": None if flops_per_token is None else flops_per_token * tokens,
        "wall_seconds": total,  # every training call of the run (train_calls)
        "wall_seconds_last_call": wall_seconds,
        "wall_seconds_complete": calls_chain(calls, steps) if calls else None,
        "train_calls": calls,
        "final": {"train": dict(train), "eval": None if eval_metrics is None
                  else dict(eval_metrics)},
        "telemetry": None if telemetry is None else dict(telemetry),
        "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def read(workdir: Any) -> dict[str, Any] | None:
    """A run's record, or None when it has none (not finished, or written before records)."""
    path = workdir / RECORD_FILE
    return json.loads(path.read_text()) if path.exists() else None
