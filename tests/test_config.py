"""Bad flags and config values fail before any compilation, naming the field and choices."""

import os
import subprocess
import sys

import pytest

from gated_attention.config import run_config
from gated_attention.config.run_config import ConfigError, validate_run_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _config(**changes):
    config = run_config.base_config("tiny", "baseline")
    for key, value in changes.items():
        section, field = key.split("__")
        config[section][field] = value
    return config


@pytest.mark.parametrize("changes, message", [
    ({"train__steps": -5}, r"train.steps=-5 must be > 0"),
    ({"train__batch_size": 10, "train__grad_accum": 4},
     r"train.batch_size=10 must be divisible by train.grad_accum=4"),
    ({"train__grad_accum": 0}, r"train.grad_accum=0 must be >= 1"),
    ({"data__source": "c4"}, r"data.source='c4' is not allowed; choose one of cpython_docs, "
                             r"python_source, files, seqio"),
    ({"data__tokenizer": "gpt2"}, r"data.tokenizer='gpt2' is not allowed; choose one of "
                                  r"sentencepiece, byte"),
    ({"data__tokenizer": "byte", "model__vocab_size": 200},
     r"needs model.vocab_size >= 259"),
    ({"data__source": "files"}, r"data.source='files' needs data.paths"),
    ({"data__source": "seqio"}, r"data.source='seqio' needs data.tokenizer_path"),
    ({"data__seq_len": 1}, r"data.seq_len=1 must be >= 2"),
    ({"data__cache_dir": "gs://b/cache"}, r"data.cache_dir='gs://b/cache' must be a local"),
    ({"optimizer__warmup_steps": 5000}, r"optimizer.warmup_steps=5000 must be in \[0, "
                                        r"train.steps=300\]"),
    ({"optimizer__warmup_steps": 5000, "optimizer__schedule_steps": 4000},
     r"optimizer.warmup_steps=5000 must be in \[0, optimizer.schedule_steps=4000\]"),
    ({"optimizer__schedule_steps": -1}, r"optimizer.schedule_steps=-1 must be an integer >= 0"),
    ({"optimizer__final_lr": 1.0}, r"optimizer.final_lr=1.0 must be in \[0, peak_lr="),
    ({"optimizer__b2": 1.0}, r"optimizer.b2=1.0 must be in \[0, 1\)"),
    ({"train__keep_checkpoints": 0}, r"train.keep_checkpoints=0 must be >= 1"),
    ({"model__attention_impl": "flash"}, r"model.attention_impl='flash' is not allowed"),
])
def test_bad_values_name_the_field(changes, message):
    with pytest.raises(ConfigError, match=message):
        validate_run_config(_config(**changes))


def test_unknown_arch_and_variant():
    with pytest.raises(ConfigError, match=r"arch='huge' is not allowed; choose one of tiny"):
        run_config.base_config("huge", "baseline")
    with pytest.raises(ConfigError, match=r"g9_gate"):
        run_config.base_config("tiny", "g9_gate")


def test_default_configs_validate():
    for variant in ("baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise"):
        validate_run_config(run_config.base_config("tiny", variant))


def _cli(*args, tmp_path):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "GATED_ATTENTION_CACHE": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "gated_attention.main", *args], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=120)


def test_cli_rejects_bad_values_and_flags_before_compiling(tmp_path):
    workdir = tmp_path / "run"
    bad_value = _cli("--config=configs/ablation.py:arch=tiny,variant=g1_sdpa_elementwise",
                     f"--workdir={workdir}", "--config.train.steps=-1", tmp_path=tmp_path)
    assert bad_value.returncode != 0
    assert "Config error: train.steps=-1 must be > 0" in bad_value.stderr
    assert not workdir.exists()  # stopped before touching the workdir, let alone compiling
    unknown_field = _cli("--config=configs/ablation.py:arch=tiny", f"--workdir={workdir}",
                         "--config.train.stepz=3", tmp_path=tmp_path)
    assert unknown_field.returncode != 0 and "stepz" in unknown_field.stderr
    assert not workdir.exists()


@pytest.mark.reference("error_message")
def test_each_section_is_checked_by_its_owner():
    """The owners raise UserError themselves, naming the field (no wrapper needed)."""
    from gated_attention.config import optimizer_config, train_config
    from gated_attention.core.errors import UserError
    from gated_attention.data import registry
    from gated_attention.model import model_config

    config = _config()
    config.optimizer.eps = 0.0
    with pytest.raises(UserError, match=r"^optimizer.eps=0.0 must be > 0$"):
        optimizer_config.check_section(config.optimizer, config.train.steps)
    config.train.log_every = 0
    with pytest.raises(UserError, match=r"^train.log_every=0 must be > 0$"):
        train_config.check_section(config.train)
    config.model.remat = "some"
    with pytest.raises(UserError, match=r"^model.remat='some' is not allowed; choose one of "
                                        r"none, full, dots_with_no_batch_dims_saveable, "
                                        r"nothing_saveable$"):
        model_config.from_sections(config.model, config.attention)
    with pytest.raises(UserError, match=r"^model.num_heads=0 must be > 0$"):
        model_config.ModelConfig(vocab_size=64, num_layers=1, d_model=8, num_heads=0,
                                 num_kv_heads=1, head_dim=8, mlp_dim=8)
    config = _config(data__packing="concat", data__add_eos=False)
    with pytest.raises(UserError, match=r"^data.packing='concat' joins documents with EOS"):
        registry.check_section(config, run_config.model_config(config))


@pytest.mark.reference("error_message")
def test_validation_reads_no_file_and_the_opening_checks_do(tmp_path):
    """A missing tokenizer file or corpus passes the field checks and is refused, naming the
    field, where it is opened (data.registry.check_files, before any compile)."""
    from gated_attention.data import registry

    missing = tmp_path / "nowhere.model"
    config = _config(data__tokenizer_path=str(missing))
    validate_run_config(config)
    with pytest.raises(ConfigError, match=rf"^data.tokenizer_path='{missing}' does not exist"):
        registry.check_files(config)
    config = _config(data__source="files", data__paths=str(tmp_path / "*.jsonl"))
    validate_run_config(config)
    with pytest.raises(ConfigError, match=r"^data.paths: '.*\*.jsonl' matches no file"):
        registry.check_files(config)
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    registry.check_files(config)
