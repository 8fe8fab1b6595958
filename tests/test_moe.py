"""MoE FFN: against a naive float64 reference, hand-computed losses, sharded equals single-device,
a tiny MoE model that learns, and the 15A2B parameter counts in closed form."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gated_attention import inspect as ga_inspect
from gated_attention.config.run_config import base_config, model_config
from gated_attention.model.layers import moe_ops, moe_parallel
from gated_attention.model.layers.moe import MoEFeedForward
from gated_attention.model.transformer import Transformer
from gated_attention.parallel import sharding

D, F, E, K = 16, 12, 8, 2


def small_cfg(**changes):
    cfg = model_config(base_config("tiny_moe"))
    fields = dict(d_model=D, expert_mlp_dim=F, num_experts=E, experts_per_token=K,
                  dtype="float32")
    fields.update(changes)
    return cfg.replace(**fields)


def make_layer(cfg, seed=0):
    """A layer with weights large enough that routing and outputs are far from zero."""
    layer = MoEFeedForward(cfg, rngs=nnx.Rngs(params=seed))
    keys = jax.random.split(jax.random.key(seed + 100), 4)
    num_experts = cfg.experts[0]
    layer.router[...] = jax.random.normal(keys[0], (D, num_experts), jnp.float32)
    for key, name in zip(keys[1:], ("gate_proj", "up_proj", "down_proj")):
        shape = getattr(layer, name)[...].shape
        getattr(layer, name)[...] = 0.3 * jax.random.normal(key, shape, jnp.float32)
    return layer


forward = nnx.jit(lambda layer, x: layer(x))


def tokens(shape=(4, 6), seed=1):
    return jax.random.normal(jax.random.key(seed), shape + (D,), jnp.float32)


# ----------------------------------------------------------------------------- reference

def reference_routing(logits, top_k, capacity):
    """Top-k choices and capacity keep mask by explicit loops (slot-major priority)."""
    logits = np.asarray(logits, np.float64)
    choices = np.argsort(-logits, axis=-1, kind="stable")[:, :top_k]
    keep = np.ones(choices.shape, bool)
    if capacity:
        used = np.zeros(logits.shape[1], int)
        for slot in range(top_k):
            for t in range(logits.shape[0]):
                e = choices[t, slot]
                keep[t, slot] = used[e] < capacity
                used[e] += 1
    return choices, keep


def reference_moe(x, router, w_gate, w_up, w_down, *, choices, keep, renormalize):
    """Loop over experts with a dense [T] mask, float64; returns (y, balance loss, z-loss).

    The routing decisions (integer choices and keep mask) come from `reference_routing`.
    """
    x, router, w_gate, w_up, w_down = (jnp.asarray(a, jnp.float64)
                                       for a in (x, router, w_gate, w_up, w_down))
    logits = x @ router
    probs = jax.nn.softmax(logits, axis=-1)
    chosen = jnp.take_along_axis(probs, jnp.asarray(choices), axis=-1)
    if renormalize:
        chosen = chosen / jnp.sum(chosen, axis=-1, keepdims=True)
    chosen = chosen * jnp.asarray(keep)
    num_tokens, num_experts = probs.shape
    y = jnp.zeros_like(x)
    for e in range(num_experts):
        mask = jnp.sum(jnp.where(jnp.asarray(choices) == e, chosen, 0.0), axis=-1)
        hidden = jax.nn.silu(x @ w_gate[e]) * (x @ w_up[e])
        y = y + mask[:, None] * (hidden @ w_down[e])
    frac = np.bincount(np.ravel(choices), minlength=num_experts) / (K * num_tokens)
    balance = num_experts * jnp.sum(jnp.asarray(frac) * jnp.mean(probs, axis=0))
    z = jnp.mean(jax.nn.logsumexp(logits, axis=-1) ** 2)
    return y, balance, z


WEIGHT_NAMES = ("router", "gate_proj", "up_proj", "down_proj")


def layer_weights(layer):
    return tuple(getattr(layer, n)[...] for n in WEIGHT_NAMES)


def objective(y, balance, z, cotangent):
    return jnp.sum(y * cotangent) + 0.7 * balance + 0.3 * z


@pytest.mark.parametrize("impl,capacity_factor,renormalize", [
    ("ragged", 0.0, True), ("ragged", 0.75, False), ("blocked", 0.75, True),
    ("dense", 0.0, False),
])
def test_layer_matches_naive_reference(impl, capacity_factor, renormalize):
    cfg = small_cfg(moe_impl=impl, moe_capacity_factor=capacity_factor,
                    moe_renormalize=renormalize)
    layer = make_layer(cfg)
    x = tokens()
    num_tokens = x.shape[0] * x.shape[1]
    capacity = math.ceil(capacity_factor * num_tokens * K / E) if capacity_factor else 0
    cot = jax.random.normal(jax.random.key(7), x.shape, jnp.float32)

    graphdef, state = nnx.split(layer)

    def ours(state, x):
        y, aux = nnx.merge(graphdef, state)(x)
        return objective(y, aux["moe_load_balance_loss"], aux["moe_z_loss"], cot), (y, aux)

    weights = layer_weights(layer)
    logits = np.asarray(x, np.float64).reshape(num_tokens, D) @ np.asarray(weights[0], np.float64)
    choices, keep = reference_routing(logits, K, capacity)

    def theirs(weights, x):
        y, balance, z = reference_moe(x.reshape(num_tokens, D), *weights, choices=choices,
                                      keep=keep, renormalize=renormalize)
        return objective(y.reshape(x.shape), balance, z, cot), (y.reshape(x.shape), balance, z)

    (_, (y, aux)), (g_state, g_x) = jax.jit(
        jax.value_and_grad(ours, argnums=(0, 1), has_aux=True))(state, x)
    with jax.enable_x64(True):  # the reference in float64; the layer above in float32
        (_, (y_ref, balance, z)), (g_weights, g_x_ref) = jax.jit(
            jax.value_and_grad(theirs, argnums=(0, 1), has_aux=True))(weights, x)
        assert y_ref.dtype == jnp.float64
    dropped = 1.0 - keep.mean()
    grads = [g_state[n][...] for n in WEIGHT_NAMES] + [g_x]
    grads_ref = list(g_weights) + [g_x_ref]
    if capacity_factor:
        assert dropped > 0  # the capacity limit really drops something here
    np.testing.assert_allclose(y, y_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(aux["moe_load_balance_loss"], balance, rtol=1e-5)
    np.testing.assert_allclose(aux["moe_z_loss"], z, rtol=1e-5)
    np.testing.assert_allclose(aux["moe_dropped_fraction"], dropped, atol=1e-7)
    for g, g_ref in zip(grads, grads_ref):
        np.testing.assert_allclose(g, g_ref, rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------------- losses by hand

routing_fn = jax.jit(moe_ops.make_routing, static_argnums=(1, 2, 3))


def test_balance_and_z_loss_hand_computed():
    ln3 = math.log(3.0)
    logits = jnp.array([[ln3, 0.0], [ln3, 0.0], [0.0, ln3], [ln3, 0.0]], jnp.float32)
    # probs rows (.75, .25) x3 and (.25, .75); top-1 picks e0, e0, e1, e0.
    # f = (3/4, 1/4), P = (2.5/4, 1.5/4): loss = 2 * (3/4 * 5/8 + 1/4 * 3/8) = 1.125.
    # Every row's logsumexp is ln 4: z-loss = (ln 4)^2.
    routing = routing_fn(logits, 1, True, 0)
    aux = moe_ops.moe_aux(moe_ops.balance_stats(logits, routing), top_k=1)
    np.testing.assert_allclose(aux["moe_load_balance_loss"], 1.125, rtol=1e-6)
    np.testing.assert_allclose(aux["moe_z_loss"], math.log(4.0) ** 2, rtol=1e-6)
    np.testing.assert_allclose(aux["moe_expert_load"], [0.75, 0.25])
    assert float(aux["moe_dropped_fraction"]) == 0.0
    # Capacity factor 1: ceil(1 * 4 * 1 / 2) = 2 slots per expert; e0's third token drops.
    capacity = moe_ops.expert_capacity(4, 1, 2, 1.0)
    assert capacity == 2
    routing = routing_fn(logits, 1, True, capacity)
    assert routing.keep[:, 0].tolist() == [True, True, True, False]
    aux = moe_ops.moe_aux(moe_ops.balance_stats(logits, routing), top_k=1)
    np.testing.assert_allclose(aux["moe_dropped_fraction"], 0.25)
    np.testing.assert_allclose(aux["moe_load_balance_loss"], 1.125, rtol=1e-6)  # pre-drop f


def test_capacity_serves_first_choices_first():
    # Choices (best first): t0 -> (e0, e1), t1 -> (e1, e0), t2 -> (e0, e2); capacity 1.
    # Slot-major: first choices t0:e0 keep, t1:e1 keep, t2:e0 drop; then t0:e1 drop,
    # t1:e0 drop, t2:e2 keep. (Token-major order would have kept t0's second choice.)
    logits = jnp.array([[2.0, 1.0, 0.0], [1.0, 2.0, 0.0], [2.0, 0.0, 1.0]], jnp.float32)
    routing = routing_fn(logits, 2, False, 1)
    assert routing.experts.tolist() == [[0, 1], [1, 0], [0, 2]]
    assert routing.keep.tolist() == [[True, False], [True, False], [False, True]]


# ----------------------------------------------------------------------------- global batch

def test_global_balance_is_the_same_for_any_split():
    logits = 2.0 * jax.random.normal(jax.random.key(3), (64, E), jnp.float32)
    full = moe_ops.moe_aux(moe_ops.balance_stats(
        logits, routing_fn(logits, K, True, 0)), K)
    chunks = [moe_ops.balance_stats(c, routing_fn(c, K, True, 0))
              for c in jnp.split(logits, 4)]
    combined = moe_ops.moe_aux(moe_ops.combine_stats(*chunks), K)
    for name in ("moe_load_balance_loss", "moe_z_loss", "moe_expert_load"):
        np.testing.assert_allclose(combined[name], full[name], rtol=1e-6)
    per_chunk_mean = np.mean([moe_ops.moe_aux(c, K)["moe_load_balance_loss"] for c in chunks])
    assert abs(per_chunk_mean - full["moe_load_balance_loss"]) > 1e-3  # the split matters


def test_layer_balance_loss_is_global_on_a_data_parallel_mesh(data=8):
    layer = make_layer(small_cfg())
    x = tokens((8, 4))
    y_one, aux_one = forward(layer, x)
    mesh = sharding.create_mesh(dict(data=data, fsdp=1, tensor=1, expert=1),
                                devices=jax.devices()[:data])
    with jax.set_mesh(mesh):
        y, aux = forward(layer, x)
    np.testing.assert_allclose(y, y_one, rtol=1e-5, atol=1e-6)
    for name in ("moe_load_balance_loss", "moe_z_loss", "moe_expert_load"):
        np.testing.assert_allclose(aux[name], aux_one[name], rtol=1e-5)
    shard_losses = [forward(layer, part)[1]["moe_load_balance_loss"]
                    for part in jnp.split(x, data)]
    assert abs(np.mean(shard_losses) - aux_one["moe_load_balance_loss"]) > 1e-3


# ----------------------------------------------------------------------------- expert parallel

@pytest.mark.parametrize("mesh_shape,impl", [(dict(expert=8, data=1), "ragged"),
                                             (dict(data=2, fsdp=2, expert=2), "blocked")])
def test_expert_parallel_matches_single_device(mesh_shape, impl, monkeypatch):
    exchanges = []
    all_to_all = moe_parallel.experts_all_to_all
    monkeypatch.setattr(moe_parallel, "experts_all_to_all",
                        lambda *a, **kw: exchanges.append(kw["ep"]) or all_to_all(*a, **kw))
    layer = make_layer(small_cfg(moe_impl=impl))
    x = tokens((8, 4))
    cot = jax.random.normal(jax.random.key(5), x.shape, jnp.float32)

    def loss(model, x):
        y, aux = model(x)
        return objective(y, aux["moe_load_balance_loss"], aux["moe_z_loss"], cot)

    value_and_grad = nnx.jit(nnx.value_and_grad(loss, argnums=(0, 1)))
    value_one, grads_one = value_and_grad(layer, x)
    mesh = sharding.create_mesh(dict(dict(data=1, fsdp=1, tensor=1), **mesh_shape))
    state = nnx.state(layer)
    with jax.set_mesh(mesh):
        layer_sharded = nnx.merge(nnx.graphdef(layer),
                                  jax.device_put(state, sharding.state_shardings(state, mesh)))
        value, grads = value_and_grad(layer_sharded, x)
    assert layer_sharded.gate_proj[...].sharding.spec[0] == "expert"
    assert exchanges and set(exchanges) == {mesh_shape["expert"]}  # the all-to-all path ran
    np.testing.assert_allclose(value, value_one, rtol=1e-5)
    for g, g_one in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_one)):
        # float32 sums in another order: relative to each leaf's scale
        scale = float(np.max(np.abs(g_one)))
        np.testing.assert_allclose(g, g_one, rtol=1e-4, atol=1e-5 * scale)


def test_expert_parallel_capacity_counts_per_device():
    """With capacity, each device's tokens form one group: same as the layer on each group."""
    layer = make_layer(small_cfg(moe_capacity_factor=0.5))
    x = tokens((8, 4))
    mesh = sharding.create_mesh(dict(data=1, fsdp=1, tensor=1, expert=8))
    with jax.set_mesh(mesh):
        y, aux = forward(layer, x)
    groups = [forward(layer, part) for part in jnp.split(x, 8)]  # each device holds one sequence
    np.testing.assert_allclose(y, jnp.concatenate([g[0] for g in groups]), rtol=1e-5, atol=1e-6)
    dropped = np.mean([g[1]["moe_dropped_fraction"] for g in groups])
    assert dropped > 0
    np.testing.assert_allclose(aux["moe_dropped_fraction"], dropped, rtol=1e-6)


