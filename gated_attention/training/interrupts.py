"""Stopping a run cleanly on SIGINT (Ctrl-C) or SIGTERM (how a preempted TPU VM is stopped).

The handler only records the request; the training loop asks `should_stop(step)` between
steps, then finishes: a checkpoint at that step, metrics flushed, a one-line message. A
second Ctrl-C exits at once (the last checkpoint stays; an unfinished one is ignored on
resume).

On several hosts every process must stop at the same step (the checkpoint is collective):
- SIGTERM goes to jax's preemption notifier (started by jax.distributed.initialize), and
  orbax's `reached_preemption(n)` says on every host alike when the agreed call comes;
  so on several hosts this module leaves SIGTERM to that notifier. Its `n` counts this
  process's calls (1, 2, ...), not the run's step: the notifier agrees on "the largest
  count any host has passed, plus one" and answers only a call with exactly that count, so
  a notice during a resumed run's start-up (count 0: agreed 1) is never answered by calls
  numbered from the resumed step;
- a Ctrl-C on any host is shared at `sync_point` steps (those where the loop already waits
  for the devices to log metrics) through one small all-gather.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Any

import jax
import numpy as np

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal number, the shell convention


class StopRequest:
    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._calls = 0  # should_stop calls: the preemption notifier's counter

    def install(self) -> StopRequest:
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach the main thread only; nothing to catch here
        caught = [signal.SIGINT]
        if jax.process_count() == 1:
            caught.append(signal.SIGTERM)
        for signum in caught:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: Any) -> None:
        del frame
        name = signal.Signals(signum).name
        if self.signal_name is not None and signum == signal.SIGINT:
            print(f"\n{name} again: exiting now, without a checkpoint of this step.",
                  file=sys.stderr, flush=True)
            os._exit(EXIT_CODES["SIGINT"])
        self.signal_name = name
        print(f"\n{name}: finishing this step, then saving a checkpoint "
              "(Ctrl-C again to exit at once).", file=sys.stderr, flush=True)

    def should_stop(self, step: int, *, sync_point: bool) -> bool:
        """Whether every process should stop after `step` (the same answer on all hosts)."""
        if jax.process_count() == 1:
            return self.signal_name is not None
        from orbax.checkpoint import multihost

        self._calls += 1
        if multihost.reached_preemption(self._calls):
            self.signal_name = self.signal_name or "SIGTERM"
            return True
        if not sync_point:
            return False
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.int32(self.signal_name is not None))
        if np.any(flags):
            self.signal_name = self.signal_name or "SIGINT"
            return True
        return False

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()


class Interrupted(RuntimeError):
    """The run stopped on a signal after saving a checkpoint."""

    def __init__(self, message: str, signal_name: str):
        super().__init__(message)
        self.exit_code = EXIT_CODES.get(signal_name, 1)
