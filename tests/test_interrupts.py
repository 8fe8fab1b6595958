"""A SIGTERM on several hosts: the loop's questions to jax's preemption notifier.

The notifier (XLA's PreemptionSyncManager, reached through orbax's `reached_preemption`)
is modelled here as its C++ source defines it: each call records its argument as the
process's call counter; a notice sets the sync point to the largest counter any process has
recorded, plus one; a call answers True only when its argument equals that point. The
training loop of a resumed run starts at its checkpoint's step: asked with the run's step, a
notice during start-up (counter 0, point 1) is never answered (the control below); asked with
the loop's own call count, the run stops after its first step.
"""

from __future__ import annotations

import pytest
from orbax.checkpoint import multihost

from gated_attention.training import interrupts


class Notifier:
    """XLA's preemption sync protocol for one process (the others in step with it)."""

    def __init__(self) -> None:
        self.counter, self.sync_point = 0, None

    def notice(self) -> None:
        self.sync_point = self.counter + 1

    def reached(self, step: int) -> bool:
        self.counter = step
        return self.sync_point == self.counter


@pytest.fixture
def notifier(monkeypatch):
    notifier = Notifier()
    monkeypatch.setattr(interrupts.jax, "process_count", lambda: 2)
    monkeypatch.setattr(multihost, "reached_preemption", notifier.reached)
    return notifier


def stopped_at(stop: interrupts.StopRequest, steps: range, notice_before: int | None,
               notifier: Notifier) -> int | None:
    for step in steps:
        if step == notice_before:
            notifier.notice()
        if stop.should_stop(step, sync_point=False):
            return step
    return None


def test_a_notice_during_a_resumed_runs_start_up_stops_it_after_its_first_step(notifier):
    notifier.notice()  # SIGTERM while restoring step 40 and compiling: no call yet
    assert stopped_at(interrupts.StopRequest(), range(41, 60), None, notifier) == 41


def test_a_notice_mid_run_stops_every_host_at_the_next_step(notifier):
    assert stopped_at(interrupts.StopRequest(), range(41, 60), 45, notifier) == 45
    # (the notice came before step 45's question: the point is the 4 calls passed, plus 1)


def test_the_control_asked_with_the_runs_step_a_start_up_notice_is_never_answered(notifier):
    notifier.notice()
    assert not any(notifier.reached(step) for step in range(41, 60))
