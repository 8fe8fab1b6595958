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
            "TPU_NAME": "ga-pod", "TPU_TYPE": "v4-32", "SPOT": "true", "QUEUED": "true",
            "GKE_CLUSTER": "my-gke"}
LOCATION = ["--project=my-proj", "--zone=us-central2-b"]
SCRIPT_ARGS = {"create.sh": [], "setup.sh": [], "teardown.sh": ["--yes"],
               "launch.sh": ["--name", "r1"], "logs.sh": ["--name", "r1"],
               "gke_launch.sh": ["--name", "r1"]}


@pytest.fixture(autouse=True)
def stand_ins(tmp_path_factory, monkeypatch):
    """A recording `gcloud` (and `xpk`, `docker`) first on PATH, and a recording Python for
    the pre-flight (it runs experiments.grid_workloads and `-c` snippets for real: gke_launch
    lists a grid's runs with it, setup reads the jax version). Builds go to a folder of the
    test's own. Yields the folder where they write: gcloud.log, xpk.log and docker.log must
    never appear, python.log holds one line per call."""
    folder = tmp_path_factory.mktemp("stand_ins")
    (folder / "gcloud").write_text(f'#!/bin/sh\necho "$*" >> {folder}/gcloud.log\nexit 0\n')
    (folder / "xpk").write_text(f'#!/bin/sh\necho "$*" >> {folder}/xpk.log\nexit 0\n')
    (folder / "python").write_text(
        "#!/bin/sh\n"
        f'case "$*" in *experiments.grid_workloads* | "-c "*) exec {sys.executable} "$@" ;; esac\n'
        f'echo "$*" >> {folder}/python.log\n')
    (folder / "docker").write_text(f'#!/bin/sh\necho "$*" >> {folder}/docker.log\nexit 0\n')
    for name in ("gcloud", "xpk", "docker", "python"):
        (folder / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    monkeypatch.setenv("GATED_ATTENTION_PYTHON", str(folder / "python"))
    monkeypatch.setenv("GATED_ATTENTION_BUILD_ROOT", str(folder / "build"))
    yield folder
    assert not (folder / "gcloud.log").exists(), "a test called gcloud"
    assert not (folder / "xpk.log").exists(), "a test called xpk"
    assert not (folder / "docker.log").exists(), "a test called docker"


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
    # the docs call them as commands: tpu_scripts/launch.sh ...
    assert [s for s in SCRIPT_ARGS if not os.access(SCRIPTS / s, os.X_OK)] == []
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


def built_commit(lines):
    """The commit a dry run builds (its `git archive`): HEAD when it ran (HEAD or one of its
    ancestors now, if a commit came meanwhile)."""
    (archive,) = [line for line in lines if line[:1] == ["git"] and "archive" in line]
    commit = archive[-1]
    assert len(commit) == 12 and subprocess.run(
        ["git", "-C", str(SCRIPTS.parent), "merge-base", "--is-ancestor", commit, "HEAD"]
    ).returncode == 0
    return commit


def build_steps(build, python, commit):
    """The commands setup.sh prints to build a commit's wheel and configs once."""
    part = f"{build}/{commit}.partial"
    return [["rm", "-rf", part], ["mkdir", "-p", f"{part}/src"],
            ["git", "-C", str(SCRIPTS.parent), "archive", "--format=tar",
             f"--output={part}/src.tar", commit],
            ["tar", "-xf", f"{part}/src.tar", "-C", f"{part}/src"],
            [python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
             f"--wheel-dir={part}/dist", f"{part}/src"],
            ["cp", "-r", f"{part}/src/configs", f"{part}/configs"],
            ["rm", "-rf", f"{part}/src", f"{part}/src.tar"],
            ["echo", commit, ">", f"{part}/COMMIT", "&&", "mv", part, f"{build}/{commit}"]]


def test_setup_builds_the_commit_once_and_installs_its_wheel_on_every_worker(tmp_path,
                                                                             stand_ins):
    build = stand_ins / "build"
    *steps, tar, scp, ssh = dry_run(tmp_path, "setup.sh", EXTRAS="seqio")
    head = built_commit(steps)
    assert steps == build_steps(build, os.environ["GATED_ATTENTION_PYTHON"], head)
    archive = f"{build}/gated_attention-{head}.tar.gz"
    assert tar == ["tar", "-czf", archive, "-C", f"{build}/{head}", "."]
    assert scp == ["gcloud", "compute", "tpus", "tpu-vm", "scp", archive,
                   "ga-pod:gated_attention.tar.gz", *LOCATION, "--worker=all"]
    assert ssh[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ga-pod", *LOCATION,
                       "--worker=all"]
    text = remote_command_text(ssh)  # uv brings Python 3.11; the image's python3 is not used
    assert "uv venv --clear --python 3.11 .venv" in text and "python3 -m venv" not in text
    assert ("uv pip install --python .venv/bin/python -q --reinstall-package gated_attention "
            f'"$(ls dist/*.whl)[gcs,seqio]" \'jax[tpu]=={jax.__version__}\'') in text
    assert "git archive" not in text and " -e " not in text  # the wheel, not the source tree
    *_, plain = dry_run(tmp_path, "setup.sh", EXTRAS="")
    assert '"$(ls dist/*.whl)[gcs]"' in remote_command_text(plain)  # gs:// workdirs: gcsfs


def test_setup_after_a_recreate_installs_the_pinned_build_not_a_later_commit(tmp_path,
                                                                           stand_ins):
    """The TPU_NAME's first setup pinned commit `abc`; a recreate's setup installs abc's
    build again (a resumed run keeps its code) and says HEAD differs; --rebuild builds HEAD."""
    build = stand_ins / "build"
    (build / "pins").mkdir(parents=True)
    (build / "pins" / "ga-pod").write_text("abc\n")
    (build / "abc").mkdir()
    (build / "abc" / "COMMIT").write_text("abc\n")
    result = run("setup.sh", "--config", str(write_settings(tmp_path)), "--dry-run")
    assert result.returncode == 0, result.stderr
    tar, _, _ = [shlex.split(line) for line in result.stdout.splitlines()]
    assert tar[:3] == ["tar", "-czf", f"{build}/gated_attention-abc.tar.gz"]
    assert "ga-pod runs commit abc (pinned at its first setup); HEAD is " in result.stderr
    *steps, _, _, _ = dry_run(tmp_path, "setup.sh", "--rebuild")
    assert steps == build_steps(build, os.environ["GATED_ATTENTION_PYTHON"],
                                built_commit(steps))


def test_launch_runs_main_on_all_workers_with_a_gcs_workdir(tmp_path):
    result = run("launch.sh", "--name", "r1", "--variant", "g1_sdpa_elementwise",
                 "--config", str(write_settings(tmp_path)), "--dry-run", "--",
                 "--config.train.steps=10", "--config.data.paths=a b")
    assert result.returncode == 0, result.stderr
    (ssh,) = [shlex.split(line) for line in result.stdout.splitlines()]
    assert ssh[:9] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "ga-pod", *LOCATION,
                       "--worker=all"]
    remote = remote_command(ssh)
    assert "GATED_ATTENTION_MULTIHOST=1" in remote
    assert not any(a.startswith("MEGASCALE") for a in remote)  # one slice: none
    # worker_log wraps main: the worker's output goes to ~/logs and into the bucket
    start = remote.index("gated_attention.pods.worker_log")
    assert remote[start - 4:start + 6] == [
        "setsid", "nohup", ".venv/bin/python", "-m", "gated_attention.pods.worker_log",
        "--dest", "gs://bkt/ga/runs/r1/logs", "--name", "worker-{worker}.log", "--"]
    assert remote[start + 6:start + 14] == [
        ".venv/bin/python", "-m", "gated_attention.main",
        "--config=configs/ablation.py:arch=tiny,variant=g1_sdpa_elementwise",
        "--workdir=gs://bkt/ga/runs/r1", "--progress=false", "--config.train.steps=10",
        "--config.data.paths=a b"]
    assert remote[-6:] == [">>", "~/logs/r1.log", "2>&1", "<", "/dev/null", "&"]
    # a worker where a training of r1 lives refuses (its wrapper holds the lock on fd 9)
    assert remote_command_text(ssh).startswith(
        "mkdir -p ~/logs && cd ~/gated_attention && exec 9>>~/logs/r1.lock && if ! flock -n 9;"
        " then echo \"error: $(hostname): a training of r1 is alive on this worker")
    # a dry run started nothing and does not say it did
    assert "Started" not in result.stderr
    assert "# Would start r1 on every worker; workdir gs://bkt/ga/runs/r1" in result.stderr


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
        (["gke_launch.sh", "--name", "t", "--grid", "nope.py", "--config", settings],
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
    from gated_attention.compile.tpu_topologies import parse_accelerator

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


# ---------------------------------------------------------------- types, extra flags, slices

def test_create_refuses_a_type_the_preflight_cannot_describe_before_any_gcloud_call(tmp_path):
    """v4-100 names no slice shape: refused with the reason, nothing printed or created (the
    fixture checks gcloud was never called); --no-preflight creates it anyway."""
    settings = str(write_settings(tmp_path, TPU_TYPE="v4-100"))
    for dry in ([], ["--dry-run"]):
        refused = run("create.sh", "--config", settings, *dry)
        assert refused.returncode == 2 and refused.stdout == ""
        assert "TPU_TYPE=v4-100 in" in refused.stderr
        assert "accelerator 'v4-100' is not a Cloud TPU type" in refused.stderr
        assert "Nothing was created; pass --no-preflight" in refused.stderr
    forced = run("create.sh", "--config", settings, "--dry-run", "--no-preflight")
    assert forced.returncode == 0 and "--accelerator-type=v4-100" in forced.stdout


@pytest.mark.parametrize("tpu_type, topology", [
    ("v4-384", "v4:4x4x12"), ("v5p-12288", "v5p:16x16x24"), ("v4-8192", "v4:16x16x16"),
    ("v3-32", "v3:4x4")])
def test_create_accepts_the_documented_shapes(tmp_path, tpu_type, topology):
    result = run("create.sh", "--config", str(write_settings(tmp_path, TPU_TYPE=tpu_type)),
                 "--dry-run")
    assert result.returncode == 0, result.stderr
    assert f"--accelerator-type={tpu_type}" in shlex.split(result.stdout.splitlines()[0])
    assert f"# {tpu_type} topology={topology}" in result.stderr


def test_extra_create_and_ssh_args_pass_through(tmp_path):
    """As a bash array or as a string of words, the extra flags reach gcloud word by word."""
    array = {"EXTRA_CREATE_ARGS": "(--reserved --valid-until-duration=6h "
                                  "'--service-account=tpu@p.iam.gserviceaccount.com')",
             "EXTRA_SSH_ARGS": "(--internal-ip)"}
    create, _ = dry_run(tmp_path, "create.sh", **array)
    assert create[-4:] == ["--spot", "--reserved", "--valid-until-duration=6h",
                           "--service-account=tpu@p.iam.gserviceaccount.com"]
    (direct,) = dry_run(tmp_path, "create.sh", QUEUED="false",
                        EXTRA_CREATE_ARGS='"--network=my-vpc --subnetwork=sub --internal-ips"')
    assert direct[-4:] == ["--spot", "--network=my-vpc", "--subnetwork=sub", "--internal-ips"]
    *_, scp, ssh = dry_run(tmp_path, "setup.sh", EXTRA_SSH_ARGS='"--internal-ip '
                          '--tunnel-through-iap"')
    assert scp[-2:] == ["--internal-ip", "--tunnel-through-iap"]
    assert ssh[9:11] == ["--internal-ip", "--tunnel-through-iap"]
    (launch,) = dry_run(tmp_path, "launch.sh", "--name", "r1", **array)
    (logs,) = dry_run(tmp_path, "logs.sh", "--name", "r1", **array)
    assert launch[9] == logs[9] == "--internal-ip"
    (alpha, _) = dry_run(tmp_path, "create.sh", GCLOUD_TRACK="alpha",
                         EXTRA_CREATE_ARGS="(--provisioning-model=flex-start "
                                           "--max-run-duration=24h)")
    assert alpha[:4] == ["gcloud", "alpha", "compute", "tpus"]
    assert alpha[-2:] == ["--provisioning-model=flex-start", "--max-run-duration=24h"]


def test_multislice_create_setup_logs_and_teardown(tmp_path):
    create, describe = dry_run(tmp_path, "create.sh", SLICES="2", TPU_TYPE="v5litepod-4")
    assert create[:9] == ["gcloud", "compute", "tpus", "queued-resources", "create", "ga-pod",
                          "--node-count=2", "--node-prefix=ga-pod", *LOCATION[:1]]
    assert not any(a.startswith("--node-id") for a in create)
    *_, scp0, scp1, ssh0, ssh1 = dry_run(tmp_path, "setup.sh", SLICES="2")
    assert [scp0[6], scp1[6], ssh0[5], ssh1[5]] == [
        "ga-pod-0:gated_attention.tar.gz", "ga-pod-1:gated_attention.tar.gz", "ga-pod-0",
        "ga-pod-1"]
    (logs,) = dry_run(tmp_path, "logs.sh", "--name", "r1", "--slice", "1", SLICES="2")
    assert logs[5] == "ga-pod-1"
    (delete,) = dry_run(tmp_path, "teardown.sh", "--yes", SLICES="2")
    assert delete[4:6] == ["delete", "ga-pod"]  # the queued resource, with both slices
    settings = str(write_settings(tmp_path, SLICES="2"))
    bad = run("logs.sh", "--name", "r1", "--slice", "2", "--config", settings, "--dry-run")
    assert bad.returncode == 2 and "--slice 2 must be a slice number from 0 to 1" in bad.stderr
    for changes, message in [({"SLICES": "0"}, "SLICES=0 in"),
                             ({"SLICES": "2", "QUEUED": "false"}, "SLICES=2 in"),
                             ({"MOUNT": "gs://b"}, "MOUNT=gs://b in")]:
        result = run("create.sh", "--config", str(write_settings(tmp_path, **changes)),
                     "--dry-run")
        assert result.returncode == 2 and message in result.stderr, result.stderr


def test_multislice_launch_sets_megascale_per_slice_and_preflights_n_slices(tmp_path,
                                                                           stand_ins):
    describe, ssh0, ssh1 = dry_run(tmp_path, "launch.sh", "--name", "r1", "--",
                                   "--config.mesh.dcn_data=2", SLICES="2",
                                   TPU_TYPE="v5litepod-4")
    assert describe == ["gcloud", "compute", "tpus", "tpu-vm", "describe", "ga-pod-0",
                        *LOCATION, "--format=value(networkEndpoints[0].ipAddress)"]
    for slice_id, ssh in enumerate((ssh0, ssh1)):
        assert ssh[5] == f"ga-pod-{slice_id}" and "--worker=all" in ssh
        remote = remote_command(ssh)
        env = remote[remote.index("GATED_ATTENTION_MULTIHOST=1"):remote.index("setsid")]
        assert env == ["GATED_ATTENTION_MULTIHOST=1",
                       "MEGASCALE_COORDINATOR_ADDRESS=SLICE0_WORKER0_IP:8080",
                       "MEGASCALE_NUM_SLICES=2", f"MEGASCALE_SLICE_ID={slice_id}",
                       "MEGASCALE_PORT=8080"]
        assert f"slice-{slice_id}-worker-{{worker}}.log" in remote
    assert preflight_calls(stand_ins) == [[
        "-m", "gated_attention.preflight", "--config=configs/ablation.py:arch=tiny,variant="
        "baseline", "--accelerator=v5litepod-4", "--config.mesh.dcn_data=2", "--slices=2"]]


def test_multislice_remote_command_starts_each_worker_with_its_slice(tmp_path):
    """The printed remote command of slice 1, run by bash as a worker's shell would, starts
    the log wrapper (and through it main) with that slice's MEGASCALE variables."""
    *_, ssh1 = dry_run(tmp_path, "launch.sh", "--name", "r1", "--no-preflight",
                       SLICES="2", TPU_TYPE="v5litepod-4")
    home, env = _fake_worker(tmp_path, "exit 22\n")
    (home / "gated_attention" / ".venv" / "bin" / "python").write_text(
        '#!/bin/sh\necho "multihost=$GATED_ATTENTION_MULTIHOST '
        'coord=$MEGASCALE_COORDINATOR_ADDRESS slices=$MEGASCALE_NUM_SLICES '
        'slice=$MEGASCALE_SLICE_ID port=$MEGASCALE_PORT args=$*" > "$HOME/ran"\n')
    result = subprocess.run(["bash", "-c", remote_command_text(ssh1)], capture_output=True,
                            text=True, env=env, timeout=30)
    assert result.returncode == 0, result.stderr
    ran = home / "ran"
    deadline = time.monotonic() + 20
    while not (ran.exists() and ran.read_text().endswith("\n")) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ran.read_text() == (
        "multihost=1 coord=SLICE0_WORKER0_IP:8080 slices=2 slice=1 port=8080 args=-m "
        "gated_attention.pods.worker_log --dest gs://bkt/ga/runs/r1/logs --name "
        "slice-1-worker-{worker}.log -- .venv/bin/python -m gated_attention.main "
        "--config=configs/ablation.py:arch=tiny,variant=baseline --workdir=gs://bkt/ga/runs/r1 "
        "--progress=false\n")


def test_launch_no_preflight_skips_the_compile(tmp_path, stand_ins):
    result = run("launch.sh", "--name", "r1", "--no-preflight", "--config",
                 str(write_settings(tmp_path, TPU_TYPE="v5litepod-4")), "--dry-run")
    assert result.returncode == 0 and preflight_calls(stand_ins) == []
    assert "Pre-flight skipped (--no-preflight)" in result.stderr


def test_setup_mounts_the_bucket_with_gcsfuse_from_its_package_source(tmp_path):
    *_, ssh = dry_run(tmp_path, "setup.sh", MOUNT="my-bucket:/tmp/gcs/my-bucket")
    text = remote_command_text(ssh)
    assert ("https://packages.cloud.google.com/apt gcsfuse-'$(lsb_release -c -s)' main' | "
            "sudo tee /etc/apt/sources.list.d/gcsfuse.list") in text
    assert "sudo apt-get install -y -q fuse gcsfuse" in text
    assert text.endswith("mkdir -p /tmp/gcs/my-bucket && { mountpoint -q /tmp/gcs/my-bucket "
                         "|| gcsfuse --implicit-dirs my-bucket /tmp/gcs/my-bucket; }")
    syntax = subprocess.run(["bash", "-n", "-c", text], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    *_, plain = dry_run(tmp_path, "setup.sh")
    assert "gcsfuse" not in remote_command_text(plain)


# ---------------------------------------------------------------- GKE through xpk

def test_gke_launch_builds_the_image_once_and_submits_an_xpk_workload(tmp_path, stand_ins):
    """xpk 1.16's flags (tests/test_gke_launch.py runs the real xpk's dry run on them): the
    image built from a clean tree of HEAD with jax pinned, N slices, JobSet restarts, the
    pod's grace, and a command that execs the log wrapper and main (nothing installed at
    start); the same pre-flight as launch.sh first."""
    lines = dry_run(tmp_path, "gke_launch.sh", "--name", "r1_big", "--", "--config.mesh."
                    "dcn_data=2", TPU_TYPE="v5p-128", SLICES="2", MAX_RESTARTS="7",
                    EXTRA_XPK_ARGS="(--priority=high)", IMAGE_REPO="us-docker.pkg.dev/p/r/ga")
    *build, docker_build, push, xpk = lines
    head = built_commit(build)
    context = f"{stand_ins}/build/image-{head}"
    image = f"us-docker.pkg.dev/p/r/ga:{head}"
    assert build[2][3:] == ["archive", "--format=tar", f"--output={context}.tar", head]
    assert build[3] == ["tar", "-xf", f"{context}.tar", "-C", context]
    assert docker_build == ["docker", "build", "--build-arg=BASE_IMAGE=python:3.11-slim",
                            f"--build-arg=JAX_VERSION={jax.__version__}",
                            "--build-arg=EXTRAS=gcs", f"--tag={image}", context]
    assert push == ["docker", "push", image]
    assert xpk[:15] == [
        "xpk", "workload", "create", "--cluster=my-gke", "--project=my-proj",
        "--zone=us-central2-b", "--workload=ga-pod-r1-big", "--tpu-type=v5p-128",
        "--num-slices=2", "--max-restarts=7", "--termination-grace-period-seconds=30",
        f"--docker-image={image}", "--spot", "--priority=high",
        xpk[14]]
    words = shlex.split(xpk[14].removeprefix("--command="))
    assert words == [
        "export", "MEGASCALE_NUM_SLICES=2", "&&", "exec", "python", "-m",
        "gated_attention.pods.worker_log", "--dest", "gs://bkt/ga/runs/r1_big/logs", "--name",
        "slice-${MEGASCALE_SLICE_ID:-0}-worker-${TPU_WORKER_ID:-0}.log", "--", "python", "-m",
        "gated_attention.main", "--config=configs/ablation.py:arch=tiny,variant=baseline",
        "--workdir=gs://bkt/ga/runs/r1_big", "--progress=false", "--config.mesh.dcn_data=2"]
    assert preflight_calls(stand_ins) == [[
        "-m", "gated_attention.preflight", "--config=configs/ablation.py:arch=tiny,variant="
        "baseline", "--accelerator=v5p-128", "--config.mesh.dcn_data=2", "--slices=2"]]
    # --image names a built image: nothing is built
    *_, named = dry_run(tmp_path, "gke_launch.sh", "--name", "r2", "--image", "my/img:1",
                        "--no-preflight")
    assert [line[0] for line in _] == [] and "--docker-image=my/img:1" in named


def test_gke_launch_grid_submits_one_workload_per_run_in_the_grids_folders(tmp_path,
                                                                          stand_ins):
    """A grid on GKE (two variants of Table 3, seeds 0 and 1, through --only): one workload
    per run (Kueue queues them), workdirs as run_grid names them under $BUCKET/grids/NAME;
    one pre-flight per config, seeds aside."""
    from experiments import grid_workloads

    listed = grid_workloads.run_lines(str(SCRIPTS.parent / "experiments/grids/table3.py"),
                                      "gs://bkt/ga/grids/t3", "tiny", (0, 1))
    runs = [shlex.split(line) for line in listed[:4]]  # per variant, seed 0 then seed 1
    assert [r[0].rsplit("-", 1)[1] for r in runs] == ["s0", "s1", "s0", "s1"]
    lines = dry_run(tmp_path, "gke_launch.sh", "--grid", "experiments/grids/table3.py",
                    "--name", "t3", "--seeds", "0,1", "--only", ",".join(r[0] for r in runs),
                    "--image", "my/img:1", "--", "--config.train.steps=10")
    assert len(lines) == len(runs)
    for index, (xpk, (name, spec, *flags)) in enumerate(zip(lines, runs, strict=True)):
        assert xpk[6] == f"--workload=ga-pod-t3-{index}"
        words = shlex.split(remote_command_text(xpk))
        main = words[words.index("gated_attention.main") + 1:]
        assert main == [f"--config={spec}", f"--workdir=gs://bkt/ga/grids/t3/{name}",
                        "--progress=false", *flags, "--config.train.steps=10"]
    assert len(preflight_calls(stand_ins)) == 2
    unknown = run("gke_launch.sh", "--grid", "experiments/grids/table3.py", "--name", "t3",
                  "--only", "nope", "--config", str(write_settings(tmp_path)), "--dry-run")
    assert unknown.returncode == 2 and "--only names runs the grid does not hold: nope" in \
        unknown.stderr and unknown.stdout == ""


def test_gke_launch_refuses_bad_settings_and_skips_the_preflight_when_asked(tmp_path, stand_ins):
    settings = str(write_settings(tmp_path, GKE_CLUSTER=None))
    missing = run("gke_launch.sh", "--name", "r1", "--config", settings, "--dry-run")
    assert missing.returncode == 2 and "GKE_CLUSTER is not set" in missing.stderr
    long_name = run("gke_launch.sh", "--name", "x" * 40, "--config",
                    str(write_settings(tmp_path)), "--dry-run")
    assert long_name.returncode == 2 and "under 40 characters, as xpk requires" in long_name.stderr
    forced = run("gke_launch.sh", "--name", "r1", "--no-preflight", "--config",
                 str(write_settings(tmp_path, TPU_TYPE="tpu7x-8", SPOT="false")), "--dry-run")
    assert forced.returncode == 0, forced.stderr
    assert "--tpu-type=tpu7x-8" in forced.stdout and preflight_calls(stand_ins) == []
    # TPU7x on GCE: refused before any gcloud call, pointing to the GKE path
    for script in ("create.sh", "launch.sh"):
        gce = run(script, *SCRIPT_ARGS[script], "--config",
                  str(write_settings(tmp_path, TPU_TYPE="tpu7x-8")), "--dry-run")
        assert gce.returncode == 2 and "offered on GKE only" in gce.stderr and gce.stdout == ""


def test_settings_come_from_the_settings_file_alone(tmp_path):
    """A shell variable named like a setting (docs/c4_on_v5p.md exports MOUNT as a path) is
    not taken for a setting the file leaves out."""
    env = {**os.environ, "MOUNT": "/tmp/gcs/my-bucket", "GKE_CLUSTER": "from-the-shell"}
    result = run("launch.sh", "--name", "r1", "--no-preflight", "--config",
                 str(write_settings(tmp_path)), "--dry-run", env=env)
    assert result.returncode == 0, result.stderr
    missing = run("gke_launch.sh", "--name", "r1", "--config",
                  str(write_settings(tmp_path, GKE_CLUSTER=None)), "--dry-run", env=env)
    assert missing.returncode == 2 and "GKE_CLUSTER is not set" in missing.stderr
