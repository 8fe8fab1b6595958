"""The learning-rate schedule and AdamW against hand-computed values."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import run_config
from gated_attention.model.transformer import abstract_model
from gated_attention.training import optim

OPT = ml_collections.ConfigDict(dict(peak_lr=2e-3, warmup_steps=100, final_lr=3e-5, b1=0.9,
                                     b2=0.95, eps=1e-8, weight_decay=0.1, clip_norm=1.0))


@pytest.mark.parametrize("step, expected", [
    (0, 0.0),
    (50, 1e-3),                              # half-way up the warm-up
    (100, 2e-3),                             # the peak
    (550, 3e-5 + (2e-3 - 3e-5) * 0.5),       # cosine half-way: (1 + cos(pi/2)) / 2 = 0.5
    (325, 3e-5 + (2e-3 - 3e-5) * (1 + math.cos(math.pi * 0.25)) / 2),
    (1000, 3e-5),                            # the floor at the last step
    (1500, 3e-5),                            # and after it
])
def test_schedule_matches_hand_computed_values(step, expected):
    schedule = optim.learning_rate_schedule(OPT, total_steps=1000)
    assert float(schedule(step)) == pytest.approx(expected, rel=1e-6, abs=1e-12)


def test_schedule_steps_trains_the_first_steps_of_a_longer_run():
    """schedule_steps=1000 in a 300-step run: lr(t) is the 1000-step curve's, not a cosine
    squeezed into 300 steps (hand-computed at t=300: 200 of the decay's 900 steps)."""
    opt = OPT.copy_and_resolve_references()
    opt.schedule_steps = 1000
    truncated = optim.learning_rate_schedule(opt, total_steps=300)
    expected = 3e-5 + (2e-3 - 3e-5) * (1 + math.cos(math.pi * 200 / 900)) / 2
    assert float(truncated(300)) == pytest.approx(expected, rel=1e-6)
    assert float(truncated(50)) == pytest.approx(1e-3, rel=1e-6)
    squeezed = optim.learning_rate_schedule(OPT, total_steps=300)
    assert float(squeezed(300)) == pytest.approx(3e-5, rel=1e-6)  # 0 means train.steps


def test_weight_decay_skips_norms_vectors_and_gate_theta():
    config = run_config.base_config("tiny", "g1_input_independent")
    params = nnx.state(abstract_model(run_config.model_config(config)), nnx.Param)
    flat = {jax.tree_util.keystr(p): v for p, v in
            jax.tree_util.tree_leaves_with_path(optim.decay_mask(params))}
    assert all(v is False for k, v in flat.items() if "scale" in k or "theta" in k)
    assert flat["['embed'].value"] is True
    assert flat["['layers'][0]['attention']['q_proj'].value"] is True
    assert flat["['layers'][0]['ffn']['up_proj'].value"] is True
    assert any("theta" in k for k in flat)


def test_adamw_step_matches_numpy():
    """Two updates of AdamW + clipping on a 2-parameter tree, against the textbook formulas."""
    opt = OPT.copy_and_resolve_references()
    opt.warmup_steps, opt.clip_norm = 1, 0.5
    tx = optim.make_optimizer(opt, total_steps=10)
    params = {"w": jnp.asarray([[1.0, -2.0], [0.5, 3.0]]), "scale": jnp.asarray([1.0, 2.0])}
    grads = [{"w": jnp.asarray([[0.3, -0.1], [0.2, 0.4]]), "scale": jnp.asarray([0.1, -0.2])},
             {"w": jnp.asarray([[-0.1, 0.2], [0.0, 0.1]]), "scale": jnp.asarray([0.05, 0.3])}]
    state = tx.init(params)
    ref = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in ref.items()}
    v = {k: np.zeros_like(x) for k, x in ref.items()}
    schedule = optim.learning_rate_schedule(opt, 10)
    update = jax.jit(tx.update)
    for t, g in enumerate(grads, start=1):
        updates, state = update(g, state, params)
        params = jax.tree.map(lambda p, u: p + u, params, updates)
        g64 = {k: np.asarray(x, np.float64) for k, x in g.items()}
        norm = math.sqrt(sum(float(np.sum(x * x)) for x in g64.values()))
        clip = min(1.0, opt.clip_norm / norm)
        lr = float(schedule(t - 1))
        for k in ref:
            gk = g64[k] * clip
            m[k] = opt.b1 * m[k] + (1 - opt.b1) * gk
            v[k] = opt.b2 * v[k] + (1 - opt.b2) * gk * gk
            step = (m[k] / (1 - opt.b1 ** t)) / (np.sqrt(v[k] / (1 - opt.b2 ** t)) + opt.eps)
            decay = opt.weight_decay * ref[k] if k == "w" else 0.0  # vectors are not decayed
            ref[k] = ref[k] - lr * (step + decay)
    for k in ref:
        np.testing.assert_allclose(np.asarray(params[k]), ref[k], rtol=1e-5, atol=1e-7)
