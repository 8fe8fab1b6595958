"""Every user mistake we know of, as a table: each command line fails with one line naming
the field (or flag) and what is allowed, before any compile and before the workdir changes.

Each case runs `python -m gated_attention.main` in-process (its own absl flag set), with the
train step's compile replaced by a failure, and compares the workdir before and after.
"""

import contextlib
import io
import json
import re
import sys

import pytest
from absl import flags

from gated_attention import main
from gated_attention.config import run_config
from gated_attention.training import step as step_lib
from gated_attention.training import workdir

CONFIG = "--config=configs/ablation.py:arch=tiny,variant=g1_sdpa_elementwise"


def small_run(tmp_path):
    """Flags of a small byte-level run on a few documents written here. Documents are held out
    by a hash of their names, which hold tmp_path: with 100 of them at 0.2 no split is empty
    but with probability 2e-10 (30 of them left none held out once in a thousand runs)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document {i} " * 10}) + "\n"
                              for i in range(100)))
    return ["--progress=false", "--multihost=no", "--config.data.source=files",
            f"--config.data.paths={corpus}", "--config.data.tokenizer=byte",
            "--config.model.vocab_size=260", "--config.data.seq_len=32",
            f"--config.data.cache_dir={tmp_path / 'cache'}", "--config.train.batch_size=8",
            "--config.data.eval_fraction=0.2"]


def command(tmp_path, monkeypatch, args, run_dir):
    """The error line of `main` for this command line (the test fails if it would compile)."""
    def no_compile(*_, **__):
        raise AssertionError("reached the compile of the train step")

    monkeypatch.setattr(step_lib, "jit_train_step", no_compile)
    monkeypatch.setattr(step_lib, "train_state_spec", no_compile)
    config = [a for a in args if a.startswith("--config=")] or [CONFIG]
    argv = ["main", *config, f"--workdir={run_dir}", *small_run(tmp_path),
            *(a for a in args if not a.startswith("--config="))]
    monkeypatch.setattr(sys, "argv", argv)  # ml_collections reads overrides from sys.argv
    flag_values = main.define_flags(flags.FlagValues())
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(stderr):
        main.main(main.parse_flags(argv, flag_values), flag_values)
    assert stop.value.code == 2, (stop.value.code, stderr.getvalue())  # a user error: exit 2
    return stderr.getvalue().rstrip("\n")


def tree(path):
    if not path.exists():
        return None
    if path.is_file():
        return path.read_bytes()
    return {p.relative_to(path).as_posix(): (p.read_bytes() if p.is_file() else None)
            for p in sorted(path.rglob("*"))}


def a_file(run_dir, tmp_path):
    run_dir.write_text("my notes")


def below_a_file(run_dir, tmp_path):
    run_dir.parent.write_text("mine")  # the workdir asked for is notes/run


def another_run(run_dir, tmp_path):
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"arch": "tiny", "train": {"steps": 5}}))
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "kind": "train", "loss": 5.0}\n')


def someone_elses_folder(run_dir, tmp_path):
    run_dir.mkdir()
    (run_dir / "thesis.tex").write_text("mine")


def a_longer_run(run_dir, tmp_path):
    """The same config with train.steps=2000 (this command asks for the default, 300)."""
    argv = ["main", CONFIG, f"--workdir={run_dir}", *small_run(tmp_path),
            "--config.train.steps=2000"]
    saved_argv, sys.argv = sys.argv, argv
    try:
        flag_values = main.define_flags(flags.FlagValues())
        main.parse_flags(argv, flag_values)
        config = flag_values.config
        from gated_attention.config import run_config

        run_config.validate_run_config(config)
    finally:
        sys.argv = saved_argv
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps(workdir.config_dict(config)))


CASES = [  # (id, extra flags, workdir set-up, the error line)
    ("arch_typo", ["--config=configs/ablation.py:arch=tinyy"], None,
     r"^Config error: arch='tinyy' is not allowed; choose one of tiny, small,"),
    ("variant_typo", ["--config=configs/ablation.py:variant=g1_sdpa_elementwisee"], None,
     r"^Config error: variant='g1_sdpa_elementwisee' is unknown; choose one of baseline,"),
    ("config_string_key", ["--config=configs/ablation.py:arch=tiny,size=2"], None,
     r"^Config error: config string key 'size' unknown; keys: arch, variant$"),
    ("config_file_path", ["--config=configs/ablasion.py"], None,
     r"^Config error: --config=configs/ablasion.py cannot be loaded \(.*No such file"),
    ("variant_label_override", ["--config.variant=baseline"], None,
     r"^Config error: config.variant='baseline' disagrees with config.attention, which holds "
     r"'g1_sdpa_elementwise'"),
    ("arch_label_override", ["--config.arch=small"], None,
     r"^Config error: --config.arch=small is refused: config.arch names the architecture"),
    ("unknown_field", ["--config.train.stepz=3"], None, r"stepz"),
    ("negative_steps", ["--config.train.steps=-1"], None,
     r"^Config error: train.steps=-1 must be > 0$"),
    ("gate_activation", ["--config.attention.activation=relu"], None,
     r"^Config error: attention: activation='relu' is not allowed; choose one of sigmoid, "
     r"silu, identity, ns_sigmoid$"),
    ("on_nonfinite", ["--config.train.on_nonfinite=ignore"], None,
     r"^Config error: train.on_nonfinite='ignore' is not allowed; choose one of stop, skip$"),
    ("max_skipped", ["--config.train.max_skipped=0"], None,
     r"^Config error: train.max_skipped=0 must be >= 1$"),
    ("mesh_too_big", ["--config.mesh.data=3"], None,
     r"^Config error: config.mesh does not fit the 8 devices: .*needs 3 devices"),
    ("batch_over_mesh", ["--config.train.batch_size=12"], None,
     r"^Config error: train.batch_size / train.grad_accum = 12 sequences must be divisible by "
     r"the 8 batch shards"),
    ("glob_matches_nothing", ["--config.data.paths=/nonexistent/*.jsonl"], None,
     r"^Config error: data.paths: '/nonexistent/\*.jsonl' matches no file"),
    ("tokenizer_file_missing", ["--config.data.tokenizer=sentencepiece",
                                "--config.data.tokenizer_path=/nonexistent/sp.model"], None,
     r"^Config error: data.tokenizer_path='/nonexistent/sp.model' does not exist"),
    ("seq_len_over_held_out", ["--config.data.seq_len=8192", "--config.train.batch_size=1",
                               "--config.mesh.data=1", "--config.mesh.tensor=8"], None,
     r"^Config error: data.seq_len=8192 is longer than the whole held-out split \(\d+ tokens\)"),
    ("too_many_epochs", ["--config.train.steps=100000"], None,
     r"^Config error: train.steps=100000 x train.batch_size=8 x data.seq_len=32 = .* epochs of "
     r"the training split .* more than data.max_epochs="),
    ("held_out_under_one_batch", ["--config.data.seq_len=4096"], None,
     r"^Config error: the held-out split has too few tokens \(\d+\) for one batch of 8 x "
     r"4096; raise data.eval_fraction or lower train.batch_size$"),
    ("workdir_is_a_file", [], a_file, r"^Error: --workdir=.* is a file, not a folder"),
    ("workdir_below_a_file", [], below_a_file, r"^Error: --workdir=.* cannot be created: .* "
                                                r"is a file$"),
    ("workdir_of_another_run", [], another_run, r"^Error: .* holds a run of a different config:"),
    ("workdir_not_a_run", [], someone_elses_folder, r"^Error: .* holds no config.json: it is "
                                                     r"not a run of ours"),
    ("fewer_steps", [], a_longer_run, r"(?s)^Error: .*train.steps: 2000 -> 300.*may only grow"),
]


@pytest.mark.parametrize("args, setup, message", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_mistake_is_one_line_before_compiling_and_writes_nothing(tmp_path, monkeypatch, args,
                                                                   setup, message):
    run_dir = tmp_path / "notes" / "run" if setup is below_a_file else tmp_path / "run"
    if setup is not None:
        setup(run_dir, tmp_path)
    before = tree(tmp_path / "notes" if setup is below_a_file else run_dir)
    error = command(tmp_path, monkeypatch, args, run_dir)
    assert re.search(message, error), error
    first = error.splitlines()[0]
    if "different config" not in first and "Flag error" not in first and "steps" not in error:
        assert "\n" not in error, error  # one line
    assert tree(tmp_path / "notes" if setup is below_a_file else run_dir) == before


def test_labels_follow_the_fields():
    """An axis override renames the variant; a label set apart from the fields is refused."""
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.attention.activation = "silu"
    run_config.validate_run_config(config)
    assert config.variant == "g1_sdpa_elementwise+activation=silu"
    run_config.validate_run_config(config)  # a saved config.json validates again as it is
    assert config.variant == "g1_sdpa_elementwise+activation=silu"
    config = run_config.base_config("tiny", "baseline")
    config.variant = "g1_sdpa_elementwise"  # the label alone: the fields are the baseline's
    with pytest.raises(run_config.ConfigError, match=r"config.variant='g1_sdpa_elementwise' "
                       r"disagrees with config.attention, which holds 'baseline'"):
        run_config.validate_run_config(config)
    config = run_config.base_config("tiny", "baseline")
    config.arch = "small"
    with pytest.raises(run_config.ConfigError, match=r"config.arch='small' disagrees with "
                       r"config.model, which holds the 'tiny' architecture"):
        run_config.validate_run_config(config)
