"""Flags are defined one way, by the entry points when they run: importing any module of the
package (or experiments/) registers no absl flag, so one command's flags cannot collide with
another's in a process that imports both."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Modules that still define flags on import, each with where that is to be fixed; the test
# fails when one of them stops (then drop it from here).
STILL_ON_IMPORT: dict[str, str] = {}

PROBE = """
import importlib, json, pkgutil
from absl import flags
import gated_attention, experiments
names = [m.name for pkg in (gated_attention, experiments)
         for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
         if not m.name.startswith("experiments.grids.")]
for name in names:
    importlib.import_module(name)
print(json.dumps({"modules": names, "defined": sorted(
    {m for m, fs in flags.FLAGS.flags_by_module_dict().items() if fs})}))
"""


@pytest.mark.slow  # imports every module of the package: about 20 s on a loaded core
def test_importing_the_package_defines_no_flags():
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         cwd=ROOT, check=True, timeout=300).stdout
    report = json.loads(out.strip().splitlines()[-1])
    assert "gated_attention.main" in report["modules"] and "gated_attention.demo" in report[
        "modules"]
    ours = {m for m in report["defined"] if m.startswith(("gated_attention", "experiments"))}
    assert ours == set(STILL_ON_IMPORT), ours
