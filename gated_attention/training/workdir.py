"""A run's working directory: its resolved config, and protection of what it already holds.

- an empty or missing workdir starts a new run and records `config.json`;
- a workdir holding a run of the same config resumes it (from its latest checkpoint);
- a workdir holding the same config with fewer `train.steps` is extended: the run continues
  from its latest checkpoint (the config it had is kept as `config.steps-<N>.json`);
- a workdir holding anything else stops with an error listing the differences, unless
  `overwrite` is given, which moves the old contents to `<workdir>.backup-<timestamp>`
  (nothing is deleted).

While a run lives it holds the workdir's lock (gated_attention.training.workdir_lock): a second
launch in the same workdir is refused. A path that is a file, or that cannot be created, is
refused before anything is written.

Workdirs may be local or in a bucket (`gs://...`): all access goes through core/paths.py.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

from etils import epath

from gated_attention.core import paths
from gated_attention.core.errors import UserError
from gated_attention.training.workdir_lock import LOCK_FILE, WorkdirLock

CONFIG_FILE = "config.json"
# Folders the pod tools write beside a run's own files, possibly before its first start: the
# workers' logs (gated_attention.pods.worker_log), and the event log of the pod supervisor
# that earlier versions had (its runs may still hold one). They do not make a workdir
# someone else's.
POD_FOLDERS = ("logs", "supervisor")


class WorkdirError(UserError):
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


def _flat_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config's fields by dotted name, each data source's field under its nested name
    only: its flat name is an alias (data/registry.py), and a run saved before data sections
    has only that one, yet is the same config as today's."""
    from gated_attention.data import registry

    flat = _flatten(config)
    for old, new in registry.nested_names().items():
        if old in flat:
            flat.setdefault(new, flat.pop(old))
    return flat


def config_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = _flat_config(old), _flat_config(new)
    return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}"
            for k in sorted(set(a) | set(b)) if a.get(k, "<absent>") != b.get(k, "<absent>")]


def backup(workdir: epath.Path) -> epath.Path:
    return paths.move_aside(workdir, f"{workdir.name}.backup-{time.strftime('%Y%m%d-%H%M%S')}")


def check(workdir: str | os.PathLike[str], config: Any, *, overwrite: bool = False) -> str:
    """What `prepare` would do ("new", "resume", "extend"), or WorkdirError; writes nothing."""
    root = paths.resolve(workdir)
    state, problem = _inspect(root, config_dict(config))
    if problem and not overwrite:
        raise WorkdirError(_refusal(root, problem))
    return "new" if problem else state


def prepare(workdir: str | os.PathLike[str], config: Any, *, overwrite: bool = False,
            is_primary: bool = True,
            barrier: Callable[[str], None] = lambda name: None,
            lock: WorkdirLock | None = None) -> str:
    """Create or check `workdir`; returns "new", "resume" or "extend" ("new" after a backup).

    On several hosts every process checks the workdir as it was before anyone writes (so a
    refusal is raised by all of them alike), then only the primary writes; `barrier(name)`
    returns once every process has reached it (distributed.barrier). The primary takes
    `lock` (if given) before it writes; a live run holding it stops this one.
    """
    root = paths.resolve(workdir)
    wanted = config_dict(config)
    state, problem = _inspect(root, wanted)
    if problem and not overwrite:
        raise WorkdirError(_refusal(root, problem))
    barrier("workdir checked")  # nobody writes before every process has looked
    if is_primary and state in ("resume", "extend"):
        added = [d for d in config_differences(json.loads((root / CONFIG_FILE).read_text()),
                                               wanted) if "'<absent>' -> " in d]
        if added:
            values = "; ".join(a.replace("'<absent>' -> ", "") for a in added)
            print(f"{root}: fields new since this run started, with the values used from now "
                  f"on: {values}")
    if is_primary:
        if lock is not None and root.exists():
            _take(lock)  # before a backup: never move a live run's files
        if problem:
            if lock is not None:
                lock.release()  # the lock file moves with the old contents
            moved = backup(root)
            print(f"--overwrite: moved the old contents of {root} to {moved}")
            state = "new"
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise WorkdirError(f"--workdir={root} cannot be created ({err})") from None
        if lock is not None:
            _take(lock)
        if state == "extend":
            saved = root / CONFIG_FILE
            old_steps = json.loads(saved.read_text())["train"]["steps"]
            paths.write_atomic(root / f"config.steps-{old_steps}.json", saved.read_text())
        if state != "resume":
            paths.write_atomic(root / CONFIG_FILE,
                               json.dumps(wanted, indent=2, sort_keys=True) + "\n")
    barrier("workdir ready")
    return state


def _refusal(root: epath.Path, problem: str) -> str:
    hint = (f"use another --workdir, or pass --overwrite to move the old contents to "
            f"{root.name}.backup-<timestamp>")
    if "\n" in problem:  # a list of differences: the hint goes below it
        return f"{problem}\n{hint[0].upper()}{hint[1:]}."
    return f"{problem}; {hint}"


def _take(lock: WorkdirLock) -> None:
    note = lock.acquire()
    if note:
        print(f"{lock.workdir}: {note}")


def _check_path(root: epath.Path) -> None:
    """A workdir must be (or become) a folder we can write to; refused otherwise."""
    if root.exists() and not root.is_dir():
        raise WorkdirError(f"--workdir={root} is a file, not a folder; choose another path")
    if not paths.is_local(root):
        return
    ancestor = root
    while not ancestor.exists():
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise WorkdirError(f"--workdir={root} cannot be created: {ancestor} is a file")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise WorkdirError(f"--workdir={root} cannot be written: {ancestor} is not writable")


def _steps_only_grow(differences: dict[str, tuple[Any, Any]]) -> bool:
    """True when the only change is more train.steps (an extension of the same run)."""
    if set(differences) != {"train.steps"}:
        return False
    old, new = differences["train.steps"]
    return isinstance(old, int) and isinstance(new, int) and new > old


def _inspect(root: epath.Path, wanted: dict[str, Any]) -> tuple[str, str]:
    """("resume" | "extend" | "new", why the workdir must not be used as it is, or "")."""
    _check_path(root)
    if not (root.exists() and any(p.name not in (LOCK_FILE, *POD_FOLDERS)
                                  for p in root.iterdir())):
        return "new", ""
    saved_file = root / CONFIG_FILE
    if not saved_file.exists():
        return "new", f"{root} is not empty and holds no {CONFIG_FILE}: it is not a run of ours"
    saved = json.loads(saved_file.read_text())
    # Fields the schema gained after this run started are not a change of the run: it goes
    # on with their values (prepare says which).
    differences = [d for d in config_differences(saved, wanted)
                   if not d.split(": ", 1)[1].startswith("'<absent>' -> ")]
    if not any(d.startswith("attention.") for d in differences):
        # The label is derived from the attention fields; a run saved before labels were
        # derived may name its variant without the "+field=value" of its overrides.
        differences = [d for d in differences if not d.startswith("variant:")]
    if not differences:
        return "resume", ""
    a, b = _flat_config(saved), _flat_config(wanted)
    if _steps_only_grow({k: (a.get(k), b.get(k)) for k in set(a) | set(b)
                         if a.get(k, "<absent>") != b.get(k, "<absent>")}):
        return "extend", ""
    return "new", (f"{root} holds a run of a different config:\n  "
                   + "\n  ".join(differences[:20])
                   + ("\n  ..." if len(differences) > 20 else "")
                   + ("\n(train.steps may only grow: a run is extended, never shortened)"
                      if any(d.startswith("train.steps:") for d in differences) else ""))
