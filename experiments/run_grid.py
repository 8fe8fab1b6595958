"""Run a grid: train every run, then analyse it; resumable, failure-tolerant.

    python -m experiments.run_grid experiments/grids/table1.py --root runs/table1 \
        [--scale tiny] [--seeds 0,1] [--parallel 2] [--set train.steps=200 ...] \
        [--only NAME,...] [--dry_run] [--worker N] [--slice NAME]

Each run trains with `python -m gated_attention.main --config=configs/ablation.py:arch=..,
variant=.. --workdir=<root>/<run> --config.x=y ...` in a subprocess, then is analysed with
`python -m gated_attention.analyze --workdir=<root>/<run>`. Per run, `<root>/_status/<run>.json`
records its state (pending, training, analysing, done, failed) and command, and
`<root>/_logs/` keeps each command's output. A second invocation skips runs that are done,
resumes interrupted ones (main.py resumes from the workdir's latest checkpoint) and retries
failed ones; one failing run never stops the others. `<root>/runs.json` lists the grid.
`--command` / `--analyze_command` replace the launched commands (templates with {python},
{config}, {workdir}, {overrides}, {arch}, {variant}, {seed}); tests use them.

The root may be a bucket (`--root gs://bucket/grids/x`): every path goes through
gated_attention.paths (etils.epath), and the commands get `--workdir=gs://...` as given. A
command cannot stream its output into a bucket object, so it writes to a local spool file
(`--local_logs`, default ~/.cache/gated_attention/grid_logs/<root>/) that is appended to
`<root>/_logs/<log>` while it runs (every LOG_SYNC_SECONDS) and when it ends.

On a pod every worker runs this same command (`--worker`, default $GATED_ATTENTION_WORKER_ID,
else 0): all of them launch the same training commands in the same order, since a multi-host
run needs every worker, but only worker 0 writes into the root (status files, runs.json, logs)
and only worker 0 analyses a run (a single-host job that writes into the run's workdir); the
others meanwhile wait to join the next run (launch_grid.sh gives them an hour). Other workers
read the status files to make the same plan, and keep their logs in the local spool.

With `--slice NAME` several slices share one grid root: each takes the next pending run by
a claim in the bucket that two slices cannot both win (see run_claimed), and analysis waits
until nothing is left to train.
"""

from __future__ import annotations

import ast
import concurrent.futures
import dataclasses
import datetime
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags
from etils import epath

from experiments import grid_lib
from gated_attention import cli_flags, paths, train_command
from gated_attention.pods import claims

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO_ROOT / "configs" / "ablation.py"
# As recorded in commands: relative to the repository (commands run there), so a grid can be
# relaunched from another checkout path.
CONFIG_ARG = "configs/ablation.py"
TRAIN_COMMAND = train_command.TEMPLATE  # the training command, as every launcher builds it
ANALYZE_COMMAND = "{python} -m gated_attention.analyze --workdir={workdir}"
STATUS_DIR, LOG_DIR, MANIFEST = "_status", "_logs", "runs.json"
WORKER_ENV, MULTIHOST_ENV = "GATED_ATTENTION_WORKER_ID", "GATED_ATTENTION_MULTIHOST"
DEFAULT_LOCAL_LOGS = "~/.cache/gated_attention/grid_logs"
LOG_SYNC_SECONDS = 300.0  # how often a running command's output is copied into a remote root
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


