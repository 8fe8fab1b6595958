"""The documents work: every `bash runnable` block runs, every relative link resolves.

A fenced block whose info string is `bash runnable` is run with bash in a scratch copy of the
repository (symbolic links to its top-level entries, so whatever a command writes, e.g.
`runs/`, lands in the scratch folder), with `python` the interpreter running the tests. Mark
only commands that take seconds on a CPU and need no network.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# Text that belongs to how the project was made, not to how it is used.
FORBIDDEN = ("SPEC.md", "/work/", "shared/anchors", "../shared", "device tool")
# Every text a user reads: documents, code, configs, scripts, notebooks (tests excluded: they
# name these words to look for them).
USER_TEXTS = sorted({*DOCUMENTS, ROOT / "benchmarks" / "RESULTS.md", ROOT / "Makefile",
                     *(p for folder in ("gated_attention", "benchmarks", "experiments",
                                        "tpu_scripts", "configs", "notebooks")
                       for p in (ROOT / folder).rglob("*")
                       if p.suffix in (".py", ".sh", ".md", ".ipynb"))})


def fenced_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line number, info string, body) of every fenced code block, indentation removed."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence, info = match.groups()
        start, body = i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i])
            i += 1
        blocks.append((start, info.strip(), "\n".join(body)))
        i += 1
    return blocks


def prose(text: str) -> str:
    """The document without its fenced code blocks (links in code are not links)."""
    out, inside, fence = [], False, ""
    for line in text.split("\n"):
        match = FENCE.match(line)
        if match and (not inside or line.strip().startswith(fence)):
            inside, fence = (not inside), match.group(2)
            continue
        if not inside:
            out.append(line)
    return "\n".join(out)


def runnable_blocks() -> list[tuple[str, int, str]]:
    return [(str(doc.relative_to(ROOT)), line, body) for doc in DOCUMENTS
            for line, info, body in fenced_blocks(doc.read_text())
            if info.split() == ["bash", "runnable"]]


def test_block_reader_sees_indented_blocks_and_info_strings():
    text = "a\n```bash runnable\necho 1\n```\n- item\n\n  ```python\n  x = 1\n  ```\n"
    assert fenced_blocks(text) == [(2, "bash runnable", "echo 1"), (7, "python", "x = 1")]
    assert prose("[a](b.md)\n```\n[c](d.md)\n```\n") == "[a](b.md)\n"


def test_there_are_runnable_blocks():
    assert len(runnable_blocks()) >= 5


@pytest.fixture(scope="module")
def scratch_repo(tmp_path_factory) -> Path:
    scratch = tmp_path_factory.mktemp("repo")
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", ".git"):
            (scratch / entry.name).symlink_to(entry)
    return scratch


@pytest.mark.parametrize("document,line,body", runnable_blocks(),
                         ids=[f"{d}:{n}" for d, n, _ in runnable_blocks()])
def test_runnable_block_runs(document, line, body, scratch_repo, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # a wrapper, not a link: a venv's python finds its venv by path
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", HOME=str(tmp_path),
               GATED_ATTENTION_CACHE=str(tmp_path / "cache"))
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=scratch_repo, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (f"{document}:{line} failed ({result.returncode}):\n{body}\n"
                                    f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")


def test_relative_links_point_to_files():
    broken = []
    for doc in DOCUMENTS:
        for target in LINK.findall(prose(doc.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same page
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files:\n" + "\n".join(broken)


def test_documents_speak_of_the_project_only():
    found = [f"{doc.relative_to(ROOT)}: {word}" for doc in USER_TEXTS
             for word in FORBIDDEN if word in doc.read_text()]
    assert len(USER_TEXTS) > 100  # the globs found the code, not only the documents
    assert not found, "\n".join(found)
