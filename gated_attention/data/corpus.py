"""Local text corpora as lists of named documents, collected deterministically.

- `cpython_docs`: English that ships with every CPython: the `pydoc_data.topics` pages of the
  language reference and the docstrings of the standard library (one document per topic and
  per module; tests and site-packages excluded). About 2.3M characters; no download.
- `python_source`: the Python source of the standard library and of the installed packages,
  one document per file (tens to hundreds of MB): a larger local corpus for longer runs.
- `text_files`: .txt files (one document per file) and .jsonl files (one per record), on a
  local disk or in a bucket (gs://).

Documents are split into train and held-out parts by a hash of their name, so the split does
not depend on the order files are found in or on how many there are. Collected corpora are
cached (keyed by a fingerprint of the files they come from), since parsing the standard
library takes seconds.
"""

from __future__ import annotations

import ast
import dataclasses
import glob
import hashlib
import json
import os
import pathlib
import site
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterable, Sequence

from etils import epath

from gated_attention.core import paths as run_paths
from gated_attention.core.checks import ConfigError


class NoFilesError(ConfigError, FileNotFoundError):
    """A part of data.paths matches no file: the user's setting (one line at the entry points),
    and a missing file to callers that ask for one."""


SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages",
                       "__pycache__", "lib2to3"})


@dataclasses.dataclass(frozen=True)
class Document:
    name: str
    text: str


def cache_root(configured: str = "") -> pathlib.Path:
    """config.data.cache_dir, else $GATED_ATTENTION_CACHE, else ~/.cache/gated_attention."""
    root = configured or os.environ.get("GATED_ATTENTION_CACHE") or "~/.cache/gated_attention"
    return pathlib.Path(root).expanduser()


def fingerprint(documents: Sequence[Document]) -> str:
    """sha256 over names and texts: the identity of a corpus (tokenizer caches key on it)."""
    digest = hashlib.sha256()
    for doc in documents:
        for part in (doc.name, doc.text):
            data = part.encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()


def is_held_out(name: str, eval_fraction: float) -> bool:
    bucket = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0x1_0000_0000
    return bucket < eval_fraction


def split_documents(documents: Sequence[Document], eval_fraction: float
                    ) -> tuple[list[Document], list[Document]]:
    """(train, held_out) by a hash of each document's name; both keep the input order."""
    train = [d for d in documents if not is_held_out(d.name, eval_fraction)]
    held_out = [d for d in documents if is_held_out(d.name, eval_fraction)]
    if not train or not held_out:
        raise ConfigError(f"data.eval_fraction={eval_fraction} leaves {len(train)} train and "
                         f"{len(held_out)} held-out documents out of {len(documents)}; both "
                         "must be non-empty")
    return train, held_out


