"""`make install-test` says what it installs, step by step, with sizes and progress.

Read from make's dry run (`make -n -B`: the commands printed, none run): every pip install
of the test environment comes after a numbered line saying what it installs and about how
much, shows pip's progress (not `-q`), and is followed by its time."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.reference("golden")
def test_install_test_announces_each_step_with_its_size_and_time():
    commands = subprocess.run(["make", "-n", "-B", "install-test"], capture_output=True,
                              text=True, cwd=ROOT, check=True, timeout=60).stdout
    test_part = commands[commands.index('echo "install-test 1/'):]
    steps = re.findall(r'echo "install-test (\d)/(\d): ([^"]+)"', test_part)
    assert [int(n) for n, _, _ in steps] == list(range(1, len(steps) + 1))
    assert {total for _, total, _ in steps} == {str(len(steps))}
    pieces = re.split(r'echo "install-test \d/\d: ', test_part)[1:]
    installs = [p for p in pieces if "pip install" in p]
    assert len(installs) == 4  # the test extras, libtpu, the CUDA compile pair, xpk
    for piece in installs:
        said = piece.split('"')[0]
        assert re.search(r"\d+ [MG]B", said), said  # how much it installs
        pip = next(line for line in piece.splitlines() if "pip install" in line)
        assert " -q " not in pip and "Downloading" in piece, pip  # progress shown
        assert "done in" in piece  # and its time
