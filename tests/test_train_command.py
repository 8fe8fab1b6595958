"""The training command is built in one place: its argv is checked against hand-written ones,
and the demo, the grids and the pod scripts are checked to take theirs from it."""

import shlex
import subprocess
import sys
from pathlib import Path

from gated_attention.cli import train_command

REPO = Path(__file__).resolve().parents[1]


def test_train_argv_is_the_documented_command():
    argv = train_command.train_argv("configs/tiny.py:variant=baseline", "runs/a",
                                    {"train.steps": 20, "optimizer.peak_lr": 0.003},
                                    python="py", progress=False, overwrite=True,
                                    extra=["--multihost=auto"])
    assert argv == ["py", "-m", "gated_attention.main", "--config=configs/tiny.py:variant=baseline",
                    "--workdir=runs/a", "--progress=False", "--config.train.steps=20",
                    "--config.optimizer.peak_lr=0.003", "--overwrite", "--multihost=auto"]


def test_the_printer_quotes_for_a_shell():
    out = subprocess.run(
        [sys.executable, "-m", "gated_attention.cli.train_command", "--python=.venv/bin/python",
         "--config=configs/ablation.py:arch=tiny,variant=baseline", "--workdir=gs://b/runs/a b",
         "--progress=false", "--", "--config.data.path=x y"], capture_output=True, text=True,
        check=True, cwd=REPO).stdout
    assert shlex.split(out) == [
        ".venv/bin/python", "-m", "gated_attention.main",
        "--config=configs/ablation.py:arch=tiny,variant=baseline", "--workdir=gs://b/runs/a b",
        "--progress=false", "--config.data.path=x y"]


def test_the_demo_and_the_grids_launch_the_same_command(tmp_path):
    from experiments import grid_lib, run_grid
    from gated_attention import demo

    run = grid_lib.Run(arch="tiny", variant="baseline", seed=0)
    grid_train, _ = run_grid.commands(run, tmp_path, "tiny", {})
    demo_train = demo.sink_train_commands(tmp_path, {"train.steps": 3}, progress=True,
                                          overwrite=False)[0]
    assert grid_train[:3] == demo_train[:3] == [sys.executable, "-m", train_command.MODULE]
    # The launch scripts build it with common.sh's train_command, which asks this module.
    common = (REPO / "tpu_scripts" / "common.sh").read_text()
    assert "from gated_attention.cli.train_command import main" in common
    for script in ("launch.sh", "gke_launch.sh"):
        text = (REPO / "tpu_scripts" / script).read_text()
        assert '="$(train_command "' in text and "gated_attention.main --" not in text
