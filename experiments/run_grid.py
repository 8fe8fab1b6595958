"""Run a grid locally: train every run, then analyse it; resumable, failure-tolerant.

    python -m experiments.run_grid experiments/grids/table1.py --root runs/table1 \
        [--scale tiny] [--seeds 0,1] [--parallel 2] [--set train.steps=200 ...] \
        [--only NAME,...] [--dry_run]

Each run trains with `python -m gated_attention.main --config=configs/ablation.py:arch=..,
variant=.. --workdir=<root>/<run> --config.x=y ...` in a subprocess, then is analysed with
`python -m gated_attention.analyze --workdir=<root>/<run>`. Per run, `<root>/_status/<run>.json`
records its state (pending, training, analysing, done, failed) and command, and
`<root>/_logs/` keeps each command's output. A second invocation skips runs that are done,
resumes interrupted ones (main.py resumes from the workdir's latest checkpoint) and retries
failed ones; one failing run never stops the others. `<root>/runs.json` lists the grid.
`--command` / `--analyze_command` replace the launched commands (templates with {python},
{config}, {workdir}, {overrides}, {arch}, {variant}, {seed}); tests use them.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from experiments import grid_lib

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO_ROOT / "configs" / "ablation.py"
TRAIN_COMMAND = "{python} -m gated_attention.main --config={config} --workdir={workdir} {overrides}"
ANALYZE_COMMAND = "{python} -m gated_attention.analyze --workdir={workdir}"
STATUS_DIR, LOG_DIR, MANIFEST = "_status", "_logs", "runs.json"
_lock = threading.Lock()


def parse_settings(items: Sequence[str]) -> dict[str, Any]:
    """--set key=value pairs; values are Python literals where they parse, else strings."""
    out: dict[str, Any] = {}
    for item in items:
        if "=" not in item:
            raise grid_lib.GridError(f"--set {item!r} must look like section.field=value")
        key, text = item.split("=", 1)
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            value = text
        out[key.strip()] = value
    return out


def _format_value(value: Any) -> str:
    return str(value) if not isinstance(value, float) else repr(value)


def commands(run: grid_lib.Run, root: pathlib.Path, scale: str, settings: Mapping[str, Any],
             train_template: str = TRAIN_COMMAND,
             analyze_template: str = ANALYZE_COMMAND) -> tuple[list[str], list[str]]:
    """The train and analyse command lines of one run, as argument lists."""
    overrides = grid_lib.run_overrides(run, scale, settings)
    fields = {
        "python": shlex.quote(sys.executable),
        "config": shlex.quote(f"{CONFIG_FILE}:arch={run.arch},variant={run.variant}"),
        "workdir": shlex.quote(str(root / run.name)),
        "overrides": " ".join(shlex.quote(f"--config.{k}={_format_value(v)}")
                              for k, v in overrides.items()),
        "arch": run.arch, "variant": run.variant, "seed": str(run.seed),
    }
    return (shlex.split(train_template.format(**fields)),
            shlex.split(analyze_template.format(**fields)))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def read_status(root: pathlib.Path, name: str) -> dict[str, Any] | None:
    path = root / STATUS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def write_status(root: pathlib.Path, name: str, status: Mapping[str, Any]) -> None:
    path = root / STATUS_DIR / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(status, indent=2) + "\n")
    tmp.replace(path)


def _run_logged(cmd: list[str], log: pathlib.Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"\n### {_now()} {shlex.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT).returncode


def _tail(path: pathlib.Path, lines: int = 20) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def execute(run: grid_lib.Run, root: pathlib.Path, train_cmd: list[str],
            analyze_cmd: list[str] | None) -> dict[str, Any]:
    """Train (resuming if interrupted) and analyse one run; returns its final status."""
    status = read_status(root, run.name) or {}
    status.update(run.to_dict(), train_command=train_cmd, analyze_command=analyze_cmd,
                  attempts=status.get("attempts", 0) + 1, started=_now())
    logs = root / LOG_DIR
    if not status.get("trained"):
        status.update(state="training", error=None)
        write_status(root, run.name, status)
        rc = _run_logged(train_cmd, logs / f"{run.name}.train.log")
        if rc != 0:
            status.update(state="failed", error=f"training exited with {rc}",
                          log_tail=_tail(logs / f"{run.name}.train.log"), finished=_now())
            write_status(root, run.name, status)
            return status
        status["trained"] = True
    if analyze_cmd is not None:
        status.update(state="analysing")
        write_status(root, run.name, status)
        rc = _run_logged(analyze_cmd, logs / f"{run.name}.analyze.log")
        if rc != 0:
            status.update(state="failed", error=f"analysis exited with {rc}",
                          log_tail=_tail(logs / f"{run.name}.analyze.log"), finished=_now())
            write_status(root, run.name, status)
            return status
    status.update(state="done", error=None, log_tail=None, finished=_now())
    write_status(root, run.name, status)
    return status


def check_unchanged(root: pathlib.Path, run: grid_lib.Run, train_cmd: list[str]) -> None:
    """A run directory must never silently switch to another config."""
    old = read_status(root, run.name)

    def config_args(cmd: Sequence[str]) -> list[str]:  # what decides the run, not the python
        return [a for a in cmd if a.startswith("--config")]

    if old and old.get("train_command") and config_args(old["train_command"]) != config_args(
            train_cmd):
        raise grid_lib.GridError(
            f"run {run.name} in {root} was launched with a different command:\n  "
            f"{shlex.join(old['train_command'])}\nnow:\n  {shlex.join(train_cmd)}\n"
            "Use another --root, or the same --scale/--set as before.")


def write_manifest(root: pathlib.Path, grid: str, scale: str, runs: Sequence[grid_lib.Run],
                   settings: Mapping[str, Any]) -> None:
    """runs.json: every run this root has held (earlier invocations' runs are kept)."""
    path = root / MANIFEST
    manifest = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    manifest.update(grid=grid, scale=scale, settings=dict(settings), updated=_now())
    for run in runs:
        manifest["runs"][run.name] = {**run.to_dict(),
                                      "overrides": grid_lib.run_overrides(run, scale, settings)}
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("grid", help="grid file, e.g. experiments/grids/table1.py")
    parser.add_argument("--root", required=True, help="directory that holds the grid's runs")
    parser.add_argument("--scale", default="tiny", help=f"one of {', '.join(grid_lib.SCALES)}")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds, e.g. 0,1,2")
    parser.add_argument("--parallel", type=int, default=1, help="runs at a time")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="config override for every run, e.g. train.steps=200")
    parser.add_argument("--only", default="", help="comma-separated run names to run")
    parser.add_argument("--dry_run", action="store_true", help="print the commands and stop")
    parser.add_argument("--no_analyze", action="store_true", help="train only")
    parser.add_argument("--command", default=TRAIN_COMMAND, help="train command template")
    parser.add_argument("--analyze_command", default=ANALYZE_COMMAND,
                        help="analysis command template")
    args = parser.parse_args(argv)
    if args.parallel < 1:
        parser.error(f"--parallel={args.parallel} must be >= 1")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--seeds={args.seeds!r} must be comma-separated integers")
    settings = parse_settings(args.set)
    runs = grid_lib.grid_runs(args.grid, args.scale, seeds)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {r.name for r in runs}
        if unknown:
            parser.error(f"--only names {sorted(unknown)} are not in the grid; runs: "
                         + ", ".join(r.name for r in runs))
        runs = [r for r in runs if r.name in wanted]
    root = pathlib.Path(args.root).absolute()
    plan = []
    for run in runs:
        train_cmd, analyze_cmd = commands(run, root, args.scale, settings, args.command,
                                          args.analyze_command)
        plan.append((run, train_cmd, None if args.no_analyze else analyze_cmd))
    if args.dry_run:
        for run, train_cmd, analyze_cmd in plan:
            print(f"# {run.name}\n{shlex.join(train_cmd)}")
            if analyze_cmd:
                print(shlex.join(analyze_cmd))
        return 0
    for run, train_cmd, _ in plan:
        check_unchanged(root, run, train_cmd)
    write_manifest(root, str(args.grid), args.scale, runs, settings)
    todo = [p for p in plan if (read_status(root, p[0].name) or {}).get("state") != "done"]
    print(f"{len(plan)} runs in {root}: {len(plan) - len(todo)} done, {len(todo)} to run")
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = {pool.submit(execute, run, root, t, a): run for run, t, a in todo}
        for future in concurrent.futures.as_completed(futures):
            status = future.result()
            with _lock:
                print(f"[{status['state']}] {status['name']}"
                      + (f": {status['error']}" if status.get("error") else ""), flush=True)
            if status["state"] != "done":
                failed.append(status["name"])
    if failed:
        print(f"{len(failed)} run(s) failed (logs in {root / LOG_DIR}): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
