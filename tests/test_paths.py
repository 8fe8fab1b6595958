"""gated_attention.core.paths on a local disk and on a (faked) bucket."""

import os

import pytest

from gated_attention.core import paths


def test_resolve_keeps_uris_and_makes_local_paths_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert os.fspath(paths.resolve("gs://b/run/x")) == "gs://b/run/x"
    assert os.fspath(paths.resolve("runs/x")) == str(tmp_path / "runs" / "x")
    assert os.fspath(paths.resolve("~/y")) == os.path.expanduser("~/y")
    assert paths.is_local("runs/x") and not paths.is_local("gs://b/x")


@pytest.mark.parametrize("root", ["local", "gs://bucket/r"])
def test_write_append_move(root, tmp_path, fake_bucket):
    base = paths.resolve(tmp_path / "local" if root == "local" else root)
    paths.write_atomic(base / "sub" / "a.json", "{}\n")
    paths.write_atomic(base / "sub" / "a.json", '{"v": 2}\n')
    paths.write_atomic(base / "b.bin", b"\x00\x01")
    paths.append_text(base / "m.jsonl", "1\n")
    paths.append_text(base / "m.jsonl", "2\n")
    assert (base / "m.jsonl").read_text() == "1\n2\n"
    assert sorted(p.name for p in (base / "sub").iterdir()) == ["a.json"]  # no temp files
    moved = paths.resolve(os.fspath(base) + ".old")
    paths.move_tree(base, moved)
    assert not base.exists()
    assert (moved / "sub" / "a.json").read_text() == '{"v": 2}\n'
    assert (moved / "b.bin").read_bytes() == b"\x00\x01"
    if root != "local":  # the bucket's objects are where gs:// says, not under a local gs:/
        assert (fake_bucket / "bucket" / "r.old" / "m.jsonl").read_text() == "1\n2\n"
        assert not (fake_bucket / "bucket" / "r").exists()
    paths.write_atomic(base / "x", "y")
    with pytest.raises(FileExistsError, match="refusing"):
        paths.move_tree(base, moved)


@pytest.mark.parametrize("root", ["local", "gs://bucket/r"])
def test_move_aside_never_reuses_a_taken_name(root, tmp_path, fake_bucket):
    base = paths.resolve(tmp_path / "local" / "run" if root == "local" else root + "/run")
    for content in ("first", "second", "third"):
        paths.write_atomic(base / "f.txt", content)
        paths.move_aside(base, "run.old")
    names = sorted(p.name for p in base.parent.iterdir())
    assert names == ["run.old", "run.old-1", "run.old-2"]
    assert [(base.parent / n / "f.txt").read_text() for n in names] == ["first", "second",
                                                                       "third"]
