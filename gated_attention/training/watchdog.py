"""A step watchdog: a multi-host run whose step stops making progress ends, with its stack.

When one worker of a multi-process job dies (kill -9, a kernel OOM), the others wait in the
next collective for a peer that will never come. jax.distributed's own heartbeat (0.10:
`heartbeat_timeout_seconds`, 100 s by default, not exposed by this project's start-up)
ends them eventually, with a C++ fatal error and no Python stack. This watchdog ends them
sooner and says where they were: armed before the first step (`first_timeout`, which also
covers the compile) and re-armed after every step of the loop (`timeout`, which covers the
step, its evaluation and its checkpoint), it prints every thread's Python stack and exits
with EXIT_CODE (75, "try again"), which a grid on Ray (experiments/ray_grid.py) answers by
trying the run again, as JobSet restarts do on GKE: the run resumes from its last checkpoint.

It runs in a Python thread; `faulthandler.dump_traceback_later` (a C thread, which also
works while a C call holds the interpreter lock) backs it up 10 s later (exit code 1).
"""

from __future__ import annotations

import faulthandler
import io
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable

EXIT_CODE = 75  # EX_TEMPFAIL: a worker stuck on a dead peer; launching again resumes the run
BACKUP_DELAY_S = 10.0


class StepWatchdog:
    """A deadline re-armed every step, checked by `check` against `clock`.

    With `watch_in_thread` (the default) a daemon thread calls `check` when the deadline is
    due or the watchdog was re-armed; without it the caller calls `check` (the tests, which
    drive `clock` by hand instead of sleeping)."""

    def __init__(self, timeout: float, first_timeout: float, *, exit_code: int = EXIT_CODE,
                 exit_fn: Callable[[int], object] = os._exit,
                 clock: Callable[[], float] = time.monotonic,
                 watch_in_thread: bool = True) -> None:
        self.timeout, self.first_timeout = float(timeout), float(first_timeout)
        self.exit_code, self._exit, self._clock = exit_code, exit_fn, clock
        self.step, self.during = 0, ""
        self._deadline: float | None = None
        self._seconds = 0.0
        self._lock = threading.Lock()
        self._changed = threading.Event()
        self._closed = False
        self._watch_in_thread = watch_in_thread
        self._thread: threading.Thread | None = None

    @property
    def enabled(self) -> bool:
        return self.timeout > 0

    def _fire(self, seconds: float) -> None:
        faulthandler.cancel_dump_traceback_later()  # this thread runs: no need of the backup
        where = f" during {self.during}" if self.during else ""
        print(f"\nWatchdog: no progress for {seconds:g} s after step {self.step}{where} (a "
              "worker of this job is likely dead or stuck); the stack of every thread follows. "
              "Exiting "
              f"with {self.exit_code}: launching again resumes from the last checkpoint.",
              file=sys.stderr, flush=True)
        try:
            faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        except (io.UnsupportedOperation, AttributeError, ValueError):  # no file descriptor
            for ident, frame in sys._current_frames().items():
                print(f"Thread {ident:#x}:\n{''.join(traceback.format_stack(frame))}",
                      file=sys.stderr)
        sys.stderr.flush()
        self._exit(self.exit_code)

    def arm(self, step: int, first: bool = False, during: str = "") -> None:
        """(Re)start the countdown: `first_timeout` before the first step, else `timeout`;
        `during` names what is waited for, if not the next step."""
        if not self.enabled:
            return
        seconds = self.first_timeout if first else self.timeout
        with self._lock:
            self.step, self.during = step, during
            self._seconds, self._deadline = seconds, self._clock() + seconds
        faulthandler.dump_traceback_later(seconds + BACKUP_DELAY_S, exit=True,
                                          file=sys.__stderr__)
        self._changed.set()
        if self._watch_in_thread and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="step-watchdog",
                                            daemon=True)
            self._thread.start()

    def disarm(self) -> None:
        with self._lock:
            armed, self._deadline = self._deadline is not None, None
        if armed:
            faulthandler.cancel_dump_traceback_later()
        self._changed.set()

    def check(self) -> float | None:
        """Fire if the deadline has passed; else the seconds left (None: not armed)."""
        with self._lock:
            if self._deadline is None:
                return None
            left = self._deadline - self._clock()
            if left > 0:
                return left
            self._deadline, seconds = None, self._seconds
        self._fire(seconds)
        return None

    def _watch(self) -> None:
        """The thread: check whenever the deadline is due or the watchdog changed."""
        while not self._closed:
            self._changed.wait(self.check())
            self._changed.clear()

    def __enter__(self) -> StepWatchdog:
        return self

    def __exit__(self, *exc) -> None:
        self.disarm()
        self._closed = True
        self._changed.set()


def for_run(train_cfg, process_count: int) -> StepWatchdog:
    """The watchdog of a run: on only when several processes can wait on each other."""
    timeout = float(train_cfg.get("step_timeout_s", 0.0)) if process_count > 1 else 0.0
    return StepWatchdog(timeout, float(train_cfg.get("first_step_timeout_s", 0.0)) or timeout)
