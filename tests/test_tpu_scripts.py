"""tpu_scripts/: shellcheck-clean, dry runs print the exact gcloud commands, bad settings refused.

Nothing here calls gcloud: every script runs with --dry-run, and a stand-in `gcloud` that
records any call comes first on PATH (each test checks it was never called). The local
pre-flight runs through a stand-in Python (GATED_ATTENTION_PYTHON) that records its
arguments, except where a test runs the real one.
"""

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import jax
import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "tpu_scripts"
ALL = sorted(p.name for p in SCRIPTS.glob("*.sh"))
SETTINGS = {"PROJECT": "my-proj", "ZONE": "us-central2-b", "BUCKET": "gs://bkt/ga",
            "TPU_NAME": "ga-pod", "TPU_TYPE": "v4-32", "SPOT": "true", "QUEUED": "true"}
LOCATION = ["--project=my-proj", "--zone=us-central2-b"]
SCRIPT_ARGS = {"create.sh": [], "setup.sh": [], "teardown.sh": ["--yes"],
               "launch.sh": ["--name", "r1"], "logs.sh": ["--name", "r1"],
               "launch_grid.sh": ["--grid", "experiments/grids/table1.py", "--name", "t1"],
               "supervise.sh": ["--name", "r1"]}  # its loop: tests/test_supervisor.py


@pytest.fixture(autouse=True)
def stand_ins(tmp_path_factory, monkeypatch):
    """A recording `gcloud` first on PATH, and a recording Python for the pre-flight (it runs
    experiments.run_grid and `-c` snippets for real: launch_grid plans the grid with it, setup
    reads the jax version). Yields the folder
    where they write: gcloud.log must never appear, python.log holds one line per call."""
    folder = tmp_path_factory.mktemp("stand_ins")
    (folder / "gcloud").write_text(f'#!/bin/sh\necho "$*" >> {folder}/gcloud.log\nexit 0\n')
    (folder / "python").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *experiments.run_grid* | "-c "*) exec {sys.executable} "$@" ;; esac\n'
        f'echo "$*" >> {folder}/python.log\n')
    for name in ("gcloud", "python"):
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("GATED_ATTENTION_PYTHON", str(folder / "python"))
    yield folder
    assert not (folder / "gcloud.log").exists(), "a test called gcloud"


def preflight_calls(stand_ins):
    log = stand_ins / "python.log"
    return [shlex.split(line) for line in log.read_text().splitlines()] if log.exists() else []


def write_settings(tmp_path, **changes):
    settings = {**SETTINGS, **changes}
    path = tmp_path / "pod.env"
    path.write_text("".join(f"{k}={v}\n" for k, v in settings.items() if v is not None))
    return path


def run(script, *args, env=None):
    return subprocess.run(["bash", str(SCRIPTS / script), *args], capture_output=True,
                          text=True, env=env, timeout=30)


def dry_run(tmp_path, script, *args, **settings):
    result = run(script, *args, "--config", str(write_settings(tmp_path, **settings)),
                 "--dry-run")
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in result.stdout.splitlines()]


def remote_command_text(argv):
    (command,) = [a for a in argv if a.startswith("--command=")]
    return command.removeprefix("--command=")


def remote_command(argv):
    return shlex.split(remote_command_text(argv))


