"""The measured-slow rule of `make test-fast` and the merge of the workers' measurements."""

from __future__ import annotations

import json
import types

import durations


def fixture(argname: str, scope: str, baseid: str = "tests/test_x.py"):
    return types.SimpleNamespace(argname=argname, scope=scope, baseid=baseid)


def item(nodeid: str, *fixtures):
    info = types.SimpleNamespace(name2fixturedefs={f.argname: (f,) for f in fixtures})
    return types.SimpleNamespace(nodeid=nodeid, _fixtureinfo=info)


def test_a_test_is_slow_by_its_own_time_or_a_shared_fixtures_setup():
    measured = durations.Measured({
        "tests": {"tests/test_x.py::a": 0.4, "tests/test_x.py::b": 1.5,
                  "tests/test_x.py::c": 0.2},
        "fixtures": {"tests/test_x.py::trained": 30.0, "tests/test_x.py::cheap": 0.1,
                     "tests::gcs_bucket": 2.0}})
    assert not measured.is_slow(item("tests/test_x.py::a"))
    assert measured.is_slow(item("tests/test_x.py::b"))  # 1.5 s > 1 s
    # c is fast alone, but would pay the module fixture's 30 s once b (its first user) is out
    assert measured.is_slow(item("tests/test_x.py::c", fixture("trained", "module")))
    assert not measured.is_slow(item("tests/test_x.py::c", fixture("cheap", "module")))
    # a conftest fixture is keyed by `tests`; a function-scoped one is in the test's own time
    assert measured.is_slow(item("tests/test_x.py::a", fixture("gcs_bucket", "session", "")))
    assert not measured.is_slow(item("tests/test_x.py::a", fixture("trained", "function")))
    assert not measured.is_slow(item("tests/test_new.py::unmeasured"))
    assert measured.seconds(item("tests/test_new.py::unmeasured")) == 1.0


def test_workers_measurements_merge_into_one_file(tmp_path, monkeypatch):
    (tmp_path / "gw0.json").write_text(json.dumps(
        {"tests": {"t::a": 2.0}, "fixtures": {"t::f": 5.0}, "cpu": {"t::a": 3.5}}))
    (tmp_path / "gw1.json").write_text(json.dumps(
        {"tests": {"t::b": 0.5}, "fixtures": {"t::f": 7.0}}))  # the fixture built twice
    out = tmp_path / "durations.json"
    monkeypatch.setattr(durations, "PATH", out)
    durations.main([str(tmp_path)])
    data = json.loads(out.read_text())
    assert data["tests"] == {"t::a": 2.0, "t::b": 0.5} and data["total_seconds"] == 2
    assert data["fixtures"] == {"t::f": 7.0}  # the longest setup
    assert data["cpu"] == {"t::a": 3.5} and data["cpu_seconds"] == 4  # gw1 measured no CPU


def test_cpu_seconds_count_a_waited_for_subprocess():
    """A test's CPU includes its subprocesses' (what its wall time, spent waiting, hides):
    against the child's own count of its CPU time."""
    import subprocess
    import sys

    before = durations.cpu_seconds()
    child = subprocess.run([sys.executable, "-c", "import time\nend = time.process_time() + 0.5"
                            "\nwhile time.process_time() < end: pass\nprint(time.process_time())"],
                           capture_output=True, text=True, check=True)
    spent = durations.cpu_seconds() - before
    assert float(child.stdout) <= spent < float(child.stdout) + 0.5