# ----------------------------------------------------------------------------- model level

def test_tiny_moe_model_learns_and_reports_expert_load():
    config = base_config("tiny_moe")
    config.model.num_layers = 1
    cfg = model_config(config)
    # Built under jit: one compile instead of one per parameter shape.
    model = nnx.jit(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))()
    optimizer = nnx.jit(lambda m: nnx.Optimizer(m, optax.adamw(1e-2), wrt=nnx.Param))(model)
    # Sequences follow t -> (5 t + 3) mod 64 from random starts: learnable from one token.
    starts = jax.random.randint(jax.random.key(0), (8, 1), 0, 64)
    seq = [starts]
    for _ in range(12):
        seq.append((5 * seq[-1] + 3) % 64)
    batch = jnp.concatenate(seq, axis=1).astype(jnp.int32)

    @nnx.jit
    def step(model, optimizer, batch):
        def loss_fn(model):
            logits, aux = model(batch[:, :-1])
            nll = optax.softmax_cross_entropy_with_integer_labels(logits, batch[:, 1:]).mean()
            total = (nll + config.train.moe_aux_weight * aux["moe_load_balance_loss"]
                     + config.train.moe_z_loss_weight * aux["moe_z_loss"])
            return total, (nll, aux)

        (_, (nll, aux)), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return nll, aux

    losses = []
    for _ in range(25):
        nll, aux = step(model, optimizer, batch)
        losses.append(float(nll))
    assert losses[-1] < 0.3 * losses[0], losses
    load = np.asarray(aux["moe_expert_load"])
    assert load.shape == (cfg.num_experts,)
    np.testing.assert_allclose(load.sum(), cfg.num_layers, rtol=1e-5)  # summed over layers
    assert np.all(load >= 0) and np.isfinite(float(aux["moe_load_balance_loss"]))


