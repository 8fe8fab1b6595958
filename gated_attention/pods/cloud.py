"""The gcloud calls the supervisor makes, and what the states they report mean.

A slice is a queued resource (QUEUED=true in the settings) with its TPU VM, or a TPU VM
alone. `Slice.health()` reduces gcloud's states to what the supervisor acts on:

- HEALTHY: the queued resource ACTIVE and its VM READY (or the VM READY);
- WAITING: still being given capacity or created (WAITING_FOR_RESOURCES, ACCEPTED,
  PROVISIONING, CREATING, ...) or being deleted: nothing to do but wait;
- BROKEN: SUSPENDED, FAILED, PREEMPTED, TERMINATED, STOPPED, or an ACTIVE queued resource
  whose VM vanished: a spot VM cannot be restarted, so delete and create again;
- MISSING: nothing of that name (never created, or deleted);
- UNKNOWN: gcloud failed for another reason (network, credentials): retry, destroy nothing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Sequence

HEALTHY, WAITING, BROKEN, MISSING, UNKNOWN = "HEALTHY", "WAITING", "BROKEN", "MISSING", "UNKNOWN"
NO_NODE = "NO_NODE"  # the state shown for an ACTIVE queued resource whose VM vanished
GOOD_STATES = {"ACTIVE", "READY"}
WAIT_STATES = {"WAITING_FOR_RESOURCES", "ACCEPTED", "PROVISIONING", "CREATING", "STARTING",
               "RESTARTING", "REPAIRING", "DELETING", "SUSPENDING", "STATE_UNSPECIFIED"}
BAD_STATES = {"SUSPENDED", "FAILED", "PREEMPTED", "TERMINATED", "STOPPED", "STOPPING"}


@dataclasses.dataclass(frozen=True)
class Health:
    kind: str     # HEALTHY, WAITING, BROKEN, MISSING or UNKNOWN
    state: str    # what gcloud said, e.g. "SUSPENDED" or "ACTIVE/READY"
    detail: str = ""


def classify(state: str) -> str:
    if state in GOOD_STATES:
        return HEALTHY
    if state in BAD_STATES:
        return BROKEN
    if state in WAIT_STATES:
        return WAITING
    return UNKNOWN


def parse_state(text: str, queued: bool) -> str:
    """The state field of `describe --format=json` (a queued resource nests it)."""
    record = json.loads(text)
    state = record.get("state", "STATE_UNSPECIFIED")
    if queued and isinstance(state, dict):
        state = state.get("state", "STATE_UNSPECIFIED")
    return str(state)


@dataclasses.dataclass(frozen=True)
class Slice:
    project: str
    zone: str
    name: str
    queued: bool = True
    gcloud: str = "gcloud"
    ssh_args: tuple[str, ...] = ()

    def _call(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([self.gcloud, "compute", "tpus", *args,
                               f"--project={self.project}", f"--zone={self.zone}"],
                              capture_output=True, text=True, timeout=timeout)

    def _describe(self, group: str) -> tuple[str | None, str]:
        """(state, error): state None when the call failed; error "NOT_FOUND" when absent."""
        try:
            done = self._call(group, "describe", self.name, "--format=json")
        except subprocess.TimeoutExpired:
            return None, "gcloud describe timed out"
        if done.returncode == 0:
            try:
                return parse_state(done.stdout, group == "queued-resources"), ""
            except ValueError as err:
                return None, f"unreadable describe output ({err})"
        error = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "failed"
        return None, "NOT_FOUND" if "NOT_FOUND" in done.stderr else error

    def health(self) -> Health:
        if self.queued:
            state, error = self._describe("queued-resources")
            if state is None:
                return Health(MISSING if error == "NOT_FOUND" else UNKNOWN, error, error)
            if state != "ACTIVE":
                return Health(classify(state), state)
        node, error = self._describe("tpu-vm")
        prefix = "ACTIVE/" if self.queued else ""
        if node is None:
            if error == "NOT_FOUND":  # an ACTIVE queued resource without its VM: vanished
                return Health(BROKEN if self.queued else MISSING, f"{prefix}{NO_NODE}", error)
            return Health(UNKNOWN, f"{prefix}?", error)
        return Health(classify(node), f"{prefix}{node}")

    def workers_running(self, pattern: str) -> tuple[int, int] | None:
        """(workers running a process matching `pattern`, workers not), or None if ssh failed."""
        probe = (f"if pgrep -f {_quote(pattern)} >/dev/null; then echo RUNNING; "
                 "else echo STOPPED; fi")
        try:
            done = subprocess.run(
                [self.gcloud, "compute", "tpus", "tpu-vm", "ssh", self.name,
                 f"--project={self.project}", f"--zone={self.zone}", "--worker=all",
                 f"--command={probe}", *self.ssh_args],
                capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return None
        words = done.stdout.split()
        running, stopped = words.count("RUNNING"), words.count("STOPPED")
        if done.returncode != 0 or running + stopped == 0:
            return None
        return running, stopped


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def script_command(scripts_dir: str, script: str, config: str, args: Sequence[str] = (),
                   dry_run: bool = False) -> list[str]:
    """A tpu_scripts/*.sh call with the supervisor's settings file."""
    return ["bash", f"{scripts_dir}/{script}", "--config", config,
            *(["--dry-run"] if dry_run else []), *args]
