"""A run's working directory: its resolved config, and protection of what it already holds.

- an empty or missing workdir starts a new run and records `config.json`;
- a workdir holding a run of the same config resumes it (from its latest checkpoint);
- a workdir holding anything else stops with an error listing the differences, unless
  `overwrite` is given, which moves the old contents to `<workdir>.backup-<timestamp>`
  (nothing is deleted).

Workdirs may be local or in a bucket (`gs://...`): all access goes through gated_attention.paths.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from etils import epath

from gated_attention import paths

CONFIG_FILE = "config.json"


class WorkdirError(RuntimeError):
    """The workdir holds something this run must not overwrite."""


def config_dict(config: Any) -> dict[str, Any]:
    """The config as plain JSON (round-tripped, so tuples become lists as they will on disk)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: tree}


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = _flatten(old), _flatten(new)
    return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]


def backup(workdir: epath.Path) -> epath.Path:
    return paths.move_aside(workdir, f"{workdir.name}.backup-{time.strftime('%Y%m%d-%H%M%S')}")


def prepare(workdir: str | os.PathLike[str], config: Any, *, overwrite: bool = False,
            is_primary: bool = True,
            barrier: Callable[[str], None] = lambda name: None) -> str:
    """Create or check `workdir`; returns "new" or "resume" (and "new" after a backup).

    On several hosts every process checks the workdir as it was before anyone writes (so a
    refusal is raised by all of them alike), then only the primary writes; `barrier(name)`
    returns once every process has reached it (distributed.barrier).
    """
    root = paths.resolve(workdir)
    wanted = config_dict(config)
    state, problem = _inspect(root, wanted)
    if problem and not overwrite:
        raise WorkdirError(f"{problem}\nUse another --workdir, or pass --overwrite to move "
                           f"the old contents to {root.name}.backup-<timestamp>.")
    barrier("workdir checked")  # nobody writes before every process has looked
    if is_primary and state != "resume":
        if problem:
            moved = backup(root)
            print(f"--overwrite: moved the old contents of {root} to {moved}")
        root.mkdir(parents=True, exist_ok=True)
        paths.write_atomic(root / CONFIG_FILE,
                           json.dumps(wanted, indent=2, sort_keys=True) + "\n")
    barrier("workdir ready")
    return state


def _inspect(root: epath.Path, wanted: dict[str, Any]) -> tuple[str, str]:
    """("resume" | "new", why the workdir must not be used as it is, or "")."""
    if not (root.exists() and any(root.iterdir())):
        return "new", ""
    saved_file = root / CONFIG_FILE
    if not saved_file.exists():
        return "new", f"{root} is not empty and holds no {CONFIG_FILE}: it is not a run of ours"
    differences = config_differences(json.loads(saved_file.read_text()), wanted)
    if not differences:
        return "resume", ""
    return "new", (f"{root} holds a run of a different config:\n  "
                   + "\n  ".join(differences[:20])
                   + ("\n  ..." if len(differences) > 20 else ""))
