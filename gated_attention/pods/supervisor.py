"""Keep a run or a grid alive on a (spot) TPU slice until it is done, with no human.

    python -m gated_attention.pods.supervisor --config tpu_scripts/pod.env \
        --project P --zone Z --tpu-name N --queued true --bucket gs://b/x \
        run --name NAME [--arch tiny --variant baseline] [-- --config.train.steps=...]
    ... grid --grid experiments/grids/table1.py --name NAME [-- --scale tiny ...]

(tpu_scripts/supervise.sh reads the settings file and starts this.) Every `--poll` seconds:

- done? the run's `summary.json` (a grid: every run of its runs.json done) is in the bucket:
  stop, exit 0;
- the slice (cloud.Slice.health): MISSING: create it (create.sh); WAITING: wait (at most
  `--active-timeout` seconds in a row, then stop with a message); BROKEN (SUSPENDED,
  PREEMPTED, FAILED, a vanished VM): a spot VM cannot be restarted: after `--broken-grace`
  seconds (a preempted VM's processes have about 30 s after their SIGTERM to save the step's
  checkpoint and copy their logs; deleting the slice sooner kills both), or as soon as every
  worker's log in the bucket records this attempt's exit (they have saved and ended),
  delete it (teardown.sh), create it again; HEALTHY: if not set up since it was created, set up
  (setup.sh) and launch (launch.sh / launch_grid.sh); if set up but no worker runs the job
  any more (it crashed, a maintenance event restarted the VM, a watchdog ended it), launch
  again: the run resumes from its last checkpoint, a grid skips its finished runs;
- every recreate and relaunch is a restart; after `--max-restarts` of them it stops (exit 1).

Each event (time, state seen, action, attempt) goes to `<run>/supervisor/events.jsonl` in
the bucket (a grid: `<grid>/supervisor/<tpu name>.events.jsonl`) and to stdout. `--dry-run`
prints the commands of the loop (each script's own dry run) and changes nothing.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path

from absl import flags

from gated_attention import cli_flags, paths, tpu_topologies, train_command
from gated_attention.pods import cloud
from gated_attention.pods.events import EventLog
from gated_attention.pods.worker_log import EXIT_LINE

SCRIPTS_DIR = str(Path(__file__).resolve().parents[2] / "tpu_scripts")
EXIT_DONE, EXIT_GAVE_UP = 0, 1


@dataclasses.dataclass
class Job:
    """What runs on the slice: one training run, or a grid."""

    kind: str                  # "run" or "grid"
    name: str
    bucket: str
    arch: str = "tiny"
    variant: str = "baseline"
    grid: str = ""
    passthrough: tuple[str, ...] = ()
    launch_args: tuple[str, ...] = ()   # more flags for launch_grid.sh (e.g. --claim)

    @property
    def home(self) -> str:
        folder = "runs" if self.kind == "run" else "grids"
        return f"{self.bucket.rstrip('/')}/{folder}/{self.name}"

    def events_path(self, tpu_name: str) -> str:
        if self.kind == "run":
            return f"{self.home}/supervisor/events.jsonl"
        return f"{self.home}/supervisor/{tpu_name}.events.jsonl"

    def launch(self, preflight: bool) -> tuple[str, list[str]]:
        extra = [] if preflight else ["--no-preflight"]
        if self.kind == "run":
            return "launch.sh", ["--name", self.name, "--arch", self.arch, "--variant",
                                 self.variant, *extra, "--", *self.passthrough]
        return "launch_grid.sh", ["--grid", self.grid, "--name", self.name, *self.launch_args,
                                  *extra, "--", *self.passthrough]

    @property
    def process_pattern(self) -> str:
        """What `pgrep -f` finds on a worker while the job runs there."""
        if self.kind == "run":
            return f"{train_command.MODULE} .*--workdir={self.home}( |$)"
        return f"experiments.run_grid .*--root {self.home}( |$)"

    def logged_exits(self, tpu_name: str) -> dict[str, tuple[int, int]]:
        """Per worker log in the bucket of the job on slice `tpu_name`: (the exits it
        records, its length). The workers run under worker_log (launch.sh, launch_grid.sh),
        which ends each attempt's copy with an `### exit` line once the command ended. A
        run's logs are `<run>/logs/*.log`; a grid's, `<grid>/_worker_logs/<tpu>-worker-N.log`
        (the slices of a claimed grid share the folder)."""
        from gated_attention.pods import claims

        claims.invalidate_listings()
        folder, pattern = (("logs", "*.log") if self.kind == "run"
                           else ("_worker_logs", f"{tpu_name}-worker-*.log"))
        logs = paths.resolve(self.home) / folder
        if not logs.exists():
            return {}
        counts = {}
        for log in logs.glob(pattern):
            try:
                text = paths.read_current(log)
            except FileNotFoundError:  # deleted between the listing and the read
                continue
            counts[log.name] = (text.count("\n" + EXIT_LINE), len(text))
        return counts

    def finished(self) -> bool:
        from gated_attention.pods import claims

        home = paths.resolve(self.home)
        claims.invalidate_listings()  # the workers write the bucket, not this process
        if self.kind == "run":
            return (home / "summary.json").exists()
        names = (paths.read_json_current(home / "runs.json") or {}).get("runs", {})
        for name in names:
            status = paths.read_json_current(home / "_status" / f"{name}.json") or {}
            if status.get("state") != "done":
                return False
        return bool(names)


    def work_left_for(self, slice_name: str) -> bool:
        """A claimed grid: is a run (or an analysis) pending that is unclaimed or this
        slice's? If not, the other slices hold what is left: nothing to relaunch here."""
        from gated_attention.pods import claims

        home = paths.resolve(self.home)
        claims.invalidate_listings()
        names = (paths.read_json_current(home / "runs.json") or {}).get("runs", {})
        if not names:
            return True
        for name in names:
            state = (paths.read_json_current(home / "_status" / f"{name}.json") or {}).get("state")
            if state == "done":
                continue
            claim = name if state != "trained" else f"{name}.analysis"
            record = claims.read_claim(home / "_claims" / f"{claim}.json")
            if record is None or record.get("holder") == slice_name:
                return True
        return False