def test_every_script_is_shellcheck_clean():
    assert set(SCRIPT_ARGS) | {"common.sh"} == set(ALL)
    shellcheck = Path(sys.executable).with_name("shellcheck")
    result = subprocess.run([str(shellcheck), "-x", "-P", "SCRIPTDIR",
                             *(str(SCRIPTS / s) for s in ALL)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_create_asks_queued_resources_or_creates_directly(tmp_path):
    queued = dry_run(tmp_path, "create.sh")
    assert queued[0] == ["gcloud", "compute", "tpus", "queued-resources", "create", "ga-pod",
                         "--node-id=ga-pod", *LOCATION, "--accelerator-type=v4-32",
                         "--runtime-version=tpu-ubuntu2204-base", "--spot"]
    direct = dry_run(tmp_path, "create.sh", QUEUED="false", SPOT="false")
    assert direct == [["gcloud", "compute", "tpus", "tpu-vm", "create", "ga-pod", *LOCATION,
                       "--accelerator-type=v4-32", "--version=tpu-ubuntu2204-base"]]


def test_setup_copies_the_commit_and_installs_on_every_worker(tmp_path):
    archive, scp, ssh = dry_run(tmp_path, "setup.sh", EXTRAS="seqio")
    assert archive[:2] == ["git", "-C"] and archive[3:5] == ["archive", "--format=tar.gz"]
    assert scp[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive[5][9:]]
    assert scp[6:] == ["ga-pod:gated_attention.tar.gz", *LOCATION, "--worker=all"]
    assert ssh[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ga-pod", *LOCATION,
                       "--worker=all"]
    remote = remote_command(ssh)
    assert ".[gcs,seqio]" in remote and f"jax[tpu]=={jax.__version__}" in remote
    text = remote_command_text(ssh)  # uv brings Python 3.11; the image's python3 is not used
    assert "uv venv --clear --python 3.11 .venv" in text and "python3 -m venv" not in text
    *_, plain = dry_run(tmp_path, "setup.sh", EXTRAS="")
    assert ".[gcs]" in remote_command(plain)  # gs:// workdirs need gcsfs, always


def test_launch_runs_main_on_all_workers_with_a_gcs_workdir(tmp_path):
    (ssh,) = dry_run(tmp_path, "launch.sh", "--name", "r1", "--variant", "g1_sdpa_elementwise",
                     "--", "--config.train.steps=10", "--config.data.paths=a b")
    assert ssh[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ga-pod", *LOCATION,
                       "--worker=all"]
    remote = remote_command(ssh)
    start = remote.index("-m")
    assert remote[start - 2:start] == ["nohup", ".venv/bin/python"]
    assert "GATED_ATTENTION_MULTIHOST=1" in remote
    assert remote[start + 1:start + 7] == [
        "gated_attention.main",
        "--config=configs/ablation.py:arch=tiny,variant=g1_sdpa_elementwise",
        "--workdir=gs://bkt/ga/runs/r1", "--progress=false", "--config.train.steps=10",
        "--config.data.paths=a b"]
    assert remote[-6:] == [">", "~/logs/r1.log", "2>&1", "<", "/dev/null", "&"]


WORKER_ID = ("GATED_ATTENTION_WORKER_ID=$(curl -sf -H 'Metadata-Flavor: Google' "
             "http://metadata.google.internal/computeMetadata/v1/instance/attributes/"
             "agent-worker-number)")


def test_launch_grid_runs_the_grid_runner_with_a_gcs_root(tmp_path):
    (ssh,) = dry_run(tmp_path, "launch_grid.sh", "--grid", "experiments/grids/table1.py",
                     "--name", "t1", "--", "--scale", "tiny")
    assert ssh[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ga-pod", *LOCATION,
                       "--worker=all"]
    command = remote_command_text(ssh)
    # Each worker's number comes from the TPU VM metadata server, before anything starts.
    assert f"cd ~/gated_attention && if {WORKER_ID}; then export GATED_ATTENTION_WORKER_ID;" \
        in command
    remote = shlex.split(command)
    start = remote.index("experiments.run_grid")
    assert remote[start - 6:start] == ["GATED_ATTENTION_MULTIHOST=1",
                                       "GATED_ATTENTION_INIT_TIMEOUT_S=3600", "setsid", "nohup",
                                       ".venv/bin/python", "-m"]
    assert remote[start + 1:start + 15] == [
        "experiments/grids/table1.py", "--root", "gs://bkt/ga/grids/t1", "--parallel", "1",
        "--worker", "$GATED_ATTENTION_WORKER_ID", "--scale", "tiny",
        ">", "~/logs/grid-t1.log", "2>&1", "<", "/dev/null"]
    syntax = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def _fake_worker(tmp_path, curl_script):
    """A home with ~/gated_attention/.venv/bin/python that records how it was started, and a
    PATH whose curl is `curl_script` (the rest of the PATH as usual, for setsid and nohup)."""
    home, bin_dir = tmp_path / "home", tmp_path / "bin"
    venv = home / "gated_attention" / ".venv" / "bin"
    venv.mkdir(parents=True)
    bin_dir.mkdir()
    (venv / "python").write_text('#!/bin/sh\necho "id=$GATED_ATTENTION_WORKER_ID '
                                 'multihost=$GATED_ATTENTION_MULTIHOST '
                                 'timeout=$GATED_ATTENTION_INIT_TIMEOUT_S args=$*" > "$HOME/ran"\n')
    (bin_dir / "curl").write_text("#!/bin/sh\n" + curl_script)
    for script in (venv / "python", bin_dir / "curl"):
        script.chmod(0o755)
    return home, {**os.environ, "HOME": str(home), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.mark.parametrize("metadata_up", [True, False])
def test_launch_grid_remote_command_runs_with_the_metadata_worker_number(tmp_path, metadata_up):
    """The printed remote command, run by bash as a worker's shell would, starts run_grid with
    --worker 3 and GATED_ATTENTION_WORKER_ID=3 when the metadata server answers 3; without an
    answer it starts nothing and says why."""
    (ssh,) = dry_run(tmp_path, "launch_grid.sh", "--grid", "experiments/grids/table1.py",
                     "--name", "t1", "--", "--scale", "tiny")
    command = remote_command_text(ssh)
    curl = ('[ "$3" = "Metadata-Flavor: Google" ] && [ "${4##*/}" = agent-worker-number ] '
            "&& echo 3" if metadata_up else "exit 22")
    home, env = _fake_worker(tmp_path, curl + "\n")
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env,
                            timeout=30)
    ran = home / "ran"
    if not metadata_up:
        assert result.returncode == 1
        assert "no worker number from the TPU metadata server" in result.stderr
        time.sleep(0.2)
        assert not ran.exists()
        return
    assert result.returncode == 0, result.stderr
    deadline = time.monotonic() + 20
    while not (ran.exists() and ran.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ran.read_text() == (
        "id=3 multihost=1 timeout=3600 args=-m experiments.run_grid "
        "experiments/grids/table1.py --root gs://bkt/ga/grids/t1 --parallel 1 --worker 3 "
        "--scale tiny\n")
    assert (home / "logs" / "grid-t1.log").exists()



def test_logs_and_teardown(tmp_path):
    (ssh,) = dry_run(tmp_path, "logs.sh", "--name", "r1", "--worker", "3")
    assert "--worker=3" in ssh and remote_command(ssh) == ["tail", "-n", "100", "-F",
                                                           "~/logs/r1.log"]
    (delete,) = dry_run(tmp_path, "teardown.sh", "--yes")
    assert delete == ["gcloud", "compute", "tpus", "queued-resources", "delete", "ga-pod",
                      *LOCATION, "--force", "--quiet"]
    refused = run("teardown.sh", "--config", str(write_settings(tmp_path)))
    assert refused.returncode == 2 and "pass --yes to confirm" in refused.stderr


@pytest.mark.parametrize("script", sorted(SCRIPT_ARGS))
@pytest.mark.parametrize("missing", ["PROJECT", "ZONE", "TPU_NAME"])
def test_every_script_names_a_missing_setting(tmp_path, script, missing):
    settings = write_settings(tmp_path, **{missing: None})
    result = run(script, *SCRIPT_ARGS[script], "--config", str(settings), "--dry-run")
    assert result.returncode == 2
    assert f"error: {missing} is not set in {settings}" in result.stderr


@pytest.mark.parametrize("script, setting, value, message", [
    ("create.sh", "TPU_TYPE", None, "TPU_TYPE is not set"),
    ("create.sh", "TPU_TYPE", "v4", "is not an accelerator type such as v4-32"),
    ("create.sh", "SPOT", "yes", "SPOT=yes in"),
    ("launch.sh", "BUCKET", None, "BUCKET is not set"),
    ("launch.sh", "BUCKET", "/data/runs", "must be a gs:// path"),
    ("launch_grid.sh", "BUCKET", None, "BUCKET is not set"),
])
def test_scripts_refuse_bad_settings(tmp_path, script, setting, value, message):
    settings = write_settings(tmp_path, **{setting: value})
    result = run(script, *SCRIPT_ARGS[script], "--config", str(settings), "--dry-run")
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_scripts_refuse_bad_flags_and_a_missing_settings_file(tmp_path):
    settings = str(write_settings(tmp_path))
    cases = [
        (["launch.sh", "--config", settings], "--name is required"),
        (["launch.sh", "--name", "a/b", "--config", settings], "may only hold letters"),
        (["launch.sh", "--name", "r", "--steps", "3", "--config", settings],
         "unknown flag '--steps'"),
        (["launch_grid.sh", "--name", "t", "--grid", "nope.py", "--config", settings],
         "--grid nope.py is not a file of this checkout"),
        (["create.sh", "--config", str(tmp_path / "absent.env")], "absent.env not found: copy"),
    ]
    for (script, *args), message in cases:
        result = run(script, *args, "--dry-run")
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)


def test_without_gcloud_the_check_stops_and_a_dry_run_still_prints(tmp_path):
    bin_dir = tmp_path / "bin"  # a PATH with bash and nothing else
    bin_dir.mkdir()
    (bin_dir / "bash").symlink_to(subprocess.check_output(["which", "bash"], text=True).strip())
    env = {**os.environ, "PATH": str(bin_dir)}
    # The check itself, as a script without --dry-run meets it (no script is run for real).
    check = subprocess.run(["bash", "-c", f"source {SCRIPTS / 'common.sh'}; require_gcloud"],
                           capture_output=True, text=True, env=env, timeout=30)
    assert check.returncode == 2
    assert "gcloud is not on the PATH" in check.stderr and "--dry-run" in check.stderr
    printed = run("create.sh", "--config", str(write_settings(tmp_path)), "--dry-run", env=env)
    assert printed.returncode == 0 and printed.stdout.startswith("gcloud compute tpus")


@pytest.mark.parametrize("script", sorted(SCRIPT_ARGS))
def test_every_script_answers_help(script):
    result = run(script, "--help")
    assert result.returncode == 0, result.stderr
    assert f"tpu_scripts/{script}" in result.stdout and "--dry-run" in result.stdout


# Google's Cloud TPU documentation, "TPU software versions": the image per generation for JAX.
@pytest.mark.parametrize("tpu_type, image", [
    ("v6e-64", "v2-alpha-tpuv6e"), ("v5p-128", "v2-alpha-tpuv5"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite"), ("v4-32", "tpu-ubuntu2204-base")])
def test_create_uses_each_generations_own_runtime_image(tmp_path, tpu_type, image):
    (create, _) = dry_run(tmp_path, "create.sh", TPU_TYPE=tpu_type)
    assert f"--runtime-version={image}" in create and f"--accelerator-type={tpu_type}" in create
    from gated_attention.tpu_topologies import parse_accelerator

    assert parse_accelerator(tpu_type).runtime_version == image  # the Python side agrees
    refused = run("create.sh", "--config", str(write_settings(
        tmp_path, TPU_TYPE=tpu_type, RUNTIME_VERSION="v2-alpha-tpuv6e" if image !=
        "v2-alpha-tpuv6e" else "v2-alpha-tpuv5")), "--dry-run")
    assert refused.returncode == 2 and f"{tpu_type} needs {image}" in refused.stderr
    custom = dry_run(tmp_path, "create.sh", TPU_TYPE=tpu_type, RUNTIME_VERSION="my-image")
    assert "--runtime-version=my-image" in custom[0]


def test_launch_runs_the_preflight_for_the_pods_accelerator_first(tmp_path, stand_ins):
    dry_run(tmp_path, "launch.sh", "--name", "r1", "--arch", "small", "--variant",
            "g1_sdpa_headwise", "--", "--config.train.steps=10", "--overwrite",
            TPU_TYPE="v5p-64")
    assert preflight_calls(stand_ins) == [[
        "-m", "gated_attention.preflight",
        "--config=configs/ablation.py:arch=small,variant=g1_sdpa_headwise",
        "--accelerator=v5p-64", "--config.train.steps=10"]]


def test_launch_refuses_when_the_real_preflight_fails(tmp_path, monkeypatch):
    """The real pre-flight (a batch the mesh cannot split: refused before compiling) stops
    the launch: an error, and no gcloud command printed."""
    monkeypatch.setenv("GATED_ATTENTION_PYTHON", sys.executable)
    monkeypatch.setenv("PYTHONPATH", str(SCRIPTS.parent))
    result = run("launch.sh", "--name", "r1", "--config", str(write_settings(tmp_path)),
                 "--dry-run", "--", "--config.train.batch_size=3")
    assert result.returncode == 2, result.stderr
    assert "train.batch_size / train.grad_accum = 3 sequences must be divisible" in result.stderr
    assert "nothing was started" in result.stderr and result.stdout == ""


def test_launch_grid_preflights_each_distinct_run_config_once(tmp_path, stand_ins):
    dry_run(tmp_path, "launch_grid.sh", "--grid", "experiments/grids/table3.py", "--name", "t3",
            "--", "--scale", "tiny", "--seeds", "0,1")
    calls = preflight_calls(stand_ins)
    plan = subprocess.run(
        [sys.executable, "-m", "experiments.run_grid", "experiments/grids/table3.py", "--root",
         str(tmp_path / "r"), "--dry_run", "--no_analyze", "--scale", "tiny", "--seeds", "0"],
        capture_output=True, text=True, cwd=SCRIPTS.parent, timeout=60,
        env={**os.environ, "PYTHONPATH": str(SCRIPTS.parent)})
    runs = [line for line in plan.stdout.splitlines() if line.startswith("# ")]
    assert len(calls) == len(runs) > 1  # seeds 0 and 1 share one pre-flight
    assert all(c[:2] == ["-m", "gated_attention.preflight"] and "--accelerator=v4-32" in c
               and not any(a.startswith("--config.seed") for a in c) for c in calls)
