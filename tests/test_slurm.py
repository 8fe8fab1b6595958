"""gpu_scripts/: the pre-flight runs before sbatch (gpu_scripts/submit.sh), and train.sbatch
requeues on preemption and at its time limit: SIGTERM to the batch script is passed to the
training, which saves; the job is requeued only after that, and its next start resumes.

No SLURM here: stand-ins for `sbatch` and `scontrol` record their calls, and `srun` runs its
one task on this machine; the trainer is the real `python -m gated_attention.main` on the
tiniest config.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_runs import tiny_flags

from gated_attention.ops import cpu_compile

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "gpu_scripts"
pytestmark = pytest.mark.reference("golden")


def stand_ins(folder: Path, preflight_rc: int = 0) -> dict[str, str]:
    """sbatch and scontrol record their arguments; srun drops its flags and runs the task here
    (without SLURM_JOB_ID, so the task is a one-process jax job, not jax's SLURM cluster);
    `python` records a pre-flight and answers preflight_rc, and runs anything else."""
    bin_dir = folder / "bin"
    bin_dir.mkdir(parents=True)
    scripts = {
        "sbatch": f'#!/bin/sh\necho "$*" >> {folder}/sbatch.log\necho "Submitted batch job 7"\n',
        "scontrol": f'#!/bin/sh\necho "$*" >> {folder}/scontrol.log\n',
        "srun": '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; '
                'done\nexec env -u SLURM_JOB_ID "$@"\n',
        "python": "#!/bin/sh\ncase \"$*\" in *gated_attention.preflight*)\n"
                  f"  echo \"$*\" >> {folder}/preflight.log; exit {preflight_rc} ;;\nesac\n"
                  f'exec {sys.executable} "$@"\n',
    }
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHON": str(bin_dir / "python"), "PYTHONPATH": str(REPO)}


def calls(folder: Path, tool: str) -> list[list[str]]:
    log = folder / f"{tool}.log"
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_both_scripts_are_shellcheck_clean():
    shellcheck = Path(sys.executable).with_name("shellcheck")
    result = subprocess.run([str(shellcheck), str(SCRIPTS / "train.sbatch"),
                             str(SCRIPTS / "submit.sh")], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_job_asks_to_be_requeued_and_signalled_before_its_time_limit():
    directives = [line.split(None, 1)[1] for line in
                  (SCRIPTS / "train.sbatch").read_text().splitlines()
                  if line.startswith("#SBATCH ")]
    assert {"--requeue", "--signal=B:TERM@300", "--open-mode=append"} <= set(directives)


def test_submit_runs_the_preflight_here_then_sbatch(tmp_path):
    env = {**stand_ins(tmp_path), "NODES": "4", "GPU": "b200-8", "RUNS": "/shared/runs"}
    done = subprocess.run(["bash", str(SCRIPTS / "submit.sh"), "r1", "small",
                           "g1_sdpa_elementwise", "--config.train.steps=100"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert calls(tmp_path, "preflight") == [[
        "-m", "gated_attention.preflight",
        "--config=configs/ablation.py:arch=small,variant=g1_sdpa_elementwise",
        "--accelerator=b200-8", "--hosts=4", "--config.train.steps=100"]]
    assert calls(tmp_path, "sbatch") == [[
        "--nodes=4", f"--export=ALL,RUNS=/shared/runs,PYTHON={env['PYTHON']}",
        "gpu_scripts/train.sbatch", "r1", "small", "g1_sdpa_elementwise",
        "--config.train.steps=100"]]
    assert "Submitted batch job 7" in done.stdout


@pytest.mark.reference("error_message")
def test_a_refused_preflight_or_a_bad_name_submits_nothing(tmp_path):
    env = stand_ins(tmp_path, preflight_rc=1)
    refused = subprocess.run(["bash", str(SCRIPTS / "submit.sh"), "r1", "tiny", "baseline"],
                             env=env, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "nothing was submitted" in refused.stderr
    bad = subprocess.run(["bash", str(SCRIPTS / "submit.sh"), "a/b", "tiny", "baseline"],
                         env=env, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "may only hold letters" in bad.stderr
    assert len(calls(tmp_path, "preflight")) == 1 and calls(tmp_path, "sbatch") == []


def train_steps(workdir: Path) -> list[int]:
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r.get("kind") == "train"]


@pytest.mark.slow
@pytest.mark.reference("independent")
def test_sigterm_to_the_job_saves_then_requeues_and_the_next_start_resumes(tmp_path):
    """SLURM's SIGTERM (the time limit's --signal=B:TERM, or a preemption) reaches only the
    batch script; it passes it to the training, which saves and exits 143; only then is the
    job requeued. The requeued start resumes from that checkpoint: every step trained once."""
    steps = 30
    env = {**stand_ins(tmp_path), "SLURM_JOB_ID": "4242", "RUNS": str(tmp_path / "runs"),
           "XLA_FLAGS": cpu_compile.xla_flags(host_devices=1)}
    argv = ["bash", str(SCRIPTS / "train.sbatch"), "r", "tiny", "baseline",
            *tiny_flags(steps, checkpoint_every=10)]
    out = tmp_path / "job.out"
    with open(out, "w") as log:
        job = subprocess.Popen(argv, env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 240
        while f"step 3/{steps}" not in out.read_text():
            assert job.poll() is None and time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.05)
        job.terminate()  # SIGTERM to the batch script alone, as --signal=B: sends it
        assert job.wait(timeout=240) == 143, out.read_text()[-3000:]
    text = out.read_text()
    stopped = re.search(r"Stopped: stopped by SIGTERM at step (\d+), after saving", text)
    assert stopped, text[-3000:]
    assert text.index("SIGTERM: passed to the training") < stopped.start() < \
        text.index("requeueing job 4242")
    assert calls(tmp_path, "scontrol") == [["requeue", "4242"]]
    stop_step = int(stopped.group(1))
    assert 3 <= stop_step < steps
    # the requeued job: the same script and arguments
    again = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"from its checkpoint at step {stop_step}." in again.stdout + again.stderr
    assert calls(tmp_path, "scontrol") == [["requeue", "4242"]]  # a finished run: no requeue
    assert train_steps(tmp_path / "runs" / "r") == list(range(1, steps + 1))
