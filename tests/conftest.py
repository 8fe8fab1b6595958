"""Test set-up: eight fake CPU devices for sharding tests, float64 for references."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))  # test helpers such as numpy_reference

import pytest  # noqa: E402


@pytest.fixture
def fake_bucket(tmp_path, monkeypatch):
    """gs:// paths served from tmp_path/"gs:" (no network): `gs://bucket/x` is tmp_path/gs:/bucket/x.

    etils.epath's own test mock routes every URI to the local OS backend; tensorflow's gfile,
    which epath would otherwise prefer for gs://, is switched off. Yields the local folder that
    stands for `gs://`.
    """
    from unittest import mock

    from etils.epath import gpath
    from etils.epath import testing as epath_testing

    monkeypatch.chdir(tmp_path)
    with mock.patch.object(gpath, "_is_tf_installed", lambda: False), \
            epath_testing.mock_epath():
        yield tmp_path / "gs:"
