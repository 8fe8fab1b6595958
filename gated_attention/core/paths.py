"""Run files on a local disk or in a bucket (gs://, s3://): the one module that knows which.

Every workdir, grid root, tokenizer and data path goes through `etils.epath`, which speaks to
local disks and, through tensorflow's gfile or fsspec (gcsfs), to object stores; orbax takes
the same paths. Three operations have a different best form on an object store, and live
here so callers never branch on it:

- `write_atomic`: locally a temporary file renamed into place; in a bucket a single object
  upload, which is already all-or-nothing.
- `append_text`: locally an append; a bucket object cannot be appended to, so it is read and
  rewritten (callers batch their appends, see metrics_writer).
- `move_tree`: locally one rename; in a bucket every object is copied and the source is
  removed only after all copies exist (a directory rename is not atomic there anyway).
- `read_current` / `read_json_current`: the whole current content of a small file other
  processes rewrite (a grid's manifest and run statuses, which a second grid driver or
  the summary reads while the first writes them). Read through an ordinary open, an object
  is read up to the size fsspec's listing cache holds for it, so a rewrite that grew it
  reads truncated (a grid's worker once failed on half a status file): in a bucket it is
  one GET of the object.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from etils import epath

PathLike = str | os.PathLike[str]
REMOTE_PREFIXES = ("gs://", "s3://", "az://", "hf://")


def is_local(path: PathLike) -> bool:
    return not os.fspath(path).startswith(REMOTE_PREFIXES)


def resolve(path: PathLike) -> epath.Path:
    """An epath for `path`: local ones with ~ expanded and made absolute, URIs as given.

    (pathlib would turn `gs://b/x` into the local `gs:/b/x`; never use it on run paths.)
    """
    text = os.fspath(path)
    if not is_local(text):
        return epath.Path(text)
    return epath.Path(os.path.abspath(os.path.expanduser(text)))


def read_current(path: PathLike) -> str:
    """The whole text of `path` as stored now (FileNotFoundError when there is none)."""
    path = resolve(path)
    return path.read_text() if is_local(path) else get_object(os.fspath(path)).decode()


def read_json_current(path: PathLike) -> Any | None:
    """`read_current`'s JSON, or None when there is no such file."""
    try:
        return json.loads(read_current(path))
    except FileNotFoundError:
        return None


def get_object(uri: str) -> bytes:
    """An object store's object, whole, in one request (fsspec's cat_file)."""
    import fsspec

    fs, key = fsspec.core.url_to_fs(uri)
    return fs.cat_file(key)


def write_atomic(path: PathLike, data: str | bytes) -> None:
    """Readers see the old content or the new one, never half a file."""
    path = resolve(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not is_local(path):
        _write(path, data)
        return
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    _write(tmp, data)
    os.replace(tmp, path)


def _write(path: epath.Path, data: str | bytes) -> None:
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data)


def append_text(path: PathLike, text: str) -> None:
    path = resolve(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if is_local(path):
        with open(path, "a") as f:
            f.write(text)
        return
    old = path.read_text() if path.exists() else ""
    path.write_text(old + text)


def move_aside(source: PathLike, name: str) -> epath.Path:
    """Move `source` to the sibling `name` (or `name-1`, `name-2`, ... if taken); returns it."""
    source = resolve(source)
    target, n = source.with_name(name), 1
    while target.exists():
        target, n = source.with_name(f"{name}-{n}"), n + 1
    move_tree(source, target)
    return target


def move_tree(source: PathLike, target: PathLike) -> None:
    """Move a directory; `target` must not exist. Nothing is removed before it is copied."""
    source, target = resolve(source), resolve(target)
    if target.exists():
        raise FileExistsError(f"{target} exists; refusing to move {source} over it")
    if is_local(source) and is_local(target):
        os.replace(source, target)
        return
    relative = [os.path.relpath(os.path.join(os.fspath(d), f), os.fspath(source))
                for d, _, names in source.walk() for f in names]
    for name in relative:
        (target / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).copy(target / name)
    missing = [name for name in relative if not (target / name).exists()]
    if missing:
        raise OSError(f"copying {source} to {target} left out {len(missing)} files (first: "
                      f"{missing[0]}); nothing was removed")
    source.rmtree()
