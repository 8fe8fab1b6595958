"""Run a grid as Ray work: every run trained (resuming, retried when a host is lost), then analysed.

    python -m experiments.run_grid experiments/grids/table1.py --root runs/table1 \
        [--scale tiny] [--seeds 0,1] [--parallel 2] [--set train.steps=200 ...] \
        [--only NAME,...] [--dry_run] [--ray_address auto] [--max_retries 3] \
        [--tpu v5p:2x2x2 [--num_slices 2]] [--hosts 2 --gpus 8]

Each run trains with `python -m gated_attention.main --config=configs/ablation.py:arch=..,
variant=.. --workdir=<root>/<run> --config.x=y ...`, then is analysed with
`python -m gated_attention.analyze --workdir=<root>/<run>`, each command a Ray task on the hosts
the run reserved (experiments.ray_grid): by default one CPU on this machine (`ray.init()`
starts Ray here; runs go in parallel as far as its CPUs and `--parallel` allow); with
`--ray_address=auto` (or `ray://...`) on a Ray cluster, with whole TPU slices (`--tpu`,
`--num_slices`) or whole GPU nodes (`--hosts`, `--gpus`) per run.

The grid's state is Ray's plus what each run leaves in its workdir; the driver writes, per
run, `<root>/_status/<run>.json` (pending, training, analysing, done, failed; the commands;
every attempt with its outcome) and `<root>/runs.json` (the grid's runs). A run whose host is
lost, or whose trainer stops after saving (SIGTERM: exit 143), is tried again, up to
`--max_retries` times, and resumes from its checkpoint; one that fails for another reason is
reported with its log's last lines and not retried in this invocation. Each command's output
is appended, attempt after attempt, to `<root>/_logs/<run>.<train|analyze>.log` (at most
ray_grid.LOG_SYNC_SECONDS behind while it runs; other hosts of a run: `.hostN.log`). A second
invocation skips runs that are done, resumes the others and never starts a run that a live
driver holds (ray_grid.guard). `--command` / `--analyze_command` replace the launched commands
(templates with {python}, {config}, {workdir}, {overrides}, {arch}, {variant}, {seed}).

The root may be a bucket (`--root gs://bucket/grids/x`), which a Ray cluster needs (its nodes
do not share a disk): every path goes through gated_attention.core.paths, and the commands get
`--workdir=gs://...` as given.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import json
import os
import pathlib
import re
import shlex
import signal
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags
from etils import epath

from experiments import grid_lib
from gated_attention.cli import flags as cli_flags
from gated_attention.cli import train_command
from gated_attention.core import paths

REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_FILE = REPO_ROOT / "configs" / "ablation.py"
# As recorded in commands: relative to the repository (commands run there), so a grid can be
# relaunched from another checkout path.
CONFIG_ARG = "configs/ablation.py"
TRAIN_COMMAND = train_command.TEMPLATE  # the training command, as every launcher builds it
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




def _now() -> str:
    import datetime

    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def read_status(root: epath.Path, name: str) -> dict[str, Any] | None:
    """A run's status as the driver last wrote it, or None before its first."""
    return paths.read_json_current(root / STATUS_DIR / f"{name}.json")


def write_status(root: epath.Path, name: str, status: Mapping[str, Any]) -> None:
    paths.write_atomic(root / STATUS_DIR / f"{name}.json", json.dumps(status, indent=2) + "\n")


def _tail(path: paths.PathLike, lines: int = 20) -> str:
    path = paths.resolve(path)
    if not path.exists():
        return ""
    return "\n".join(path.read_bytes().decode(errors="replace").splitlines()[-lines:])


def project_dir() -> str:
    """Where the commands run (they name configs/ relative to it): this checkout, else the
    folder the driver was started in (an installed wheel, configs/ beside it on a cluster)."""
    return os.fspath(REPO_ROOT if (REPO_ROOT / "configs").is_dir() else pathlib.Path.cwd())


