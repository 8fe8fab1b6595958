"""What a grid seed means: same seed, same data and same shared initial weights across
variants; another seed, other data and weights; --set data.shuffle_seed keeps data fixed."""

import jax
import numpy as np
import pytest

from configs import sinks
from experiments import grid_lib
from gated_attention.data import build_inputs
from gated_attention.parallel import sharding
from gated_attention.training import step as step_lib


def _config(run: grid_lib.Run, settings=None):
    config = sinks.get_config(f"variant={run.variant}")
    overrides = grid_lib.run_overrides(run, "tiny", settings)
    overrides.update({"train.batch_size": 4, "data.seq_len": 16, "train.eval_batches": 0})
    config.update_from_flattened_dict(overrides)
    return config


def _weights(config):
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    spec = step_lib.train_state_spec(config, mesh)
    with jax.disable_jit():  # eager: a tiny model inits faster than it compiles
        params = spec.init()["params"]
    return dict(zip(step_lib.parameter_names(params), map(np.asarray, jax.tree.leaves(params))))


def _batches(config, n=3):
    inputs = build_inputs(config, None)
    return [next(inputs.train)["inputs"].copy() for _ in range(n)]


def _run(variant, seed):
    return grid_lib.Run(arch="sink_tiny", variant=variant, seed=seed,
                        overrides=(("model.num_heads", 2), ("model.num_kv_heads", 2)))


@pytest.mark.slow  # four eager inits: about a minute under load
def test_same_seed_shares_weights_across_variants_where_names_and_shapes_agree():
    base = _weights(_config(_run("baseline", 1)))
    gated = _weights(_config(_run("g1_sdpa_elementwise", 1)))
    other_seed = _weights(_config(_run("baseline", 2)))
    assert set(gated) - set(base) == {"layers.0.attention.gate.kernel",
                                      "layers.1.attention.gate.kernel"}
    for name, value in base.items():
        np.testing.assert_array_equal(gated[name], value, err_msg=name)
        if value.std() > 0:  # drawn at random: normal(0, 0.02), and another seed differs
            assert value.std() == pytest.approx(0.02, rel=0.25), name
            assert not np.array_equal(other_seed[name], value), name
    # Without the per-name draw, the gate takes keys from the one stream and the MLP (built
    # after it) differs: the guarantee comes from train.init_by_name.
    plain = _config(_run("g1_sdpa_elementwise", 1))
    plain.train.init_by_name = False
    unpaired = _weights(plain)
    assert not np.array_equal(unpaired["layers.1.ffn.up_proj"], base["layers.1.ffn.up_proj"])


def test_seed_sets_the_data_and_a_switch_keeps_it_fixed():
    one_base, one_gated = _config(_run("baseline", 1)), _config(_run("g1_sdpa_elementwise", 1))
    two = _config(_run("baseline", 2))
    assert one_base.data.shuffle_seed == 1 and two.data.shuffle_seed == 2
    same = _batches(one_base)
    for a, b in zip(same, _batches(one_gated)):
        np.testing.assert_array_equal(a, b)
    assert not any(np.array_equal(a, b) for a, b in zip(same, _batches(two)))
    # The task itself (its chain and triggers) does not move with the seed.
    assert build_inputs(one_base, None).summary["triggers"] == build_inputs(
        two, None).summary["triggers"]
    fixed = {"data.shuffle_seed": 0}
    a, b = _config(_run("baseline", 1), fixed), _config(_run("baseline", 2), fixed)
    assert a.seed == 1 and b.seed == 2
    for x, y in zip(_batches(a), _batches(b)):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("field,value,message", [
    ("train.telemetry_every", -1, "train.telemetry_every=-1 must be an integer >= 0"),
])
def test_bad_telemetry_interval_names_the_field(field, value, message):
    """(A value of the wrong type, e.g. train.init_by_name=yes, ml_collections refuses.)"""
    from gated_attention.config import run_config

    config = sinks.get_config()
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(run_config.ConfigError, match=message.replace(".", r"\.")):
        run_config.validate_run_config(config)