def _python_files(root: pathlib.Path, skip: frozenset[str]) -> list[pathlib.Path]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in skip and not d.startswith("."))
        found += [pathlib.Path(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return found


def _stdlib_root() -> pathlib.Path:
    return pathlib.Path(sysconfig.get_paths()["stdlib"])


def _docstrings(source: bytes) -> list[str]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in old modules
        tree = ast.parse(source)
    out = []
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop(0)
        doc = ast.get_docstring(node, clean=True)
        if doc:
            out.append(doc)
        pending += [n for n in node.body
                    if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return out


def _files_key(kind: str, files: Sequence[pathlib.Path]) -> str:
    digest = hashlib.sha256(f"{kind}|{sys.version}".encode())
    for path in files:
        stat = path.stat()
        digest.update(f"{path}|{stat.st_size}|{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]


def _cached(kind: str, files: Sequence[pathlib.Path], cache_dir: str,
            build: Callable[[], list[Document]]) -> list[Document]:
    path = cache_root(cache_dir) / "corpus" / f"{kind}-{_files_key(kind, files)}.json"
    if path.exists():
        return [Document(n, t) for n, t in json.loads(path.read_text("utf-8"))]
    documents = build()
    run_paths.write_atomic(path, json.dumps([[d.name, d.text] for d in documents]))
    return documents


def cpython_docs(cache_dir: str = "") -> list[Document]:
    """pydoc topics + standard-library docstrings (one document per topic / per module)."""
    root = _stdlib_root()
    files = _python_files(root, SKIP_DIRS)

    def build() -> list[Document]:
        from pydoc_data.topics import topics

        documents = [Document(f"topics/{name}", text.strip())
                     for name, text in sorted(topics.items()) if text.strip()]
        for path in files:
            try:
                parts = _docstrings(path.read_bytes())
            except (SyntaxError, ValueError):
                continue
            if parts:
                documents.append(Document(f"docstrings/{path.relative_to(root).as_posix()}",
                                          "\n\n".join(parts)))
        return documents

    return _cached("cpython_docs", files, cache_dir, build)


def source_roots() -> list[pathlib.Path]:
    """The standard library and every site-packages directory of this interpreter."""
    roots = [_stdlib_root()]
    for path in [*site.getsitepackages(), site.getusersitepackages()]:
        p = pathlib.Path(path)
        if p.is_dir() and p not in roots:
            roots.append(p)
    return roots


def python_source(cache_dir: str = "") -> list[Document]:
    """Every .py file of the standard library and installed packages (tests included)."""
    named: list[tuple[str, pathlib.Path]] = []
    for i, root in enumerate(source_roots()):
        skip = frozenset({"site-packages", "dist-packages", "__pycache__"}) if i == 0 else \
            frozenset({"__pycache__"})
        named += [(f"{i}/{p.relative_to(root).as_posix()}", p) for p in _python_files(root, skip)]

    def build() -> list[Document]:
        documents = []
        for name, path in named:
            try:
                text = path.read_text("utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            if text.strip():
                documents.append(Document(name, text))
        return documents

    return _cached("python_source", [p for _, p in named], cache_dir, build)


def expand_paths(paths: str) -> list[epath.Path]:
    """Comma-separated paths or globs -> sorted existing files (error if a part matches none).

    Parts may be in a bucket (`gs://b/c4/*.jsonl`); there `**` is not supported by every
    backend, so name the folder levels.
    """
    out: list[epath.Path] = []
    for part in filter(None, (p.strip() for p in paths.split(","))):
        if run_paths.is_local(part):
            matches = [epath.Path(m) for m in sorted(glob.glob(os.path.expanduser(part),
                                                                recursive=True))]
        else:
            matches = _bucket_glob(part)
        if not matches:
            raise NoFilesError(f"data.paths: {part!r} matches no file")
        out += [m for m in matches if m.is_file()]
    return out


def _bucket_glob(pattern: str) -> list[epath.Path]:
    parts = pattern.split("/")
    fixed = next((i for i, p in enumerate(parts) if glob.has_magic(p)), len(parts))
    base = epath.Path("/".join(parts[:fixed]))
    if fixed == len(parts):
        return [base] if base.exists() else []
    return sorted(base.glob("/".join(parts[fixed:])), key=os.fspath)


def text_files(paths: str, text_key: str = "text") -> list[Document]:
    """.jsonl files: one document per record (its `text_key` field); other files: one each.
    A file that is not UTF-8 text, a line that is not a JSON object and a record without
    `text_key` are ConfigErrors naming the file and line."""
    documents = []
    for path in expand_paths(paths):
        text = _read_text(path)
        if path.suffix == ".jsonl":
            for line_no, line in enumerate(text.splitlines()):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as err:
                    raise ConfigError(f"{path}:{line_no + 1} is not a JSON record (data.paths: "
                                      f".jsonl files hold one object per line): {err}") from None
                if not isinstance(record, dict) or text_key not in record:
                    fields = sorted(record) if isinstance(record, dict) else type(record).__name__
                    raise ConfigError(f"{path}:{line_no + 1} has no field {text_key!r} "
                                      f"(data.text_key); fields: {fields}")
                documents.append(Document(f"{path}:{line_no}", str(record[text_key])))
        else:
            documents.append(Document(str(path), text))
    return documents


def _read_text(path: epath.Path) -> str:
    try:
        return path.read_text("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"data.paths: {os.fspath(path)!r} is not UTF-8 text ({err.reason} at "
                          f"byte {err.start})") from None


def load_documents(source: str, *, paths: str = "", text_key: str = "text",
                   cache_dir: str = "") -> list[Document]:
    if source == "cpython_docs":
        return cpython_docs(cache_dir)
    if source == "python_source":
        return python_source(cache_dir)
    if source == "files":
        return text_files(paths, text_key)
    raise ValueError(f"data.source={source!r} has no local documents; local sources: "
                     "cpython_docs, python_source, files")


def summary(documents: Iterable[Document]) -> dict[str, object]:
    documents = list(documents)
    return {"documents": len(documents), "characters": sum(len(d.text) for d in documents),
            "sha256": fingerprint(documents)}
