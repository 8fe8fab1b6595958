"""One live run per workdir: an advisory lock on `<workdir>/.lock`, held while the run lives.

The lock is `fcntl.flock` on a file the run keeps open, so the kernel drops it when the
process ends in any way (kill -9 included): a lock left by a killed run is stale by
construction and the next launch takes it over. The file names the holder (host, pid,
start time), so a refused second launch can say which process is alive.

Only local workdirs are locked: an object store (gs://) has no advisory locks; there a
second launch is not detected here (on a pod, the hosts of one run share the workdir and only
process 0 would lock it anyway). What launches runs into a bucket keeps them apart instead: a
grid on Ray holds a Ray actor named after each live run's workdir (experiments/ray_grid.py),
JobSet runs one job per workload name on GKE.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Any

from gated_attention.core import paths
from gated_attention.core.errors import UserError

LOCK_FILE = ".lock"


class WorkdirBusyError(UserError):
    """Another live process holds the workdir."""


class WorkdirLock:
    def __init__(self, workdir: paths.PathLike):
        self.workdir = paths.resolve(workdir)
        self.path = self.workdir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> str | None:
        """Take the lock; returns a note if a stale lock (a killed run's) was taken over.

        Raises WorkdirBusyError naming the live holder.
        """
        if not paths.is_local(self.workdir) or self.held:
            return None
        fd = os.open(os.fspath(self.path), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise WorkdirBusyError(f"{self.workdir} is in use by a live run ({holder}); wait "
                                   "for it to finish or stop it, then start again") from None
        previous = _read(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}).encode(), 0)
        self._fd = fd
        if previous:
            return f"took over the stale lock of a run that ended without releasing it " \
                   f"({_describe(previous)})"
        return None

    def release(self) -> None:
        """Empty the file (a clean end) and drop the lock; the file itself stays."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> WorkdirLock:
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _read(fd: int) -> dict[str, Any]:
    data = os.pread(fd, 4096, 0)
    try:
        return json.loads(data) if data.strip() else {}
    except ValueError:
        return {"raw": data[:80].decode(errors="replace")}


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    if "pid" in holder:
        return (f"pid {holder['pid']} on {holder.get('host', '?')}, "
                f"started {holder.get('started', '?')}")
    return f"lock file says {holder.get('raw', '')!r}"
