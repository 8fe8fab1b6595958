"""The step watchdog: a stuck step ends the process with every thread's stack and exit 75.

Its exit code is one a grid on Ray retries (experiments/ray_grid.py: RETRY_EXITS, checked in
tests/test_ray_grid.py).
"""

import io
import subprocess
import sys
import time
from contextlib import redirect_stderr

import pytest

from gated_attention.config import run_config
from gated_attention.training import watchdog


def test_a_stuck_step_prints_every_stack_and_exits_75(tmp_path):
    """A real process: the watchdog must end it even while the main thread is blocked."""
    script = tmp_path / "stuck.py"
    script.write_text(
        "import threading, time\n"
        "from gated_attention import watchdog\n"
        "dog = watchdog.StepWatchdog(timeout=0.3, first_timeout=1.0)\n"
        "dog.arm(0, first=True)\n"
        "for step in range(3):\n"
        "    time.sleep(0.1)\n"
        "    dog.arm(step + 1)\n"
        "def step_waiting_for_a_dead_peer():\n"
        "    threading.Event().wait()\n"
        "step_waiting_for_a_dead_peer()\n")
    start = time.monotonic()
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path),
                          env={"PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[1]),
                               "PATH": "/usr/bin:/bin"})
    took = time.monotonic() - start
    assert done.returncode == watchdog.EXIT_CODE == 75, done.stderr
    assert "no progress for 0.3 s after step 3" in done.stderr
    assert "in step_waiting_for_a_dead_peer" in done.stderr  # the stack of the step
    assert took < 20  # Python start-up and imports included; the steps re-armed it in time


def test_rearming_keeps_it_quiet_and_one_host_has_none():
    exits = []
    dog = watchdog.StepWatchdog(0.2, 0.2, exit_fn=exits.append)
    with dog:
        for step in range(5):
            dog.arm(step)
            time.sleep(0.05)
    time.sleep(0.3)
    assert exits == []
    err = io.StringIO()
    with redirect_stderr(err):
        dog.arm(7)
        deadline = time.monotonic() + 5
        while not exits and time.monotonic() < deadline:
            time.sleep(0.02)
    assert exits == [75]
    train = run_config.train_section()
    assert not watchdog.for_run(train, process_count=1).enabled
    several = watchdog.for_run(train, process_count=2)
    assert (several.timeout, several.first_timeout) == (900.0, 3600.0)


@pytest.mark.parametrize("field", ["step_timeout_s", "first_step_timeout_s"])
def test_a_negative_timeout_is_refused_in_one_line(field):
    config = run_config.base_config("tiny", "baseline")
    config.train[field] = -1.0
    with pytest.raises(run_config.ConfigError,
                       match=rf"^train.{field}=-1.0 must be >= 0 seconds \(0 turns the "
                             r"watchdog off\)$"):
        run_config.validate_run_config(config)