def commands(run: grid_lib.Run, root: paths.PathLike, scale: str, settings: Mapping[str, Any],
             train_template: str = TRAIN_COMMAND,
             analyze_template: str = ANALYZE_COMMAND) -> tuple[list[str], list[str]]:
    """The train and analyze command lines of one run, as argument lists.

    `root` is used as a string: a gs:// root gives `--workdir=gs://...` unchanged.
    """
    overrides = grid_lib.run_overrides(run, scale, settings)
    fields = {
        "python": shlex.quote(sys.executable),
        "config": shlex.quote(f"{CONFIG_ARG}:arch={run.arch},variant={run.variant}"),
        "workdir": shlex.quote(f"{os.fspath(root).rstrip('/')}/{run.name}"),
        # "{root}" in a value names the grid root (e.g. train.init_from of a continued run).
        "overrides": " ".join(shlex.quote(flag.replace("{root}", os.fspath(root).rstrip("/")))
                              for flag in train_command.override_flags(overrides)),
        "arch": run.arch, "variant": run.variant, "seed": str(run.seed),
    }
    return (shlex.split(train_template.format(**fields)),
            shlex.split(analyze_template.format(**fields)))


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class GridPlace:
    """Where a grid lives, who this process is, and where its commands' output goes.

    `spool` is the local folder command output is written to while a command runs; None when
    it goes straight into `<root>/_logs` (a local root, worker 0).
    """

    root: epath.Path
    worker: int = 0
    spool: pathlib.Path | None = None

    @property
    def writes_root(self) -> bool:
        return self.worker == 0

    def log_files(self, name: str) -> tuple[pathlib.Path, epath.Path | None]:
        """(local file the command writes, root log it is copied to or None)."""
        if self.spool is None:
            return pathlib.Path(os.fspath(self.root / LOG_DIR / name)), None
        return self.spool / name, (self.root / LOG_DIR / name if self.writes_root else None)

    @property
    def log_dir(self) -> str:
        return os.fspath(self.root / LOG_DIR) if self.writes_root else os.fspath(self.spool)


def spool_dir(root: paths.PathLike, worker: int, local_logs: paths.PathLike = DEFAULT_LOCAL_LOGS
              ) -> pathlib.Path | None:
    """The local folder for command output, or None when it can go straight into the root."""
    root = os.fspath(root)
    if paths.is_local(root) and worker == 0:
        return None
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", root).strip("_") or "root"
    base = pathlib.Path(os.path.abspath(os.path.expanduser(os.fspath(local_logs)))) / name
    return base if worker == 0 else base / f"worker{worker}"


def read_status(root: epath.Path, name: str) -> dict[str, Any] | None:
    """A run's status as stored now (other slices rewrite it), or None before its first."""
    return paths.read_json_current(root / STATUS_DIR / f"{name}.json")


def write_status(place: GridPlace, name: str, status: Mapping[str, Any]) -> None:
    if place.writes_root:  # workers other than 0 never write into the root
        paths.write_atomic(place.root / STATUS_DIR / f"{name}.json",
                           json.dumps(status, indent=2) + "\n")


def _sync_log(local: pathlib.Path, remote: epath.Path, final: bool = True) -> None:
    """Append to `remote` what `local` holds beyond what an earlier sync copied there.

    `<local>.synced` keeps the byte count already copied, so an attempt whose copy was cut
    short (the grid runner killed) is caught up at the next sync, and no byte is copied twice.
    Before the command ends only whole lines are copied. A failed copy is retried next time.
    """
    mark = local.with_name(local.name + ".synced")
    size = local.stat().st_size if local.exists() else 0
    done = int(mark.read_text() or 0) if mark.exists() else 0
    if done > size:  # the spool file was replaced: copy it again from the start
        done = 0
    chunk = b""
    if size > done:
        with open(local, "rb") as f:
            f.seek(done)
            chunk = f.read(size - done)
    if not final:
        chunk = chunk[:chunk.rfind(b"\n") + 1]
    if not chunk:
        return
    try:
        paths.append_text(remote, chunk.decode("utf-8", errors="replace"))
    except Exception as err:  # noqa: BLE001 - a log copy must never stop the grid
        print(f"warning: could not copy {local} to {remote} ({err}); will retry",
              file=sys.stderr, flush=True)
        return
    mark.write_text(str(done + len(chunk)))