def execute(run: grid_lib.Run, root: epath.Path, train_cmd: list[str],
            analyze_cmd: list[str] | None, placement: Any, max_retries: int,
            previous: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Train (resuming) and analyse one run on Ray, holding its guard; returns its status.

    Each step is tried again when an attempt ends in a lost host or a stop after saving, up
    to `max_retries` times in all; the status keeps every attempt (`history`) and the count
    (`retries`). A run another live driver holds comes back as state "busy", untouched.
    """
    from experiments import ray_grid

    workdir = os.fspath(root / run.name)
    with ray_grid.guard(workdir) as held:
        if not held:
            return {"name": run.name, "state": "busy",
                    "error": "another live driver is running it (its Ray guard is held)"}
        status = dict(previous or {})
        status.update(run.to_dict(), train_command=train_cmd, analyze_command=analyze_cmd,
                      started=_now(), retries=status.get("retries", 0),
                      history=list(status.get("history", [])))
        steps = [] if status.get("trained") else [("training", "train", train_cmd, placement)]
        if analyze_cmd is not None:  # analysis is one host's job: one CPU
            steps.append(("analysing", "analyze", analyze_cmd, grid_lib.Placement()))
        retries = 0
        for state, kind, cmd, where in steps:
            log_name = f"{run.name}.{kind}.log"
            while True:
                status.update(state=state, error=None, attempts=status.get("attempts", 0) + 1)
                write_status(root, run.name, status)
                entry = {"attempt": status["attempts"], "step": kind, "started": _now()}
                if ray_grid.STOPPING.is_set():
                    outcome = ray_grid.Outcome("stopped", "the driver was stopped", [])
                else:
                    reservation = ray_grid.reserve(where)
                    try:
                        outcome = ray_grid.Outcome("stopped", "the driver was stopped", [])
                        if not ray_grid.STOPPING.is_set():  # stopped while waiting for hosts
                            outcome = ray_grid.attempt(
                                reservation, cmd, log_name, os.fspath(root),
                                f"{run.name} attempt {status['attempts']}", project_dir(),
                                workdir)
                    finally:
                        reservation.release()
                    if ray_grid.STOPPING.is_set() and outcome.kind == "retry":
                        outcome.kind = "stopped"
                entry.update(ended=_now(), outcome=outcome.kind, detail=outcome.detail,
                             exits=outcome.exits)
                status["history"].append(entry)
                if outcome.kind == "done":
                    break
                if outcome.kind == "retry" and retries < max_retries:
                    retries += 1
                    status["retries"] += 1
                    print(f"[retry {retries}/{max_retries}] {run.name}: {outcome.detail}",
                          flush=True)
                    continue
                what = "training" if kind == "train" else "analysis"
                error = (outcome.detail if outcome.kind != "retry" else
                         f"{what}: {outcome.detail}; gave up after {max_retries} retries")
                status.update(state="stopped" if outcome.kind == "stopped" else "failed",
                              error=error, log_tail=_tail(root / LOG_DIR / log_name),
                              finished=_now())
                write_status(root, run.name, status)
                return status
            if kind == "train":
                status["trained"] = True
        status.update(state="done", error=None, log_tail=None, finished=_now())
        write_status(root, run.name, status)
        return status


CLI = cli_flags.Command("experiments.run_grid", __doc__, positional=("grid",))


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none); the grid
    file is the one positional argument."""
    grid_lib.define_selection_flags(
        flag_values, "Directory that holds the grid's runs (local or gs://...; a bucket on a "
        "Ray cluster).", "Comma-separated run names to run.")
    flags.DEFINE_integer("parallel", 0, "Runs at a time at most (0: as many as Ray has hosts "
                         "for).", flag_values=flag_values)
    flags.DEFINE_multi_string("set", [], "KEY=VALUE: a config override for every run, e.g. "
                              "train.steps=200 (repeatable).", flag_values=flag_values)
    flags.DEFINE_string("lr_multipliers", "", "Comma-separated multipliers of each run's peak "
                        "learning rate, e.g. 0.5,1,2,4,8 (an LR sweep per variant).",
                        flag_values=flag_values)
    flags.DEFINE_bool("dry_run", False, "Print the commands and stop.", flag_values=flag_values)
    flags.DEFINE_bool("no_analyze", False, "Train only.", flag_values=flag_values)
    flags.DEFINE_string("command", TRAIN_COMMAND, "Train command template.",
                        flag_values=flag_values)
    flags.DEFINE_string("analyze_command", ANALYZE_COMMAND, "Analysis command template.",
                        flag_values=flag_values)
    flags.DEFINE_string("ray_address", "", "Ray cluster to submit to: auto (the cluster this "
                        "machine belongs to, as under `ray job submit`), ray://HOST:10001, or "
                        "HOST:6379; empty: start Ray on this machine.", flag_values=flag_values)
    flags.DEFINE_integer("max_retries", 3, "Attempts per run after a lost host or a stop "
                         "after saving (a code failure is never retried).",
                         flag_values=flag_values)
    flags.DEFINE_string("tpu", "", "Whole TPU slices per run, <generation>:<topology>, e.g. "
                        "v5p:2x2x2 (ray.util.tpu.slice_placement_group).",
                        flag_values=flag_values)
    flags.DEFINE_integer("num_slices", 1, "TPU slices per run (multislice).",
                         flag_values=flag_values)
    flags.DEFINE_integer("hosts", 1, "CPU/GPU hosts per run (one per node).",
                         flag_values=flag_values)
    flags.DEFINE_float("cpus", 1.0, "CPUs per host of a CPU/GPU run.", flag_values=flag_values)
    flags.DEFINE_float("gpus", 0.0, "GPUs per host (a whole node: its GPU count).",
                       flag_values=flag_values)
    flags.mark_flag_as_required("root", flag_values=flag_values)
    return flag_values


def _plan(args: Any) -> list[tuple[grid_lib.Run, list[str], list[str] | None]]:
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
    args.settings = settings
    return plan


@contextlib.contextmanager
def _stop_on_sigterm():
    """While the grid runs, SIGTERM to the driver (`ray job stop`, a preempted head) stops it
    as Ctrl-C does: every running trainer gets SIGTERM, saves, and is waited for."""
    from experiments import ray_grid

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(*_: Any) -> None:
        ray_grid.say(f"{ray_grid.now()} SIGTERM: stopping the grid", fd=1)
        cancelled = ray_grid.stop_all()
        ray_grid.say(f"{ray_grid.now()} SIGTERM: {cancelled} running host(s) told to save and "
                     "stop; waiting for them", fd=1)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None) -> int:
    args = CLI.parse(define_flags(flags.FlagValues()), argv)
    if args.parallel < 0:
        CLI.error(f"--parallel={args.parallel} must be >= 0")
    if args.max_retries < 0:
        CLI.error(f"--max_retries={args.max_retries} must be >= 0")
    placement = grid_lib.Placement(tpu=args.tpu, num_slices=args.num_slices, hosts=args.hosts,
                                   cpus=args.cpus, gpus=args.gpus)
    try:
        placement.check()
    except grid_lib.GridError as err:
        CLI.error(str(err))
    plan = _plan(args)
    if args.dry_run:
        for run, train_cmd, analyze_cmd in plan:
            print(f"# {run.name}\n{shlex.join(train_cmd)}")
            if analyze_cmd:
                print(shlex.join(analyze_cmd))
        return 0
    from experiments import ray_grid

    root = paths.resolve(args.root)
    statuses = {run.name: read_status(root, run.name) for run, _, _ in plan}
    for run, train_cmd, _ in plan:
        check_unchanged(root, run, train_cmd, statuses[run.name] or {})
    write_manifest(root, str(args.grid), args.scale, [p[0] for p in plan], args.settings)
    todo = [p for p in plan if (statuses[p[0].name] or {}).get("state") != "done"]
    print(f"{len(plan)} runs in {root}: {len(plan) - len(todo)} done, {len(todo)} to run",
          flush=True)
    if not todo:
        return 0
    with ray_grid.connected(args.ray_address), _stop_on_sigterm():
        failed = []
        workers = args.parallel or len(todo)
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            futures = [pool.submit(execute, run, root, t, a, placement, args.max_retries,
                                   statuses[run.name]) for run, t, a in todo]
            pending = set(futures)
            try:
                while pending:
                    # Wake every second: a SIGTERM taken by another thread (Ray's own) runs
                    # its Python handler only when this main thread runs bytecode again.
                    done, pending = concurrent.futures.wait(
                        pending, timeout=1.0, return_when=concurrent.futures.FIRST_COMPLETED)
                    for future in done:
                        status = future.result()
                        with _lock:
                            print(f"[{status['state']}] {status['name']}"
                                  + (f": {status['error']}" if status.get("error") else ""),
                                  flush=True)
                        if status["state"] != "done":
                            failed.append(status["name"])
            except KeyboardInterrupt:
                ray_grid.stop_all()
                raise
    if failed:
        print(f"{len(failed)} run(s) not done (logs in {root / LOG_DIR}): {', '.join(failed)}")
        return 143 if ray_grid.STOPPING.is_set() else 1
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
