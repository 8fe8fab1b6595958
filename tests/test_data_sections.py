"""Each data source's settings are a section of config.data (data.passkey.digits, ...); the
flat names from before sections (data.passkey_digits, ...) stay as aliases of the same field,
on the command line, in configs and grids, and in the config.json of runs saved before."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax
import pytest
from absl import flags

from gated_attention import main
from gated_attention.config import run_config
from gated_attention.core.checks import ConfigError
from gated_attention.data import registry
from gated_attention.training import loop, workdir

ROOT = Path(__file__).parents[1]
ALIASES = sorted(registry.nested_names().items())  # ("data.seqio_task", "data.seqio.task"), ...


def parsed(monkeypatch, *overrides: str, arch: str = "tiny") -> Any:
    """The locked config of a `main` command line with these --config.* overrides."""
    argv = ["main", f"--config={ROOT / 'configs' / 'ablation.py'}:arch={arch}",
            "--workdir=unused", *overrides]
    monkeypatch.setattr(sys, "argv", argv)  # ml_collections reads overrides from sys.argv
    flag_values = main.define_flags(flags.FlagValues())
    main.parse_flags(argv, flag_values)
    return flag_values.config


def field(config: Any, name: str) -> Any:
    for part in name.split("."):
        config = config[part]
    return config


def another(value: Any) -> Any:
    """A value of the field's type other than its default."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 2
    return "other"


def without_sections(saved: dict[str, Any]) -> dict[str, Any]:
    """A config.json as a run wrote it before sections: the sources' fields by flat names."""
    old = json.loads(json.dumps(saved))
    for section in registry.sections():
        del old["data"][section]
    return old


@pytest.mark.reference("two_paths")
@pytest.mark.parametrize("flat,nested", ALIASES, ids=[flat for flat, _ in ALIASES])
def test_either_spelling_sets_the_one_field(monkeypatch, flat, nested):
    value = another(field(run_config.base_config("tiny"), nested))
    text = str(value).lower() if isinstance(value, bool) else str(value)
    for given in (flat, nested):
        config = parsed(monkeypatch, f"--config.{given}={text}")
        assert config.is_locked
        assert field(config, flat) == field(config, nested) == value, given
    # and on the locked config, set under the other spelling afterwards
    config = parsed(monkeypatch)
    *section, name = nested.split(".")
    field(config, ".".join(section))[name] = value
    assert field(config, flat) == value
    config.data[flat.split(".")[1]] = another(value)
    assert field(config, nested) == another(value)


@pytest.mark.reference("two_paths")
def test_config_json_holds_both_spellings_and_reads_back_linked(monkeypatch):
    config = parsed(monkeypatch, "--config.data.passkey_digits=4", arch="passkey_tiny")
    saved = workdir.config_dict(config)
    assert saved["data"]["passkey"]["digits"] == saved["data"]["passkey_digits"] == 4
    for kept in (saved, without_sections(saved)):  # written today, or before sections
        loaded = run_config.saved_config(kept)
        assert loaded.data.passkey.to_dict() == saved["data"]["passkey"]
        assert workdir.config_dict(loaded) == saved
        loaded.data.passkey_digits = 6
        assert loaded.data.passkey.digits == 6
    with pytest.raises(ConfigError, match=r"^data.passkey.digits=4 and its old spelling "
                                          r"data.passkey_digits=6 disagree; keep one$"):
        run_config.saved_config({"data": {**saved["data"], "passkey_digits": 6}})


@pytest.mark.reference("two_paths")
def test_a_run_saved_before_sections_is_the_same_run(monkeypatch, tmp_path, capsys):
    """Its config.json names the sources' fields flat only; the same command resumes it, a
    changed field is named by its nested name."""
    config = parsed(monkeypatch, "--config.data.backcopy_alpha=0.5", arch="sink_tiny")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps(without_sections(workdir.config_dict(config))))
    (run / "metrics.jsonl").write_text("")
    assert workdir.check(run, config) == "resume"
    assert workdir.prepare(run, config) == "resume"
    assert "fields new since" not in capsys.readouterr().out  # the nested names are not new
    config.data.backcopy.alpha = 0.25
    with pytest.raises(workdir.WorkdirError, match=r"different config:\n  data.backcopy.alpha: "
                                                   r"0.5 -> 0.25\n[A-Z]"):
        workdir.check(run, config)
    from configs import from_workdir  # a new run from its weights reads its sections too

    assert from_workdir.get_config(str(run)).data.backcopy.alpha == 0.5


@pytest.mark.slow
@pytest.mark.reference("two_paths")
def test_a_trained_run_saved_before_sections_extends_and_loads(tmp_path):
    # One layer: the claim is about the saved config, and a second layer only adds to each of
    # the four compiles (init, two train steps: the extension's schedule is another program,
    # and the fingerprint). 2026-12-02, this file alone on one process: 18.9 against 20.7 CPU-s.
    config = run_config.base_config("sink_tiny")
    config.model.num_layers = 1
    config.data.update(dict(seq_len=16, backcopy=dict(triggers=2)))
    config.train.update(dict(steps=2, batch_size=4, eval_every=0, eval_batches=1,
                             checkpoint_every=2, log_every=1, telemetry_every=0))
    config.optimizer.warmup_steps = 1
    run = tmp_path / "run"
    loop.run(config, run, progress=False, devices=jax.devices()[:1])
    saved = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps(without_sections(saved)))
    config.train.steps = 3
    summary = loop.run(config, run, progress=False, devices=jax.devices()[:1])
    assert summary["train"]["step"] == 3  # extended from its checkpoint, not a new run
    _, loaded = loop.load_params(run)
    assert loaded.data.backcopy.triggers == loaded.data.backcopy_triggers == 2


@pytest.mark.reference("error_message")
@pytest.mark.parametrize("arch,override,message", [
    ("passkey_tiny", "--config.data.passkey.digits=0",
     "data.passkey.digits=0 must be in 1..18 (data.passkey_digits is its old spelling)"),
    ("sink_tiny", "--config.data.backcopy_alpha=0", "data.backcopy.alpha=0.0 must be > 0 "
     "(Dirichlet concentration) (data.backcopy_alpha is its old spelling)"),
])
def test_a_bad_value_is_refused_naming_the_nested_field(monkeypatch, arch, override, message):
    with pytest.raises(ConfigError) as refused:
        run_config.validate_run_config(parsed(monkeypatch, override, arch=arch))
    assert str(refused.value) == message


@pytest.mark.reference("golden")
def test_a_grid_names_its_runs_the_same_under_either_spelling():
    from experiments.grid_lib import Run

    names = {Run("passkey_tiny", "baseline", overrides=((key, 4),)).name
             for key in ("data.passkey_digits", "data.passkey.digits")}
    assert names == {"passkey_tiny-baseline-passkey_digits4-s0"}
