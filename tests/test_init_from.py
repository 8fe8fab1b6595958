"""Continued training from another run's checkpoint: new length, new RoPE base, fresh schedule."""

import jax
import numpy as np
import pytest
from flax import nnx
from test_train import mini_config

from gated_attention.config import run_config
from gated_attention.parallel import sharding
from gated_attention.training import loop
from gated_attention.training import step as step_lib
from gated_attention.training.metrics_writer import read_jsonl


def _run(config, run_dir, **kwargs):
    return loop.run(config, run_dir, progress=False, devices=jax.devices()[:1], **kwargs)


@pytest.fixture(scope="module")
def source_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("init_from")
    # jax's persistent compilation cache, for this module (tests/conftest.py turns it off
    # after it): the continued runs build their initial state with the program the test
    # compiled first, and load it instead. 2026-12-02, this file alone on one process, measured
    # back to back: 24.6 against 30.0 CPU-s.
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", str(root / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()
    config = mini_config(root, steps=6, eval_every=0, checkpoint_every=3)
    _run(config, root / "short")
    return root, config


def _continued(root, source_config, **model):
    config = mini_config(root, steps=2, eval_every=0, checkpoint_every=0,
                         init_from=str(root / "short"))
    config.data.seq_len = 2 * source_config.data.seq_len
    config.optimizer.warmup_steps = 1
    config.model.update(model)
    return config


def _leaves(params):
    return [np.asarray(x) for x in jax.tree.leaves(params)]


def test_continued_run_starts_from_the_source_parameters(source_run):
    root, source = source_run
    config = _continued(root, source, rope_base=1e6)
    cfg = run_config.validate_run_config(config)
    assert cfg.rope_base == 1e6
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    spec = step_lib.train_state_spec(config, mesh)
    with jax.set_mesh(mesh):
        fresh = spec.init()
    from gated_attention.training.init_from import initial_state

    state = initial_state(config, fresh, spec)
    trained, _ = loop.load_params(root / "short")
    for got, want in zip(_leaves(state["params"]), _leaves(nnx.state(trained, nnx.Param)),
                         strict=True):
        np.testing.assert_array_equal(got, want)
    assert int(state["step"]) == 0
    assert all(not np.any(x) for x in _leaves(state["opt_state"]) if x.ndim)  # fresh moments

    # Step 3 of the source, when asked for, is a different set of weights.
    config.train.init_from_step = 3
    early = initial_state(config, fresh, spec)
    assert any(not np.array_equal(a, b) for a, b in
               zip(_leaves(early["params"]), _leaves(state["params"])))

    # End to end: the continued run trains at the new length and its first loss is the
    # trained model's, far below an untrained model's ln(260) = 5.56.
    config.train.init_from_step = 0
    source_first = [r["loss"] for r in read_jsonl(root / "short" / "metrics.jsonl")][0]
    _run(config, root / "long")
    first = [r["loss"] for r in read_jsonl(root / "long" / "metrics.jsonl")][0]
    assert first < source_first - 0.5, (first, source_first)  # split varies by path
    assert sorted(p.name for p in (root / "short" / "checkpoints").iterdir()
                  if p.name.isdigit()) == ["3", "6"]  # the source run is untouched


@pytest.mark.parametrize("change, message", [
    (dict(init_from="{root}/nowhere"), "not a run workdir|holds no config.json"),
    (dict(init_from_step=7), "init_from_step=7 is not among the checkpoints"),
    (dict(d_model=48), "has parameter .* of shape|does not fit this model"),
])
def test_bad_sources_are_refused_before_anything_is_written(source_run, change, message):
    root, source = source_run
    config = _continued(root, source)
    for key, value in change.items():
        section = config.model if key == "d_model" else config.train
        section[key] = value.format(root=root) if isinstance(value, str) else value
    with pytest.raises(run_config.ConfigError, match=message):
        _run(config, root / "refused")
    assert not (root / "refused").exists()
