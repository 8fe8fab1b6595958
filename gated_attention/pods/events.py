"""The supervisor's event log: one JSON line per event, beside the run in the bucket.

Each line holds the time (UTC), the slice state seen, the action taken, the restart attempt
and a detail, e.g. {"time": "...", "state": "SUSPENDED", "action": "recreate", "attempt": 1}.
A bucket object cannot be appended to, so each event rewrites the object (events are rare:
minutes apart); the lines are also printed, so tmux shows them as they come.
"""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from gated_attention import paths
from gated_attention.metrics_writer import read_jsonl


class EventLog:
    def __init__(self, path: paths.PathLike, echo: Callable[[str], None] | None = None) -> None:
        self.path = paths.resolve(path)
        self.echo = echo or (lambda line: print(line, flush=True))
        self.start = time.monotonic()

    def write(self, state: str, action: str, attempt: int, detail: str = "",
              **extra: Any) -> dict[str, Any]:
        event = {"time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                 "elapsed_s": round(time.monotonic() - self.start, 1), "state": state,
                 "action": action, "attempt": attempt, "detail": detail, **extra}
        line = json.dumps(event)
        self.echo(line)
        try:
            paths.append_text(self.path, line + "\n")
        except Exception as err:  # noqa: BLE001 - the loop goes on; the line was printed
            print(f"warning: could not write {self.path} ({err})", file=sys.stderr, flush=True)
        return event


def read_events(path: paths.PathLike) -> list[dict[str, Any]]:
    return read_jsonl(paths.resolve(path))
