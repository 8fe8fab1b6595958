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
# An absolute path in a text the project ships may name only a standard system location
# (the Filesystem Hierarchy Standard's top-level folders): anything else is a place on the
# machine the text was written on, which a reader's clone does not have. Two more roots are
# examples a reader replaces: /path/to/... and a cluster's shared file system (/shared/runs).
SYSTEM_ROOTS = frozenset({"bin", "boot", "dev", "etc", "lib", "lib64", "media", "mnt", "opt",
                          "proc", "run", "sbin", "srv", "sys", "tmp", "usr", "var"})
EXAMPLE_ROOTS = frozenset({"path", "shared"})
# "/name/x" not preceded by a name, a URL's host, a variable or a placeholder: `$VENV/xpk`,
# `<workdir>/analysis` and `gs://bucket/x` are relative to something else.
ABSOLUTE_PATH = re.compile(r"(?<![\w.~:/$@})>\]-])/([A-Za-z_][\w.-]*)/[\w.-]")
PARENT_PATH = re.compile(r"(?<![\w./-])((?:\.\./)+[\w./-]*)")
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


_OUTPUTS: dict[str, str] = {}  # block body -> its stdout, run once per test process


def run_block(document: str, line: int, body: str, scratch: Path, tmp_path: Path) -> str:
    """stdout of one runnable block (run once per process); fails the test if it fails."""
    if body not in _OUTPUTS:
        _OUTPUTS[body] = _run(document, line, body, scratch, tmp_path)
    return _OUTPUTS[body]


# Numbers the documents print beside a runnable block, as they state them: (document, the
# block's first line) -> claims that must be in the text after the block and agree with what
# the block prints: a string printed as it is (commas optional), or (label, "10.9 GiB"): the
# printed line starting with that label holds the value the text states, to its rounding.
PRINTED_BESIDE = {
    ("README.md", "python -m gated_attention.inspect --config=configs/ablation.py:arch="
                  "dense_1p7b_28l,variant=g1_sdpa_elementwise"):
        ["1,838,015,488", "117,440,512"],
    ("docs/moe.md", "python -m gated_attention.inspect --config=configs/ablation.py:arch="
                    "moe_15a2b,variant=baseline"):
        ["15,577,227,264", "1,987,682,304", "16,030,408,704", "2,440,863,744", "453,181,440"],
    ("docs/sharding.md", "python -m gated_attention.inspect \\"):
        [("activations", "2.16 GiB"), ("total", "5.58 GiB"),
         "512.0 MiB (the plain loss: 9.27 GiB, 8.77 GiB more)"],
}


def _printed_as_stated(printed: str, label: str, stated: str) -> bool:
    """The printed value on `label`'s line equals `stated` within the rounding of both."""
    number, unit = stated.split()
    for line in printed.splitlines():
        match = re.match(rf"\s*{re.escape(label)}\s+([0-9.]+) {re.escape(unit)}$", line)
        if match:
            value = match.group(1)
            half_units = sum(0.5 * 10.0 ** -len(x.partition(".")[2]) for x in (number, value))
            return abs(float(value) - float(number)) <= half_units + 1e-12
    return False


def _claims() -> list[tuple[str, int, str, list[str]]]:
    found = []
    for document, line, body in runnable_blocks():
        claims = PRINTED_BESIDE.get((document, body.split("\n")[0]))
        if claims:
            found.append((document, line, body, claims))
    return found


def test_every_stated_number_has_its_block():
    assert len(_claims()) == len(PRINTED_BESIDE), "a block of PRINTED_BESIDE is gone or moved"


@pytest.mark.parametrize("document,line,body,claims", _claims(),
                         ids=[f"{d}:{n}" for d, n, _, _ in _claims()])
def test_numbers_beside_runnable_blocks_are_what_they_print(document, line, body, claims,
                                                            scratch_repo, tmp_path):
    after = "\n".join((ROOT / document).read_text().split("\n")[line:line + 40])
    printed = run_block(document, line, body, scratch_repo, tmp_path)
    for claim in claims:
        stated = claim[1] if isinstance(claim, tuple) else claim
        assert stated in after, f"{document}:{line}: the text no longer states {stated!r}"
        agrees = (_printed_as_stated(printed, *claim) if isinstance(claim, tuple)
                  else claim in printed or claim.replace(",", "") in printed)
        assert agrees, f"{document}:{line} states {claim!r}; the block printed:\n{printed[-3000:]}"


@pytest.mark.parametrize("document,line,body", runnable_blocks(),
                         ids=[f"{d}:{n}" for d, n, _ in runnable_blocks()])
def test_runnable_block_runs(document, line, body, scratch_repo, tmp_path):
    run_block(document, line, body, scratch_repo, tmp_path)


def _run(document: str, line: int, body: str, scratch_repo: Path, tmp_path: Path) -> str:
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
    return result.stdout


def test_relative_links_point_to_files():
    broken = []
    for doc in DOCUMENTS:
        for target in LINK.findall(prose(doc.read_text())):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # a web address or an anchor in the same page
            path = (doc.parent / target.split("#", 1)[0]).resolve()
            if not (path.exists() and path.is_relative_to(ROOT)):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, "links to missing files or outside the repository:\n" + "\n".join(broken)


def paths_outside_the_repository(text: str, where: Path) -> list[str]:
    """The absolute paths of `text` outside the system's standard folders, and its `../`
    paths that, read from `where`'s folder, leave the repository."""
    found = [f"/{m.group(1)}/" for m in ABSOLUTE_PATH.finditer(text)
             if m.group(1) not in SYSTEM_ROOTS | EXAMPLE_ROOTS]
    found += [str(ROOT)] if str(ROOT) in text else []
    for match in PARENT_PATH.finditer(text):
        if not (where.parent / match.group(1)).resolve().is_relative_to(ROOT):
            found.append(match.group(1))
    return found


def test_the_path_check_finds_planted_paths_outside_the_repository():
    readme, doc = ROOT / "README.md", ROOT / "docs" / "method.md"
    planted = ("Data in /home/alice/corpus, notes in `/Users/bob/notes.md`, see "
               "[the spec](../../SPEC.md).")
    assert paths_outside_the_repository(planted, doc) == ["/home/", "/Users/", "../../SPEC.md"]
    assert paths_outside_the_repository("run `ls ../anchors/x.json`", readme) == [
        "../anchors/x.json"]
    assert paths_outside_the_repository(f"cd {ROOT}", readme)
    fine = ("python -m gated_attention.main --workdir=/tmp/run > /dev/null; see "
            "[configs](../configs/ablation.py), gs://bucket/data/x, https://arxiv.org/abs/2505.06708,"
            " 2.1 tokens/s, $HOME/.cache/x, ~/data/y, $(VENV)/xpk/bin, <workdir>/analysis/a,"
            " --tokenizer_path=/path/to/spm.model")
    assert paths_outside_the_repository(fine, doc) == []


def test_texts_name_no_path_outside_the_repository():
    found = [f"{text.relative_to(ROOT)}: {path}" for text in USER_TEXTS
             for path in paths_outside_the_repository(text.read_text(), text)]
    assert len(USER_TEXTS) > 100  # the globs found the code, not only the documents
    assert not found, "\n".join(found)
