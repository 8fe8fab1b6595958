"""A user error prints one line and exits 2; a code bug keeps its traceback (no entry point
turns AttributeError / KeyError / TypeError into "Config error")."""

import contextlib
import io
import sys

import pytest
from absl import flags

from gated_attention import main
from gated_attention.config import run_config
from gated_attention.core import errors

ARGV = ["main", "--config=configs/ablation.py:arch=tiny,variant=baseline", "--workdir=unused",
        "--multihost=no"]


def run_main(monkeypatch, argv=ARGV):
    monkeypatch.setattr(sys, "argv", argv)  # ml_collections reads overrides from sys.argv
    flag_values = main.define_flags(flags.FlagValues())
    main.main(main.parse_flags(argv, flag_values), flag_values)


def test_a_user_error_is_one_line_on_stderr_and_exit_2(monkeypatch):
    def refuse(config):
        raise run_config.ConfigError("train.steps=0 must be > 0")

    monkeypatch.setattr(run_config, "validate_run_config", refuse)
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(stderr):
        run_main(monkeypatch)
    assert stop.value.code == 2
    assert stderr.getvalue() == "Config error: train.steps=0 must be > 0\n"


@pytest.mark.parametrize("bug", [AttributeError, KeyError, TypeError, ValueError])
def test_a_code_bug_in_validation_keeps_its_traceback(monkeypatch, bug):
    def broken(config):
        raise bug("a bug in the code, not the user's input")

    monkeypatch.setattr(run_config, "validate_run_config", broken)
    with pytest.raises(bug, match="a bug in the code"):
        run_main(monkeypatch)


def test_a_code_bug_inside_a_data_source_keeps_its_traceback(monkeypatch, tmp_path):
    """A KeyError raised while a source builds the run's inputs is a bug, not the user's
    input: it reaches the caller as a KeyError with its frames, never a one-line ConfigError
    (the sources raise ConfigError themselves for bad settings and files)."""
    from gated_attention.data.synthetic import bigram_backcopy

    def summary(chain, data_config):  # a lookup of a field that does not exist: a bug
        return {"alpha": data_config.backcopy.alpha}["backcopy_sead"]

    monkeypatch.setattr(bigram_backcopy, "summary", summary)
    argv = [*ARGV[:2], f"--workdir={tmp_path / 'run'}", *ARGV[3:],
            "--config.data.source=bigram_backcopy", "--config.train.steps=1",
            "--config.optimizer.warmup_steps=0"]  # (were the bug missed: one step, not 300)
    with pytest.raises(KeyError, match="backcopy_sead") as raised:
        run_main(monkeypatch, argv)
    assert not isinstance(raised.value, errors.UserError)
    assert raised.value.__cause__ is None and raised.traceback[-1].name == "summary"
    assert [entry.name for entry in raised.traceback].count("build_inputs") >= 1
    assert not (tmp_path / "run").exists()  # refused before the workdir was claimed


def test_a_code_bug_in_the_config_file_keeps_its_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise AttributeError("'NoneType' object has no attribute 'seq_len'")

    monkeypatch.setattr(run_config, "base_config", broken)
    with pytest.raises((AttributeError, flags.Error), match="has no attribute 'seq_len'"):
        run_main(monkeypatch)


def test_an_unknown_override_is_still_one_line(monkeypatch):
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as stop, contextlib.redirect_stderr(stderr):
        run_main(monkeypatch, [*ARGV, "--config.train.stepz=3"])
    assert stop.value.code == 2
    assert stderr.getvalue().startswith("Config error: 'stepz' Did you mean \"steps\"")
    assert stderr.getvalue().count("\n") == 1


def test_every_user_error_class_is_a_user_error():
    from experiments.grid_lib import GridError
    from gated_attention.compile.gpu_targets import GpuAcceleratorError
    from gated_attention.compile.tpu_topologies import AcceleratorError
    from gated_attention.data.array_record_source import ShardError
    from gated_attention.data.epochs import EpochBudgetError
    from gated_attention.data.hf_tokenizer import HFTokenizerError
    from gated_attention.data.prepare import PrepareError
    from gated_attention.data.seqio_source import SeqioTaskError
    from gated_attention.data.tfds_source import TfdsSourceError
    from gated_attention.model.variants import VariantError
    from gated_attention.training.workdir import WorkdirError
    from gated_attention.training.workdir_lock import WorkdirBusyError

    for cls in (run_config.ConfigError, GridError, ShardError, EpochBudgetError,
                HFTokenizerError, PrepareError, SeqioTaskError, TfdsSourceError,
                GpuAcceleratorError, AcceleratorError, VariantError, WorkdirError,
                WorkdirBusyError):
        assert issubclass(cls, errors.UserError), cls