@dataclasses.dataclass
class Options:
    poll_s: float = 60.0
    max_restarts: int = 10
    active_timeout_s: float = 24 * 3600.0
    # A preempted VM's processes get SIGTERM about 30 s before it stops, while the API may
    # already report it PREEMPTED/SUSPENDED: deleting it then kills the run's last
    # checkpoint and its log copy. A broken slice is deleted once this long has passed.
    broken_grace_s: float = 30.0
    max_polls: int | None = None   # tests: stop after that many polls (exit 1)


def settings_hosts(config: str) -> int | None:
    """The workers a settings file's slice has (TPU_TYPE's hosts times SLICES), or None when
    the file does not say: what the grace waits for before a probe has counted them."""
    settings = {}
    try:
        for line in Path(config).read_text().splitlines():
            words = shlex.split(line, comments=True)
            if len(words) == 1 and "=" in words[0]:
                key, value = words[0].split("=", 1)
                settings[key] = value
        tpu = tpu_topologies.parse_accelerator(settings["TPU_TYPE"])
        return tpu.hosts * int(settings.get("SLICES", "1"))
    except (OSError, KeyError, ValueError, tpu_topologies.AcceleratorError):
        return None


def supports_flag(script: str, flag: str) -> bool:
    """Whether a tpu_scripts/*.sh of this checkout takes `flag` (its text names it)."""
    return flag in (Path(SCRIPTS_DIR) / script).read_text()