@pytest.mark.parametrize("field,value,message", [
    ("moe_impl", "bogus",
     "model.moe_impl='bogus' is not allowed; choose one of auto, ragged, blocked, dense"),
    ("moe_capacity_factor", -1.0, "model.moe_capacity_factor=-1.0 must be >= 0"),
])
def test_bad_moe_fields_are_named_before_building(field, value, message):
    config = base_config("tiny_moe")
    config.model[field] = value
    with pytest.raises(ValueError, match=re.escape(message)):
        model_config(config)


# ----------------------------------------------------------------------------- 15A2B counts

@pytest.mark.parametrize("variant,extra", [("baseline", 0), ("add_4_experts", 4)])
def test_inspect_moe_15a2b_counts(variant, extra):
    V, L, Dm, H, Hkv, d, Ex, k, Fx = 151_936, 24, 2048, 32, 4, 128, 128 + extra, 8 + extra, 768
    attention = Dm * H * d * 2 + Dm * Hkv * d * 2 + 2 * d  # q, o, k, v, q/k norms
    experts = 3 * Ex * Dm * Fx
    per_layer_dense = attention + 2 * Dm + Dm * Ex  # + two block norms + router
    total = L * (per_layer_dense + experts) + 2 * V * Dm + Dm
    active = L * (per_layer_dense + 3 * k * Dm * Fx) + 2 * V * Dm + Dm
    info = ga_inspect.report(model_config(base_config("moe_15a2b", variant)), seq_len=4096)
    assert info["total_params"] == total
    assert info["active_params"] == active
    if extra:  # Table 1 "add 4 experts": 4 x 3 x 2048 x 768 x 24 experts, plus router columns
        assert info["params_added_vs_baseline"] == L * (3 * 4 * Dm * Fx + 4 * Dm)