def _run_logged(cmd: list[str], place: GridPlace, log_name: str) -> int:
    """Run `cmd` with its output appended to the run's log (local file, copied to the root)."""
    local, remote = place.log_files(log_name)
    local.parent.mkdir(parents=True, exist_ok=True)
    if remote is not None:
        _sync_log(local, remote)  # what an interrupted earlier invocation did not copy
    with open(local, "a") as f:
        f.write(f"\n### {_now()} {shlex.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
        try:
            while True:
                try:
                    rc = proc.wait(timeout=LOG_SYNC_SECONDS if remote is not None else None)
                    break
                except subprocess.TimeoutExpired:
                    _sync_log(local, remote, final=False)
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    if remote is not None:
        _sync_log(local, remote)
    return rc


def _tail(path: paths.PathLike, lines: int = 20) -> str:
    path = paths.resolve(path)
    if not path.exists():
        return ""
    return "\n".join(path.read_bytes().decode(errors="replace").splitlines()[-lines:])


def execute(run: grid_lib.Run, place: GridPlace, train_cmd: list[str],
            analyze_cmd: list[str] | None,
            previous: Mapping[str, Any] | None = None, final_state: str = "done"
            ) -> dict[str, Any]:
    """Train (resuming if interrupted) and analyse one run; returns its final status.

    `previous` is the run's status when the grid was planned (every worker decides from the
    same snapshot whether training is still needed).
    """
    status = dict(previous or {})
    status.update(run.to_dict(), train_command=train_cmd, analyze_command=analyze_cmd,
                  attempts=status.get("attempts", 0) + 1, started=_now())
    steps = [("training", "train", train_cmd)] if not status.get("trained") else []
    if analyze_cmd is not None and place.writes_root:  # analysis is one host's job: worker 0
        steps.append(("analysing", "analyze", analyze_cmd))
    for state, kind, cmd in steps:
        status.update(state=state, error=None)
        write_status(place, run.name, status)
        log_name = f"{run.name}.{kind}.log"
        rc = _run_logged(cmd, place, log_name)
        if rc != 0:
            what = "training" if kind == "train" else "analysis"
            status.update(state="failed", error=f"{what} exited with {rc}",
                          log_tail=_tail(place.log_files(log_name)[0]), finished=_now())
            write_status(place, run.name, status)
            return status
        if kind == "train":
            status["trained"] = True
    status.update(state=final_state, error=None, log_tail=None, finished=_now())
    write_status(place, run.name, status)
    return status


def check_unchanged(root: epath.Path, run: grid_lib.Run, train_cmd: list[str],
                    old: Mapping[str, Any] | None = None) -> None:
    """A run directory must never silently switch to another config."""
    old = read_status(root, run.name) if old is None else old

    def config_args(cmd: Sequence[str]) -> list[str]:  # what decides the run, not the python
        # a config file recorded with an absolute path (older grids) is the repository's
        return [re.sub(r"^--config=.*/configs/", "--config=configs/", a)
                for a in cmd if a.startswith("--config")]

    if old and old.get("train_command") and config_args(old["train_command"]) != config_args(
            train_cmd):
        raise grid_lib.GridError(
            f"run {run.name} in {root} was launched with a different command:\n  "
            f"{shlex.join(old['train_command'])}\nnow:\n  {shlex.join(train_cmd)}\n"
            "Use another --root, or the same --scale/--set as before.")


def write_manifest(root: epath.Path, grid: str, scale: str, runs: Sequence[grid_lib.Run],
                   settings: Mapping[str, Any]) -> None:
    """runs.json: every run this root has held (earlier invocations' runs are kept)."""
    path = root / MANIFEST
    manifest = paths.read_json_current(path) or {"runs": {}}  # other slices rewrite it
    manifest.update(grid=grid, scale=scale, settings=dict(settings), updated=_now())
    for run in runs:
        manifest["runs"][run.name] = {**run.to_dict(),
                                      "overrides": grid_lib.run_overrides(run, scale, settings)}
    paths.write_atomic(path, json.dumps(manifest, indent=2) + "\n")


CLAIM_DIR = "_claims"
CLAIM_POLL_SECONDS = 5.0


def _claim_path(root: epath.Path, name: str) -> str:
    return os.fspath(root / CLAIM_DIR / f"{name}.json")


def _holder(root: epath.Path, name: str) -> str | None:
    record = claims.read_claim(_claim_path(root, name))
    return None if record is None else record.get("holder")


def run_claimed(plan: Sequence[tuple[grid_lib.Run, list[str], list[str] | None]],
                place: GridPlace, slice_name: str, poll_s: float = CLAIM_POLL_SECONDS) -> int:
    """Train the runs this slice claims, sharing the grid with other slices; then analyse.

    Worker 0 first resumes a run its slice already holds (an interrupted attempt), else
    claims the next pending run (`<root>/_claims/<run>.json`, created only if absent: two
    slices cannot both win it). Its other workers follow: they run the first run held by
    their slice that is neither trained nor done (nor trained in this invocation), and stop
    once every pending run is claimed. Analysis is not between trainings (the other workers
    would wait in lock-step): once nothing is left to claim, worker 0 analyses the trained
    runs, each behind its own claim (`<run>.analysis.json`), while the others have left.
    """
    root, finished_here, failed = place.root, set(), []
    while True:
        claims.invalidate_listings()
        statuses = {r.name: read_status(root, r.name) or {} for r, _, _ in plan}
        pending = [p for p in plan if not statuses[p[0].name].get("trained")
                   and statuses[p[0].name].get("state") != "done"]
        mine = next((p for p in pending if p[0].name not in finished_here
                     and _holder(root, p[0].name) == slice_name), None)
        if mine is None and place.writes_root:
            mine = next((p for p in pending if p[0].name not in finished_here
                         and claims.try_claim(_claim_path(root, p[0].name), slice_name,
                                              run=p[0].name)), None)
            if mine is not None:
                print(f"{slice_name}: claimed {mine[0].name}", flush=True)
        if mine is None:
            if place.writes_root or all(_holder(root, p[0].name) for p in pending):
                break
            time.sleep(poll_s)  # worker 0 of this slice is about to claim the next run
            continue
        run, train_cmd, analyze_cmd = mine
        # "trained": analysed once nothing is left to train (else "done" at once)
        later = analyze_cmd is not None and place.writes_root
        status = execute(run, place, train_cmd, None, statuses[run.name],
                         final_state="trained" if later else "done")
        finished_here.add(run.name)
        print(f"[{status['state']}] {run.name}" + (f": {status['error']}" if status.get(
            "error") else ""), flush=True)
        if status["state"] not in ("done", "trained"):
            failed.append(run.name)
    if place.writes_root:
        for run, train_cmd, analyze_cmd in plan:
            status = read_status(root, run.name) or {}
            if analyze_cmd is None or status.get("state") != "trained":
                continue
            analysis_claim = _claim_path(root, f"{run.name}.analysis")
            record = claims.read_claim(analysis_claim)
            if (record or {}).get("holder") != slice_name and not claims.try_claim(
                    analysis_claim, slice_name, run=run.name):
                continue
            status = execute(run, place, train_cmd, analyze_cmd, status)
            print(f"[{status['state']}] {run.name} (analysis)", flush=True)
            if status["state"] != "done":
                failed.append(run.name)
    if failed:
        print(f"{len(failed)} run(s) failed on {slice_name} (logs in {place.log_dir}): "
              + ", ".join(failed))
        return 1
    return 0


CLI = cli_flags.Command("experiments.run_grid", __doc__, positional=("grid",))


def _default_worker() -> int:
    text = os.environ.get(WORKER_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit():
        CLI.error(f"environment variable {WORKER_ENV}={text!r} must be a worker number "
                  "(0, 1, ...)")
    return int(text)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none); the grid
    file is the one positional argument."""
    flags.DEFINE_string("root", None, "Directory that holds the grid's runs (local or "
                        "gs://...).", flag_values=flag_values)
    flags.DEFINE_string("scale", "tiny", f"One of {', '.join(grid_lib.SCALES)}.",
                        flag_values=flag_values)
    flags.DEFINE_string("seeds", "0", "Comma-separated seeds, e.g. 0,1,2.",
                        flag_values=flag_values)
    flags.DEFINE_integer("parallel", 1, "Runs at a time.", flag_values=flag_values)
    flags.DEFINE_multi_string("set", [], "KEY=VALUE: a config override for every run, e.g. "
                              "train.steps=200 (repeatable).", flag_values=flag_values)
    flags.DEFINE_string("only", "", "Comma-separated run names to run.",
                        flag_values=flag_values)
    flags.DEFINE_string("lr_multipliers", "", "Comma-separated multipliers of each run's peak "
                        "learning rate, e.g. 0.5,1,2,4,8 (an LR sweep per variant).",
                        flag_values=flag_values)
    flags.DEFINE_bool("dry_run", False, "Print the commands and stop.", flag_values=flag_values)
    flags.DEFINE_bool("no_analyze", False, "Train only.", flag_values=flag_values)
    flags.DEFINE_string("command", TRAIN_COMMAND, "Train command template.",
                        flag_values=flag_values)
    flags.DEFINE_string("analyze_command", ANALYZE_COMMAND, "Analysis command template.",
                        flag_values=flag_values)
    flags.DEFINE_integer("worker", None, f"This worker's number on a pod (default "
                         f"${WORKER_ENV}, else 0); only worker 0 writes into the root.",
                         flag_values=flag_values)
    flags.DEFINE_string("local_logs", DEFAULT_LOCAL_LOGS, "Local folder for command output "
                        "when the root is remote or the worker is not 0 (a subfolder per "
                        "root).", flag_values=flag_values)
    flags.DEFINE_string("slice", "", "Share the grid with other slices: take runs by claim in "
                        "the root, as this slice (e.g. its TPU name); see run_claimed.",
                        flag_values=flag_values)
    flags.mark_flag_as_required("root", flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    args = CLI.parse(define_flags(flags.FlagValues()), argv)
    if args.slice and not re.fullmatch(r"[A-Za-z0-9._-]+", args.slice):
        CLI.error(f"--slice={args.slice!r} may only hold letters, digits, '.', '-', '_'")
    worker = _default_worker() if args.worker is None else args.worker
    if worker < 0:
        CLI.error(f"--worker={worker} must be >= 0")
    if args.parallel < 1:
        CLI.error(f"--parallel={args.parallel} must be >= 1")
    multihost = os.environ.get(MULTIHOST_ENV, "").strip().lower() in ("1", "true")
    if args.parallel > 1 and (worker != 0 or multihost):
        why = f"worker {worker}" if worker != 0 else f"{MULTIHOST_ENV}=1"
        CLI.error(f"--parallel={args.parallel} with {why}: the runs of a pod use every "
                  "worker and must run one at a time, in the same order on every worker; "
                  "use --parallel 1")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        CLI.error(f"--seeds={args.seeds!r} must be comma-separated integers")
    settings = parse_settings(args.set)
    runs = grid_lib.grid_runs(args.grid, args.scale, seeds)
    if args.lr_multipliers:
        try:
            multipliers = grid_lib.parse_multipliers(args.lr_multipliers)
        except grid_lib.GridError as err:
            CLI.error(str(err))
        runs = grid_lib.with_lr_multipliers(runs, multipliers)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {r.name for r in runs}
        if unknown:
            CLI.error(f"--only names {sorted(unknown)} are not in the grid; runs: "
                      + ", ".join(r.name for r in runs))
        runs = [r for r in runs if r.name in wanted]
    root = paths.resolve(args.root)
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
    place = GridPlace(root, worker, spool_dir(root, worker, args.local_logs))
    # One snapshot of the status files decides the plan, the same on every worker.
    statuses = {run.name: read_status(root, run.name) for run in runs}
    for run, train_cmd, _ in plan:
        check_unchanged(root, run, train_cmd, statuses[run.name] or {})
    if place.writes_root:
        write_manifest(root, str(args.grid), args.scale, runs, settings)
    if args.slice:
        if args.parallel > 1:
            CLI.error("--slice runs one run at a time on its slice: use --parallel 1")
        return run_claimed(plan, place, args.slice)
    todo = [p for p in plan if (statuses[p[0].name] or {}).get("state") != "done"]
    print(f"{len(plan)} runs in {root}: {len(plan) - len(todo)} done, {len(todo)} to run")
    if not place.writes_root:
        print(f"worker {worker}: running the same commands as worker 0, writing nothing into "
              f"the root; logs in {place.spool}", flush=True)
    failed = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.parallel) as pool:
        futures = {pool.submit(execute, run, place, t, a, statuses[run.name]): run
                   for run, t, a in todo}
        for future in concurrent.futures.as_completed(futures):
            status = future.result()
            with _lock:
                print(f"[{status['state']}] {status['name']}"
                      + (f": {status['error']}" if status.get("error") else ""), flush=True)
            if status["state"] != "done":
                failed.append(status["name"])
    if failed:
        print(f"{len(failed)} run(s) failed (logs in {place.log_dir}): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
