"""Measured test durations: what `make test-fast` leaves out and the order `make test` runs in.

`make durations` runs the whole suite as `make test` does (`pytest -n 2`) with
GATED_ATTENTION_DURATIONS=<folder>: each worker writes there every test's wall seconds (setup,
call and teardown) and every module- or session-scoped fixture's setup seconds, and
every test's CPU seconds (this worker's and its waited-for subprocesses', setup to
teardown: a subprocess's cost shows here, not in the wall time of a waiting worker), and
`python tests/durations.py <folder>` merges them into tests/durations.json. tests/conftest.py
reads it: a test is slow (besides those marked `@pytest.mark.slow`) if it took over
SLOW_SECONDS, or if it uses a shared fixture whose setup did (so that leaving out the first
test does not hand the fixture's cost to the next one); the files with the most measured time
run first. Times are from a full run on two workers sharing the cores, so longer than a test
alone. A test the file does not know yet (new since the last measurement) counts as fast.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path

import pytest

PATH = Path(__file__).with_name("durations.json")
ENV = "GATED_ATTENTION_DURATIONS"
SLOW_SECONDS = 0.5  # wall seconds in a full `-n 2` run; `make test-fast` leaves these out
UNMEASURED_SECONDS = 1.0  # the weight of a test new since the last measurement


def load() -> dict[str, dict[str, float]]:
    data = json.loads(PATH.read_text()) if PATH.exists() else {}
    return {kind: data.get(kind, {}) for kind in KINDS}


KINDS = ("tests", "fixtures", "cpu")


def cpu_seconds() -> float:
    """User and system CPU seconds of this process and of its children it waited for."""
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF,
                                                          resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def fixture_key(fixturedef: pytest.FixtureDef) -> str:
    """A shared fixture by where it is defined: `tests/test_x.py::name` or `tests::name`."""
    return f"{fixturedef.baseid or 'tests'}::{fixturedef.argname}"


class Measured:
    """The slow rule and the file weights, from tests/durations.json."""

    def __init__(self, data: dict[str, dict[str, float]]) -> None:
        self.tests, self.fixtures = data["tests"], data["fixtures"]

    def seconds(self, item: pytest.Item) -> float:
        return self.tests.get(item.nodeid, UNMEASURED_SECONDS)

    def is_slow(self, item: pytest.Item) -> bool:
        if self.tests.get(item.nodeid, 0.0) > SLOW_SECONDS:  # a new test is fast until measured
            return True
        definitions = getattr(item, "_fixtureinfo", None)
        for defs in (definitions.name2fixturedefs.values() if definitions else ()):
            if defs and defs[-1].scope in ("module", "package", "session") and self.fixtures.get(
                    fixture_key(defs[-1]), 0.0) > SLOW_SECONDS:
                return True
        return False


class Recorder:
    """A pytest plugin (registered by tests/conftest.py when $GATED_ATTENTION_DURATIONS is
    set) that writes this worker's measurements into that folder."""

    def __init__(self, folder: str) -> None:
        self.folder, self.tests, self.fixtures, self.cpu = Path(folder), {}, {}, {}

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        start = cpu_seconds()
        yield
        self.cpu[item.nodeid] = round(cpu_seconds() - start, 2)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        start = time.perf_counter()
        yield
        if fixturedef.scope in ("module", "package", "session"):
            self.fixtures[fixture_key(fixturedef)] = round(time.perf_counter() - start, 2)

    def pytest_runtest_logreport(self, report):
        self.tests[report.nodeid] = round(self.tests.get(report.nodeid, 0.0) + report.duration,
                                          2)

    def pytest_sessionfinish(self, session):
        self.folder.mkdir(parents=True, exist_ok=True)
        name = os.environ.get("PYTEST_XDIST_WORKER", "main")
        (self.folder / f"{name}.json").write_text(
            json.dumps({"tests": self.tests, "fixtures": self.fixtures, "cpu": self.cpu}))


def merge(folder: Path) -> dict[str, dict[str, float]]:
    merged: dict[str, dict[str, float]] = {kind: {} for kind in KINDS}
    for part in sorted(folder.glob("*.json")):
        data = json.loads(part.read_text())
        for kind in merged:
            for key, seconds in data.get(kind, {}).items():  # a fixture per worker: the longest
                merged[kind][key] = max(seconds, merged[kind].get(key, 0.0))
    return merged


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python tests/durations.py FOLDER  (written by a run with "
                 f"{ENV}=FOLDER)")
    merged = merge(Path(argv[0]))
    if not merged["tests"]:
        sys.exit(f"no measurements in {argv[0]}")
    total = sum(merged["tests"].values())
    PATH.write_text(json.dumps({
        "about": "wall seconds per test (setup, call, teardown) and per shared fixture's "
                 "setup, and CPU seconds per test (cpu: with its subprocesses), in one full "
                 "`pytest -n 2` run; `make durations` rewrites this file",
        "total_seconds": round(total),
        "cpu_seconds": round(sum(merged["cpu"].values())),
        **{kind: dict(sorted(merged[kind].items())) for kind in KINDS}}, indent=0) + "\n")
    slow = sum(1 for s in merged["tests"].values() if s > SLOW_SECONDS)
    print(f"{PATH}: {len(merged['tests'])} tests, {total:.0f} s in all "
          f"({sum(merged['cpu'].values()):.0f} CPU-s); {slow} over {SLOW_SECONDS} s")


if __name__ == "__main__":
    main(sys.argv[1:])
