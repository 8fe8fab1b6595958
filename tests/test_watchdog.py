"""The step watchdog: a stuck step ends the process with every thread's stack and exit 75.

Its exit code is one a grid on Ray retries (experiments/ray_grid.py: RETRY_EXITS, checked in
tests/test_ray_grid.py).
"""

import io
import pathlib
import subprocess
import sys
from contextlib import redirect_stderr

import pytest

from gated_attention.config import run_config
from gated_attention.training import watchdog


class FakeClock:
    """Seconds that pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def fake_dog(timeout: float = 600.0, first_timeout: float = 3600.0):
    """A watchdog checked by hand against a fake clock (its faulthandler backup is armed for
    the real timeout plus 10 s, far beyond the test: the `with` block cancels it)."""
    exits, clock = [], FakeClock()
    dog = watchdog.StepWatchdog(timeout, first_timeout, exit_fn=exits.append, clock=clock,
                                watch_in_thread=False)
    return dog, clock, exits


def test_rearming_before_the_deadline_keeps_it_quiet():
    dog, clock, exits = fake_dog()
    with dog:
        dog.arm(0, first=True)
        clock.now += 3599.0  # the first step may take the compile's first_timeout
        assert dog.check() == 1.0
        for step in range(1, 6):
            dog.arm(step)
            clock.now += 599.5
            assert dog.check() == 0.5
    assert exits == []


def test_a_missed_deadline_names_the_step_prints_every_stack_and_exits_75():
    dog, clock, exits = fake_dog()
    err = io.StringIO()
    with dog, redirect_stderr(err):
        dog.arm(0, first=True)
        dog.arm(3, during="the checkpoint")
        clock.now += 599.9
        assert dog.check() == pytest.approx(0.1) and exits == []
        clock.now += 0.1  # exactly the timeout
        assert dog.check() is None
        assert dog.check() is None  # fired once: not armed any more
    assert exits == [75]
    assert "no progress for 600 s after step 3 during the checkpoint" in err.getvalue()
    assert "test_a_missed_deadline_names_the_step" in err.getvalue()  # this thread's stack


def test_disarmed_or_disabled_never_fires():
    dog, clock, exits = fake_dog()
    with dog:
        dog.arm(1)
        dog.disarm()
        clock.now += 10_000.0
        assert dog.check() is None
    off = watchdog.StepWatchdog(0.0, 0.0, exit_fn=exits.append, watch_in_thread=False)
    off.arm(1)
    assert not off.enabled and off.check() is None
    assert exits == []


def test_one_host_has_no_watchdog_and_several_have_the_configured_timeouts():
    train = run_config.train_section()
    assert not watchdog.for_run(train, process_count=1).enabled
    several = watchdog.for_run(train, process_count=2)
    assert (several.timeout, several.first_timeout) == (900.0, 3600.0)


def test_the_thread_ends_a_stuck_step_in_a_real_process(tmp_path):
    """The one real-time test: the watchdog's thread must end the process while the main
    thread is blocked, after the steps re-armed it in time."""
    script = tmp_path / "stuck.py"
    script.write_text(
        "import threading, time\n"
        "from gated_attention.training import watchdog\n"
        "dog = watchdog.StepWatchdog(timeout=0.3, first_timeout=1.0)\n"
        "dog.arm(0, first=True)\n"
        "for step in range(3):\n"
        "    time.sleep(0.1)\n"
        "    dog.arm(step + 1)\n"
        "def step_waiting_for_a_dead_peer():\n"
        "    threading.Event().wait()\n"
        "step_waiting_for_a_dead_peer()\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=60, cwd=str(tmp_path),
                          env={"PYTHONPATH": str(pathlib.Path(__file__).parents[1]),
                               "PATH": "/usr/bin:/bin"})
    assert done.returncode == watchdog.EXIT_CODE == 75, done.stderr
    assert "no progress for 0.3 s after step 3" in done.stderr
    assert "in step_waiting_for_a_dead_peer" in done.stderr  # the stack of the step


@pytest.mark.parametrize("field", ["step_timeout_s", "first_step_timeout_s"])
def test_a_negative_timeout_is_refused_in_one_line(field):
    config = run_config.base_config("tiny", "baseline")
    config.train[field] = -1.0
    with pytest.raises(run_config.ConfigError,
                       match=rf"^train.{field}=-1.0 must be >= 0 seconds \(0 turns the "
                             r"watchdog off\)$"):
        run_config.validate_run_config(config)
