"""The cheap-compile settings (gated_attention/ops/cpu_compile.py): XLA accepts every flag it sets,
and a flag this jaxlib lacks is never set (XLA would abort the process)."""

import os
import subprocess
import sys

import pytest

from gated_attention.ops import cpu_compile

pytestmark = pytest.mark.reference("independent")


def test_a_flag_xla_lacks_is_not_found_and_known_ones_are():
    assert not cpu_compile.jaxlib_knows("xla_cpu_no_such_flag_anywhere")
    assert cpu_compile.jaxlib_knows("xla_backend_optimization_level")


def test_xla_accepts_the_flags_in_a_fresh_process():
    """XLA parses XLA_FLAGS at its first use and aborts on a flag it does not define."""
    code = "import jax; print(len(jax.devices()), float(jax.numpy.tanh(1.0)))"
    env = {**os.environ, "XLA_FLAGS": cpu_compile.xla_flags(host_devices=3),
           "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    devices, value = done.stdout.split()
    assert int(devices) == 3
    assert abs(float(value) - 0.7615941559557649) < 1e-6  # tanh(1), float64 by hand
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**env, "XLA_FLAGS": "--xla_cpu_no_such_flag_anywhere=true"},
                         timeout=120)
    assert bad.returncode != 0 and "Unknown flag" in bad.stderr
