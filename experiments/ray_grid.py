"""One grid run as Ray work: reserve its hosts, start one trainer per host, retry lost ones.

A run's attempt reserves a placement group (`reserve`): whole TPU slices through
`ray.util.tpu.slice_placement_group` (one bundle per TPU host; `num_slices` for
multislice), or `hosts` bundles of CPUs and GPUs (whole GPU nodes: `gpus` per host, one host
per node). On every bundle a task (`run_host`) starts the training command as a subprocess,
with the settings jax.distributed needs when there are several hosts (coordinator address,
process count and id; MEGASCALE_* across slices), appends the command's output to the grid's
log in the root while it runs, and forwards a stop (Ray's cancel, the worker's own SIGTERM,
its death) to the trainer as SIGTERM and waits for it: the trainer saves, then exits.

An attempt ends one of three ways (`Outcome`): every host exited 0 (done); a host was lost
(a Ray node-died / worker-crashed error) or its trainer stopped on a signal after saving
(exit 143, 130) or on the step watchdog (75): the run is tried again on whatever hosts Ray
gives next, up to `max_retries` times, and resumes from the checkpoint in its workdir; any
other exit is the code's fault: the run fails at once with its log's last lines. A retry
relaunches every host of the run (a multi-host job cannot replace one process), so the
attempt loop lives here, around Ray's tasks, rather than in a task's own `max_retries`.

One live training per workdir: the driver holds, while a run lives, a Ray actor named after
the run's workdir (`RunGuard`); Ray refuses a second actor of that name on the cluster and
removes it when its driver dies. On top of that, before the first host starts a local
workdir's trainer it waits for the workdir's lock (training/workdir_lock.py) to be free:
a trainer of a killed driver still saving in its window finishes first.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import datetime
import os
import pathlib
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ray

from experiments import grid_lib
from gated_attention.core import paths
from gated_attention.training import watchdog
from gated_attention.training.interrupts import EXIT_CODES
from gated_attention.training.workdir_lock import WorkdirBusyError, WorkdirLock

NAMESPACE = "gated_attention"
LOG_SYNC_SECONDS = 30.0  # how late a running command's output may reach the grid's root
STOP_GRACE_S = 120.0  # how long a stopped trainer may take to save before it is killed
# Ray's cancel of a running task now and then never reaches it (seen under load: the driver's
# cancel returned, the task's loop ran on for minutes), so a stop is asked again this often.
CANCEL_AGAIN_S = 5.0
LOCK_WAIT_S = 300.0  # how long a host waits for an earlier trainer to leave a local workdir
GUARD_WAIT_S = 60.0  # how long a run waits for a dead driver's guard to go
# The raylet starts its workers at this niceness (Ray's default 15; read when it starts).
WORKER_NICENESS = "RAY_worker_niceness"
# Exits that mean "stopped from outside after saving; start again": a signal, the watchdog.
RETRY_EXITS = {EXIT_CODES["SIGTERM"], EXIT_CODES["SIGINT"], watchdog.EXIT_CODE}
# Set when the driver is stopped (SIGTERM, Ctrl-C): running hosts are cancelled, none start.
STOPPING = threading.Event()
_running: set[Any] = set()  # the host tasks of every attempt in flight
_running_lock = threading.Lock()


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass
class Reservation:
    """A ready placement group: `bundles` host bundles, `hosts_per_slice` of them a slice."""

    group: Any
    bundles: int
    bundle_resources: dict[str, float]
    hosts_per_slice: int
    release: Callable[[], None]


def reserve(placement: grid_lib.Placement, timeout_s: float | None = None) -> Reservation:
    """Reserve one run's hosts; blocks until Ray has them (or `timeout_s`)."""
    from ray.util import placement_group, remove_placement_group

    if placement.tpu:
        from ray.util.tpu import slice_placement_group

        version, topology = placement.tpu.split(":")
        handle = slice_placement_group(topology=topology, accelerator_version=version,
                                       num_slices=placement.num_slices,
                                       head_reservation_timeout_s=timeout_s)
        try:
            ray.get(handle.placement_group.ready(), timeout=timeout_s)
        except BaseException:
            handle.shutdown()
            raise
        handle.release_head_pgs()
        return Reservation(handle.placement_group, handle.num_bundles,
                           dict(handle.bundle_resources),
                           handle.num_bundles // placement.num_slices, handle.shutdown)
    bundle = {"CPU": placement.cpus, **({"GPU": placement.gpus} if placement.gpus else {})}
    group = placement_group([dict(bundle)] * placement.hosts,
                            strategy="STRICT_SPREAD" if placement.hosts > 1 else "PACK")
    try:
        ray.get(group.ready(), timeout=timeout_s)
    except BaseException:
        remove_placement_group(group)
        raise
    return Reservation(group, placement.hosts, bundle, placement.hosts,
                       lambda: remove_placement_group(group))


def _on_bundle(reservation: Reservation, index: int) -> dict[str, Any]:
    """Task options that run a task on bundle `index`, holding the bundle's resources (so Ray
    shows the task its chips or GPUs)."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    resources = dict(reservation.bundle_resources)
    return dict(num_cpus=resources.pop("CPU", 0), num_gpus=resources.pop("GPU", 0),
                resources=resources, max_retries=0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=reservation.group, placement_group_bundle_index=index))


@ray.remote(num_cpus=0, max_retries=0)
def _probe() -> dict[str, Any]:
    """Where a bundle landed: node IP and id, TPU worker number, and a free port there (the
    coordinator's, should this host be process 0)."""
    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    labels = ray.get_runtime_context().get_node_labels() or {}
    worker = labels.get("ray.io/tpu-worker-id", "")
    return {"ip": ray.util.get_node_ip_address(), "node": ray.get_runtime_context().get_node_id(),
            "tpu_worker": int(worker) if worker.isdigit() else None, "port": port}


def host_envs(probes: Sequence[Mapping[str, Any]], hosts_per_slice: int) -> list[dict[str, str]]:
    """Per bundle, the environment of its trainer: none for one host; else jax.distributed's
    coordinator (host 0's address), process count and id (slice by slice, TPU worker order
    within a slice), and across several slices MEGASCALE_* (the multislice settings)."""
    count = len(probes)
    if count == 1:
        return [{}]
    slices = count // hosts_per_slice
    order = sorted(range(count), key=lambda i: (i // hosts_per_slice,
                                                probes[i]["tpu_worker"] if probes[i][
                                                    "tpu_worker"] is not None else i))
    process_id = {bundle: rank for rank, bundle in enumerate(order)}
    first = probes[order[0]]
    envs = []
    for i in range(count):
        env = {"GATED_ATTENTION_MULTIHOST": "1",
               "JAX_COORDINATOR_ADDRESS": f"{first['ip']}:{first['port']}",
               "JAX_NUM_PROCESSES": str(count), "JAX_PROCESS_ID": str(process_id[i])}
        if slices > 1:
            from ray.util.tpu import get_tpu_coordinator_env_vars

            env.update(get_tpu_coordinator_env_vars(first["ip"], slices,
                                                    process_id[i] // hosts_per_slice))
        envs.append(env)
    return envs


# ----------------------------------------------------------------------------- one host


def _die_with_parent() -> None:
    """In the trainer (before exec): SIGTERM when the task's worker dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def _cancel_deferred(then_interrupt: bool = True):
    """Hold Ray's cancel (a KeyboardInterrupt raised through SIGINT's handler in the task's
    main thread) until the block ends: one landing inside Popen, after the fork, would lose
    the started trainer's handle, and the trainer would never get the stop. With
    `then_interrupt` False the held cancels are dropped: the block is the stop itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: held.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if then_interrupt and held and callable(previous):  # what the interrupt would have
            previous(signal.SIGINT, None)  # done: by default, KeyboardInterrupt


class LogCopy:
    """Appends a local log file's new whole lines to `remote` (the grid root's log) every
    LOG_SYNC_SECONDS while a command runs, and the rest at its end; each byte once."""

    def __init__(self, local: pathlib.Path, remote: str):
        self.local, self.remote, self.copied = local, remote, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        self.copy(final=False)  # the attempt's header at once: where it runs
        while not self._stop.wait(LOG_SYNC_SECONDS):
            self.copy(final=False)

    def copy(self, final: bool = True) -> None:
        data = self.local.read_bytes()[self.copied:] if self.local.exists() else b""
        if not final:
            data = data[:data.rfind(b"\n") + 1]
        if not data:
            return
        try:
            paths.append_text(self.remote, data.decode("utf-8", errors="replace"))
        except Exception as err:  # noqa: BLE001 - a log copy must never stop the run
            print(f"warning: could not copy {self.local} to {self.remote} ({err}); will retry",
                  file=sys.stderr, flush=True)
            return
        self.copied += len(data)

    def __enter__(self) -> LogCopy:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.copy()


def wait_for_free_workdir(workdir: str, timeout_s: float = LOCK_WAIT_S) -> None:
    """Return once no live process holds the local workdir's lock (an earlier attempt's
    trainer saving in its window); a bucket workdir returns at once."""
    deadline = time.monotonic() + timeout_s
    lock = WorkdirLock(workdir)
    while True:
        try:
            lock.acquire()
            lock.release()
            return
        except WorkdirBusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
        except FileNotFoundError:  # a new run: no workdir yet
            return


def run_command(cmd: Sequence[str], env: Mapping[str, str], log: pathlib.Path, remote_log: str,
                header: str, cwd: str, grace_s: float = STOP_GRACE_S,
                cancelled: Callable[[], bool] = lambda: False) -> int:
    """Run `cmd` with its output in `log`, copied to `remote_log` as it goes; on any stop
    of this process (an exception: Ray's cancel, SystemExit from the worker's SIGTERM; or
    `cancelled()` turning true, checked every second) the trainer gets SIGTERM and is
    waited for (up to `grace_s`, then killed), and the stop goes on once the trainer has
    exited. Returns the command's exit code."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab", buffering=0) as out:
        out.write(f"\n### {now()} {header}\n### {shlex.join(cmd)}\n".encode())
        copy = LogCopy(log, remote_log).__enter__()
        proc = None
        try:
            with _cancel_deferred():  # a started trainer is always in `proc` when a stop lands
                proc = subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT,
                                        cwd=cwd, env={**os.environ, **env},
                                        start_new_session=True, preexec_fn=_die_with_parent)
            while True:  # wake up every second: Ray's cancel arrives between two bytecodes
                try:
                    rc = proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if cancelled():  # the cancel reached the task, its interrupt did not
                        raise KeyboardInterrupt("cancelled") from None  # as Ray's would
        except BaseException as stop:
            if proc is None:  # it never started
                copy.__exit__()
                raise
            with _cancel_deferred(then_interrupt=False):  # the cancels asked again land here
                out.write(f"### {now()} stopping the trainer ({type(stop).__name__}): "
                          "SIGTERM\n".encode())
                proc.send_signal(signal.SIGTERM)
                try:
                    rc = proc.wait(timeout=grace_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
                out.write(f"### {now()} exit {rc} (stopped from outside)\n".encode())
                copy.__exit__()
            raise
        out.write(f"### {now()} exit {rc}\n".encode())
        copy.__exit__()
    return rc


def _working_dir(repo: str) -> str:
    """The project's folder on this node: the driver's checkout where it exists (one machine,
    a shared image), else the job's working_dir that Ray copied here (ray job submit)."""
    return repo if os.path.isdir(os.path.join(repo, "configs")) else os.getcwd()


@ray.remote(num_cpus=0, max_retries=0)
def run_host(cmd: Sequence[str], env: Mapping[str, str], log_name: str, root: str,
             header: str, repo: str, wait_for: str | None) -> int:
    """One host's part of an attempt: the trainer's exit code (see run_command)."""
    if wait_for:
        wait_for_free_workdir(wait_for)
    spool = pathlib.Path(ray.get_runtime_context().get_temp_dir()) / "grid_logs"
    local = spool / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', root)}.{os.getpid()}.{log_name}"
    return run_command(cmd, env, local, f"{root.rstrip('/')}/_logs/{log_name}", header,
                       _working_dir(repo), cancelled=ray.get_runtime_context().is_canceled)


# ----------------------------------------------------------------------------- one attempt


@dataclasses.dataclass
class Outcome:
    kind: str  # "done", "retry" (lost or preempted after saving), "failed" (the code's fault)
    detail: str
    exits: list[int | None]


def classify(results: Sequence[int | BaseException | None]) -> Outcome:
    """What an attempt's host results (exit codes, Ray errors; None: stopped by us) mean."""
    exits = [r if isinstance(r, int) else None for r in results]
    lost = [r for r in results if isinstance(r, ray.exceptions.RayError)
            and not isinstance(r, ray.exceptions.RayTaskError)]
    broken = [r for r in results if isinstance(r, BaseException) and r not in lost]
    if broken:
        return Outcome("failed", f"the host task failed: {broken[0]}", exits)
    codes = [r for r in results if isinstance(r, int)]
    bad = [c for c in codes if c != 0 and c not in RETRY_EXITS]
    if lost:
        return Outcome("retry", f"host lost ({type(lost[0]).__name__})", exits)
    if bad:
        return Outcome("failed", f"training exited with {bad[0]}", exits)
    if any(c in RETRY_EXITS for c in codes) or None in results:
        why = f"exit {max(codes)}" if codes and max(codes) else "cancelled"
        return Outcome("retry", f"stopped after saving ({why})", exits)
    return Outcome("done", "", exits)


def wait_hosts(refs: Sequence[Any]) -> list[int | BaseException | None]:
    """Every host's result; once one ends badly (non-zero, lost) the others are stopped
    (Ray's cancel: their trainers get SIGTERM and are waited for), since the hosts of one
    job cannot go on without it. While a stop is on, the hosts still running are asked
    again every CANCEL_AGAIN_S."""
    results: dict[int, int | BaseException | None] = {}
    pending = list(range(len(refs)))
    stopping = False
    with _running_lock:
        _running.update(refs)
        if STOPPING.is_set():
            for ref in refs:
                _cancel(ref)
    while pending:
        ready, _ = ray.wait([refs[i] for i in pending], num_returns=1, timeout=CANCEL_AGAIN_S)
        if not ready:
            if stopping or STOPPING.is_set():
                for j in pending:
                    _cancel(refs[j])
            continue
        i = next(j for j in pending if refs[j] == ready[0])
        pending.remove(i)
        try:
            results[i] = ray.get(refs[i])
        except ray.exceptions.TaskCancelledError:
            results[i] = None
        except ray.exceptions.RayError as err:
            results[i] = err
        if not stopping and results[i] != 0:
            stopping = True
            for j in pending:
                _cancel(refs[j])
    with _running_lock:
        _running.difference_update(refs)
    return [results[i] for i in range(len(refs))]


def say(text: str, fd: int = 2) -> None:
    """One line straight to a file descriptor: safe inside a signal handler, where a print
    landing in the main thread's own print raises a reentrant-call error."""
    os.write(fd, f"{text}\n".encode())


def stop_all() -> int:
    """Stop the grid: every running host is cancelled (its trainer gets SIGTERM, saves, and
    is waited for), and no attempt starts any more. Returns how many hosts were cancelled.
    A cancel Ray refuses is reported, never raised: this runs in the driver's SIGTERM
    handler, where an exception would leave the main thread and the grid waiting forever."""
    with _running_lock:
        STOPPING.set()
        return sum(_cancel(ref) for ref in list(_running))


def _cancel(ref: Any) -> bool:
    """Ray's cancel of one host task (its trainer gets SIGTERM and saves); whether Ray took
    it. A refusal is printed, not raised (see stop_all)."""
    try:
        ray.cancel(ref)
        return True
    except Exception as err:  # noqa: BLE001 - see the docstring
        say(f"warning: could not cancel the host task of {ref}: {err!r}")
        return False


@contextlib.contextmanager
def _environ(**values: str):
    """`values` in this process's environment while the block runs (for the processes it
    starts), as they were before afterwards."""
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def connected(address: str = ""):
    """Ray for the grid: the cluster at `address`, or a new one on this machine (not one a
    `ray start` left running here); one this call started is shut down at the end. A new
    one runs its tasks, and so the trainers, at the CPU priority of a run started alone:
    Ray's default niceness of 15 lets any other busy process on the machine starve them."""
    STOPPING.clear()
    if ray.is_initialized():
        yield
        return
    with _environ(**({} if address else {WORKER_NICENESS: os.environ.get(WORKER_NICENESS, "0")})):
        ray.init(address=address or "local", namespace=NAMESPACE, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@ray.remote(num_cpus=0)
class RunGuard:
    """Held by the driver while a run lives; its name (the run's workdir) is the claim."""

    def ping(self) -> bool:
        return True


@contextlib.contextmanager
def guard(workdir: str, wait_s: float = GUARD_WAIT_S):
    """Hold the run's guard; yields False (holds nothing) when another live driver does."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            handle = RunGuard.options(name=f"run:{workdir}", namespace=NAMESPACE,
                                      lifetime=None).remote()
            ray.get(handle.ping.remote())
            break
        except (ValueError, ray.exceptions.ActorAlreadyExistsError):
            if time.monotonic() > deadline:
                yield False
                return
            time.sleep(1.0)
    try:
        yield True
    finally:
        ray.kill(handle)


def attempt(reservation: Reservation, cmd: Sequence[str], log_name: str, root: str,
            header: str, repo: str, workdir: str) -> Outcome:
    """Start the command on every host of `reservation` and wait for all of them."""
    probes = ray.get([_probe.options(**_on_bundle(reservation, i)).remote()
                      for i in range(reservation.bundles)])
    envs = host_envs(probes, reservation.hosts_per_slice)
    rank = [int(e.get("JAX_PROCESS_ID", 0)) for e in envs]
    wait_for = workdir if paths.is_local(workdir) else None
    refs = [run_host.options(**_on_bundle(reservation, i)).remote(
        cmd, envs[i], log_name if rank[i] == 0 else log_name.replace(".log", f".host{rank[i]}.log"),
        root, f"{header}, host {rank[i]} of {len(probes)} on {probes[i]['ip']}", repo,
        wait_for if rank[i] == 0 else None) for i in range(reservation.bundles)]
    outcome = classify(wait_hosts(refs))
    outcome.detail = outcome.detail or f"on {', '.join(p['node'][:8] for p in probes)}"
    return outcome
