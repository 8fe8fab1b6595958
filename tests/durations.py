"""Measured test durations: what `make test-fast` leaves out and the order `make test` runs in.

    python tests/durations.py JUNIT.xml     # rewrite tests/durations.json from a full run

`make durations` runs the whole suite as `make test` does (`pytest -n 2`) with a JUnit report
and rewrites `tests/durations.json` from it: each test's wall seconds in that run (two
workers sharing the cores, so a test takes longer than alone). tests/conftest.py reads it:
a test measured over SLOW_SECONDS counts as slow (besides those marked `@pytest.mark.slow`),
and the files with the most measured time run first. A test the file does not know yet (new
since the last measurement) counts as fast until the file is regenerated.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

PATH = Path(__file__).with_name("durations.json")
SLOW_SECONDS = 1.0  # wall seconds in a full `-n 2` run; `make test-fast` leaves these out


def from_junit(report: Path) -> dict[str, float]:
    """{node id: wall seconds} from a pytest JUnit XML report."""
    durations = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = case.get("classname").replace(".", "/") + ".py"
        durations[f"{path}::{case.get('name')}"] = round(float(case.get("time")), 2)
    return durations


def load() -> dict[str, float]:
    return json.loads(PATH.read_text())["seconds"] if PATH.exists() else {}


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        sys.exit("usage: python tests/durations.py JUNIT.xml")
    durations = from_junit(Path(argv[0]))
    total = sum(durations.values())
    PATH.write_text(json.dumps({
        "about": "wall seconds per test in one full `pytest -n 2` run; `make durations` "
                 "rewrites this file",
        "tests": len(durations), "total_seconds": round(total),
        "seconds": dict(sorted(durations.items()))}, indent=0) + "\n")
    slow = sum(1 for s in durations.values() if s > SLOW_SECONDS)
    print(f"{PATH}: {len(durations)} tests, {total:.0f} s in all; {slow} over {SLOW_SECONDS} s")


if __name__ == "__main__":
    main(sys.argv[1:])