class Supervisor:
    def __init__(self, config: str, tpu: cloud.Slice, job: Job, options: Options,
                 run: Callable[[list[str]], int] | None = None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.config, self.tpu, self.job, self.options = config, tpu, job, options
        self.events = EventLog(job.events_path(tpu.name))
        self.sleep = sleep
        self._run = run or self._run_script
        self.attempt = 0
        self.set_up = False        # setup.sh ran on the slice as it now exists
        self.launched = False
        self.preflighted = False
        self.create_failures = 0
        self.idle = False          # a claimed grid: nothing left here for this slice
        self.waiting_since: float | None = None
        self.broken_since: float | None = None
        self.workers: int | None = None  # the slice's workers, as its last probe counted
        self.hosts = settings_hosts(config)  # the same from the settings, until a probe
        self.exits_before_launch: dict[str, tuple[int, int]] | None = None

    def _run_script(self, argv: list[str]) -> int:
        print(f"$ {' '.join(argv)}", flush=True)
        return subprocess.run(argv, cwd=os.path.dirname(SCRIPTS_DIR)).returncode

    def script(self, name: str, *args: str) -> int:
        return self._run(cloud.script_command(SCRIPTS_DIR, name, self.config, args))

    def restart(self, state: str, action: str, detail: str) -> bool:
        """Count a restart; False (after logging why) when --max-restarts are used up."""
        if self.attempt >= self.options.max_restarts:
            self.events.write(state, "give_up", self.attempt,
                              f"{detail}; --max-restarts={self.options.max_restarts} reached")
            return False
        self.attempt += 1
        self.events.write(state, action, self.attempt, detail)
        return True

    def create(self, state: str) -> bool:
        rc = self.script("create.sh")
        if rc != 0:
            self.events.write(state, "create_failed", self.attempt, f"create.sh exited {rc}")
            return False
        self.set_up = self.launched = False
        return True

    def launch(self, state: str) -> bool:
        if not self.set_up:
            self.events.write(state, "setup", self.attempt)
            rc = self.script("setup.sh")
            if rc != 0:
                self.events.write(state, "setup_failed", self.attempt, f"setup.sh exited {rc}")
                return False
            self.set_up = True
        self.exits_before_launch = self.job.logged_exits(self.tpu.name)
        script, args = self.job.launch(
            preflight=not (self.preflighted and supports_flag("launch.sh" if self.job.kind ==
                                                              "run" else "launch_grid.sh",
                                                              "--no-preflight")))
        rc = self._run(cloud.script_command(SCRIPTS_DIR, script, self.config, args))
        if rc != 0:
            self.events.write(state, "launch_failed", self.attempt, f"{script} exited {rc}")
            return False
        self.preflighted = True
        self.launched = True
        self.events.write(state, "launched", self.attempt, script)
        return True

    def step(self) -> int | None:
        """One look at the slice and the job; an exit code when the loop ends."""
        if self.job.finished():
            self.events.write("-", "done", self.attempt, f"{self.job.home} records completion")
            return EXIT_DONE
        health = self.tpu.health()
        if health.kind != cloud.WAITING:
            self.waiting_since = None
        if health.kind != cloud.BROKEN:
            self.broken_since = None
        if health.kind == cloud.UNKNOWN:
            self.events.write(health.state, "retry", self.attempt, health.detail)
        elif health.kind == cloud.WAITING:
            now = time.monotonic()
            self.waiting_since = self.waiting_since or now
            if now - self.waiting_since > self.options.active_timeout_s:
                self.events.write(health.state, "give_up", self.attempt,
                                  f"{self.tpu.name} did not become ACTIVE within "
                                  f"--active-timeout={self.options.active_timeout_s:g} s")
                return EXIT_GAVE_UP
        elif health.kind == cloud.MISSING:
            if self.launched or self.set_up:
                if not self.restart(health.state, "recreate", "the slice vanished"):
                    return EXIT_GAVE_UP
            elif self.create_failures:
                if not self.restart(health.state, "retry_create", "create failed"):
                    return EXIT_GAVE_UP
            else:
                self.events.write(health.state, "create", self.attempt)
            self.create_failures = 0 if self.create(health.state) else self.create_failures + 1
        elif health.kind == cloud.BROKEN:
            if not health.state.endswith(cloud.NO_NODE):  # a vanished VM: nothing to wait for
                now = time.monotonic()
                if self.broken_since is None:
                    self.broken_since = now
                    self.events.write(health.state, "broken", self.attempt,
                                      f"its workers get --broken-grace="
                                      f"{self.options.broken_grace_s:g} s to save and exit")
                if now - self.broken_since < self.options.broken_grace_s:
                    if not self.every_worker_ended():
                        return None
                    self.events.write(health.state, "saved", self.attempt,
                                      f"every worker's log records its exit after "
                                      f"{now - self.broken_since:.1f} s of the grace")
            self.broken_since = None
            if not self.restart(health.state, "recreate", "a spot slice cannot be restarted: "
                                "delete and create again"):
                return EXIT_GAVE_UP
            self.script("teardown.sh", "--yes")
            self.set_up = self.launched = False
            self.create(health.state)
        elif not self.launched:
            self.launch(health.state)
        else:
            workers = self.tpu.workers_running(self.job.process_pattern)
            if workers is not None:
                self.workers = sum(workers)
            if workers is not None and workers[0] == 0 and not self.job.finished():
                if "--claim" in self.job.launch_args and not self.job.work_left_for(
                        self.tpu.name):
                    if not self.idle:
                        self.events.write(health.state, "idle", self.attempt,
                                          "what is left is held by other slices")
                        self.idle = True
                    return None
                if not self.restart(health.state, "relaunch",
                                    f"no worker runs {self.job.name} any more"):
                    return EXIT_GAVE_UP
                self.launched = False
                self.launch(health.state)
        return None

    def every_worker_ended(self) -> bool:
        """Whether the workers of the attempt launched last have all logged their exit (so
        deleting the slice loses nothing): a new exit in as many logs as the slice's last
        probe counted workers (before the first probe, as many as the settings' TPU_TYPE has
        hosts: a slice preempted right after the launch), and no log that changed since the
        launch without one. Unknown (no worker count, an unreadable bucket): False, the grace
        runs out."""
        before = self.exits_before_launch
        workers = self.workers or self.hosts
        if not self.launched or not workers or before is None:
            return False
        try:
            now = self.job.logged_exits(self.tpu.name)
        except OSError:
            return False
        changed = {name: exits > before.get(name, (0, 0))[0]
                   for name, (exits, length) in now.items()
                   if (exits, length) != before.get(name)}
        return all(changed.values()) and len(changed) >= workers

    def loop(self) -> int:
        self.events.write("-", "start", 0, f"supervising {self.job.kind} {self.job.name} on "
                          f"{self.tpu.name} (--max-restarts={self.options.max_restarts})")
        polls = 0
        while True:
            code = self.step()
            if code is not None:
                return code
            polls += 1
            if self.options.max_polls is not None and polls >= self.options.max_polls:
                self.events.write("-", "give_up", self.attempt, f"{polls} polls (--max-polls)")
                return EXIT_GAVE_UP
            self.sleep(self.options.poll_s)


def dry_run(config: str, tpu: cloud.Slice, job: Job) -> int:
    """The loop's commands, each script's own dry run, in the order the loop runs them."""
    def show(title: str, script: str, *args: str) -> None:
        print(f"# {title}", flush=True)
        rc = subprocess.run(cloud.script_command(SCRIPTS_DIR, script, config, args, True),
                            cwd=os.path.dirname(SCRIPTS_DIR)).returncode
        if rc != 0:
            sys.exit(rc)

    group = "queued-resources" if tpu.queued else "tpu-vm"
    print(f"# Every poll: is {job.home} done? then\n"
          f"gcloud compute tpus {group} describe {tpu.name} --project={tpu.project} "
          f"--zone={tpu.zone} --format=json", flush=True)
    show("MISSING: create", "create.sh")
    show("ACTIVE, not set up since created: set up", "setup.sh")
    script, args = job.launch(preflight=True)
    show("then launch", script, *args)
    print(f"# ACTIVE and launched: is it still running on every worker?\n"
          f"gcloud compute tpus tpu-vm ssh {tpu.name} --project={tpu.project} "
          f"--zone={tpu.zone} --worker=all --command="
          f"{cloud._quote('pgrep -f ' + cloud._quote(job.process_pattern))}\n"
          "# ... no worker runs it and it is not done: launch again (a restart)", flush=True)
    show("SUSPENDED / PREEMPTED / FAILED: after --broken-grace seconds (the workers' time to "
         "save; or once every worker's log records its exit), delete, then create, "
         "set up, launch (a restart); no VM: the same at once",
         "teardown.sh", "--yes")
    print(f"# events: {job.events_path(tpu.name)}", flush=True)
    return 0


CLI = cli_flags.Command("supervise", __doc__, positional=("subcommand",), hidden=("max-polls",))
# The flags of one subcommand only (`--name` is both's); the other's are refused by name.
SUBCOMMAND_FLAGS = {"run": ("arch", "variant"), "grid": ("grid", "claim")}


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The flags of both subcommands, on `flag_values` (importing the module defines none);
    `parse_args` checks which subcommand each belongs to."""
    for name, about in (("config", "The tpu_scripts settings file."),
                        ("project", "Google Cloud project."), ("zone", "Zone of the slice."),
                        ("tpu-name", "The slice's name."),
                        ("bucket", "Where runs, logs and events go (gs://...)."),
                        ("name", "run, grid: the run's or the grid's name.")):
        flags.DEFINE_string(name, None, about, flag_values=flag_values)
    flags.mark_flags_as_required(["config", "project", "zone", "tpu-name", "bucket", "name"],
                                 flag_values=flag_values)
    flags.DEFINE_enum("queued", "true", ["true", "false"], "Whether the slice is a queued "
                      "resource.", flag_values=flag_values)
    flags.DEFINE_string("extra-ssh-args", "", "More flags for tpu-vm ssh.",
                        flag_values=flag_values)
    flags.DEFINE_float("poll", 60.0, "Seconds between looks.", flag_values=flag_values)
    flags.DEFINE_integer("max-restarts", 10, "Recreates + relaunches before giving up.",
                         flag_values=flag_values)
    flags.DEFINE_float("active-timeout", 24 * 3600.0, "Seconds a slice may wait for capacity "
                       "before giving up.", flag_values=flag_values)
    flags.DEFINE_float("broken-grace", 30.0, "Seconds a preempted or failed slice's workers "
                       "get to save their checkpoint and logs before the slice is deleted "
                       "(sooner once every worker's log records its exit).",
                       flag_values=flag_values)
    flags.DEFINE_integer("max-polls", None, "Stop after this many polls (tests).",
                         flag_values=flag_values)
    flags.DEFINE_bool("dry-run", False, "Print the loop's commands and change nothing.",
                      flag_values=flag_values)
    flags.DEFINE_string("arch", "tiny", "run: the architecture (launch.sh).",
                        flag_values=flag_values)
    flags.DEFINE_string("variant", "baseline", "run: the attention variant (launch.sh).",
                        flag_values=flag_values)
    flags.DEFINE_string("grid", None, "grid: the grid file, e.g. experiments/grids/table1.py.",
                        flag_values=flag_values)
    flags.DEFINE_bool("claim", False, "grid: share the grid with the other slices supervised "
                      "alike (launch_grid.sh --claim).", flag_values=flag_values)
    return flag_values


def parse_args(argv: Sequence[str]) -> types.SimpleNamespace:
    """The flags, the subcommand (`run` or `grid`), and the flags after `--` as
    `passthrough` (for launch.sh's run or launch_grid.sh's grid)."""
    argv = list(argv)
    passthrough: list[str] = []
    if "--" in argv:
        split = argv.index("--")
        argv, passthrough = argv[:split], argv[split + 1:]
    flag_values = define_flags(flags.FlagValues())
    args = CLI.parse(flag_values, argv)
    if args.subcommand not in SUBCOMMAND_FLAGS:
        CLI.error(f"the subcommand must be run or grid, not {args.subcommand!r}")
    for subcommand, names in SUBCOMMAND_FLAGS.items():
        given = [name for name in names if flag_values[name].present]
        if subcommand != args.subcommand and given:
            CLI.error(f"--{given[0]} is a flag of `{subcommand}`, not of `{args.subcommand}`")
    if args.subcommand == "grid" and args.grid is None:
        CLI.error("grid needs --grid (the grid file)")
    args.queued = args.queued == "true"
    args.passthrough = tuple(passthrough)
    for flag, value, low in (("--max-restarts", args.max_restarts, 0), ("--poll", args.poll, 0),
                             ("--active-timeout", args.active_timeout, 0),
                             ("--broken-grace", args.broken_grace, 0)):
        at_least = flag in ("--max-restarts", "--broken-grace")
        if value < low or (not at_least and value == 0):
            CLI.error(f"{flag}={value} must be {'>= 0' if at_least else '> 0'}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    tpu = cloud.Slice(args.project, args.zone, args.tpu_name, args.queued,
                      ssh_args=tuple(args.extra_ssh_args.split()))
    if args.subcommand == "run":
        job = Job("run", args.name, args.bucket, arch=args.arch, variant=args.variant,
                  passthrough=args.passthrough)
    else:
        job = Job("grid", args.name, args.bucket, grid=args.grid, passthrough=args.passthrough,
                  launch_args=("--claim",) if args.claim else ())
    if args.dry_run:
        return dry_run(args.config, tpu, job)
    options = Options(poll_s=args.poll, max_restarts=args.max_restarts,
                      active_timeout_s=args.active_timeout, broken_grace_s=args.broken_grace,
                      max_polls=args.max_polls)
    code = Supervisor(args.config, tpu, job, options).loop()
    if code == EXIT_GAVE_UP:
        print(f"supervise: gave up on {job.kind} {job.name}; events in "
              f"{job.events_path(tpu.name)}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
