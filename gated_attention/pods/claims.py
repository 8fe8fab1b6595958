"""Claims two slices cannot both win: create-if-absent objects (generation precondition 0).

A grid spread over several slices keeps one claim object per run in the bucket. Taking a run
creates its claim with the precondition "no generation of this object exists yet"
(`ifGenerationMatch=0` in the GCS JSON API; gcsfs's `mode="create"`): of any number of
racing creators exactly one succeeds, the others get HTTP 412 (FileExistsError). Locally
the same is `open(path, "x")`. A claim is never taken over: the slice that holds it (its
TPU name) resumes the run after a recreate.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from typing import Any

from gated_attention import paths


def try_claim(path: paths.PathLike, holder: str, **info: Any) -> bool:
    """Create the claim at `path` for `holder`; True if this call created it."""
    record = json.dumps({"holder": holder, "host": socket.gethostname(),
                         "time": datetime.datetime.now(datetime.UTC).isoformat(
                             timespec="seconds"), **info}).encode()
    text = os.fspath(path)
    if paths.is_local(text):
        path = paths.resolve(text)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(os.fspath(path), "xb") as f:
                f.write(record)
            return True
        except FileExistsError:
            return False
    import fsspec

    fs, key = fsspec.core.url_to_fs(text)
    try:
        fs.pipe_file(key, record, mode="create")
    except FileExistsError:
        return False
    except TypeError as err:  # an fsspec backend without create-if-absent writes
        raise RuntimeError(f"{text}: this object store's client cannot create an object only "
                           "if it is absent, which claims need (gs:// through gcsfs can)"
                           ) from err
    return True


def read_claim(path: paths.PathLike) -> dict[str, Any] | None:
    """The claim's record, or None when nobody holds it."""
    return paths.read_json_current(path)  # other slices rewrite it


def invalidate_listings() -> None:
    """Forget the cached object listings of every bucket client this process holds (other
    slices write the same bucket). It creates none: a first gcsfs client looks for
    credentials, which off Google Cloud takes some 17 s of metadata-server timeouts."""
    try:
        import fsspec

        gcs = fsspec.get_filesystem_class("gs")
    except (ImportError, ValueError):
        return
    for client in list(getattr(gcs, "_cache", {}).values()):  # fsspec's instance cache
        client.invalidate_cache()
