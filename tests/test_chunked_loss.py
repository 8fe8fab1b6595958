"""The chunked cross-entropies against a float64 numpy reference: vocabulary tiles
(losses.chunked_cross_entropy) and token tiles (losses.token_tiled_cross_entropy, its
gradient computed in the forward pass): values and gradients with z-loss and masked
positions, a vocabulary or sequence the tile does not divide (the clamped last tile), the
token tiles' primal (eval) path without gradient matmuls, and the train loss of a tiny model
through each path; logits stored in bfloat16 (train.logits_dtype=compute) against the
float64 loss of the rounded logits."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config import archs, run_config
from gated_attention.model.transformer import Transformer
from gated_attention.training import losses
from gated_attention.training import step as step_lib


def numpy_loss_and_grads(x, table, targets, mask, z_loss):
    """Loss, d loss/dx, d loss/dtable of mean masked nll + z_loss * mean lse^2, float64."""
    x, table = np.asarray(x, np.float64), np.asarray(table, np.float64)
    logits = x @ table.T
    top = logits.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    p = np.exp(logits - lse[..., None])
    w = np.asarray(mask, np.float64)
    denom = max(w.sum(), 1.0)
    target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    loss = ((lse - target_logit) * w).sum() / denom + z_loss * (lse ** 2 * w).sum() / denom
    onehot = np.eye(table.shape[0])[targets]
    dlogits = (w / denom)[..., None] * (p - onehot + z_loss * 2 * lse[..., None] * p)
    return loss, dlogits @ table, np.einsum("bsv,bsd->vd", dlogits, x)


def problem(seed=0, b=2, s=8, d=16, vocab=37):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(b, s, d))
    table = rng.normal(size=(vocab, d)) * 0.5
    targets = rng.integers(0, vocab, size=(b, s))
    mask = rng.random((b, s)) > 0.3
    return x, table, targets, mask


# The two tilings (train.loss_tiles): vocabulary tiles recompute the logits in the backward,
# token tiles compute the gradient in the forward.
TILED = {"vocab": losses.chunked_cross_entropy, "tokens": losses.token_tiled_cross_entropy}


@pytest.mark.parametrize("tiles, chunk", [("vocab", 8), ("vocab", 37), ("vocab", 64),
                                          ("vocab", 1), ("tokens", 3), ("tokens", 5),
                                          ("tokens", 8), ("tokens", 64), ("tokens", 1)])
def test_values_and_gradients_match_a_float64_reference(tiles, chunk):
    """Vocabulary 37 and sequence 8: tiles of 8, 3 and 5 leave a clamped last tile; 37, 64
    and 8 (tokens) are one tile."""
    x, table, targets, mask = problem()
    want_loss, want_dx, want_dtable = numpy_loss_and_grads(x, table, targets, mask, 0.01)

    def loss(x, table):
        return TILED[tiles](x, table, jnp.asarray(targets), jnp.asarray(mask), z_loss=0.01,
                            chunk_size=chunk)[0]

    with jax.enable_x64(True):  # float64 through the chunked code: agreement to rounding
        value, (dx, dtable) = jax.value_and_grad(loss, argnums=(0, 1))(
            jnp.asarray(x, jnp.float64), jnp.asarray(table, jnp.float64))
        np.testing.assert_allclose(value, want_loss, rtol=1e-12)
        np.testing.assert_allclose(dx, want_dx, rtol=1e-10, atol=1e-14)
        np.testing.assert_allclose(dtable, want_dtable, rtol=1e-10, atol=1e-14)
        # the primal path (no gradient asked for) gives the same value
        np.testing.assert_allclose(loss(jnp.asarray(x, jnp.float64),
                                        jnp.asarray(table, jnp.float64)), want_loss, rtol=1e-12)
    # float32, as training runs it
    value, (dx, dtable) = jax.value_and_grad(loss, argnums=(0, 1))(
        jnp.asarray(x, jnp.float32), jnp.asarray(table, jnp.float32))
    np.testing.assert_allclose(value, want_loss, rtol=1e-5)
    np.testing.assert_allclose(dx, want_dx, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(dtable, want_dtable, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("tiles, chunk", [("vocab", 10), ("tokens", 4)])
def test_reported_parts_match_the_plain_loss(tiles, chunk):
    x, table, targets, mask = problem(seed=1, s=11)
    x, table = jnp.asarray(x, jnp.float32), jnp.asarray(table, jnp.float32)
    targets, mask = jnp.asarray(targets), jnp.asarray(mask)
    logits = jnp.einsum("bsd,vd->bsv", x, table)
    plain_loss, plain = losses.cross_entropy(logits, targets, mask, z_loss=0.1)
    tiled_loss, tiled = TILED[tiles](x, table, targets, mask, z_loss=0.1, chunk_size=chunk)
    np.testing.assert_allclose(tiled_loss, plain_loss, rtol=1e-6)
    for name in ("nll", "z_loss", "tokens"):
        np.testing.assert_allclose(tiled[name], plain[name], rtol=1e-6)


@pytest.mark.parametrize("tiles, chunk, seq", [("vocab", 128, 8), ("tokens", 16, 40)])
def test_bfloat16_gradients_stay_close_to_float64(tiles, chunk, seq):
    """bf16 hidden states and table (the paper's compute dtype): the table's gradient is
    rounded once per tile, as the plain loss rounds it once."""
    x, table, targets, mask = problem(seed=2, vocab=300, d=32, s=seq)
    _, want_dx, want_dtable = numpy_loss_and_grads(x, table, targets, mask, 0.0)
    dx, dtable = jax.grad(lambda x, t: TILED[tiles](
        x, t, jnp.asarray(targets), jnp.asarray(mask), chunk_size=chunk)[0], argnums=(0, 1))(
        jnp.asarray(x, jnp.bfloat16), jnp.asarray(table, jnp.bfloat16))
    assert dx.dtype == jnp.bfloat16 and dtable.dtype == jnp.bfloat16
    scale = np.abs(want_dtable).max()
    assert np.abs(np.asarray(dtable, np.float64) - want_dtable).max() < 0.02 * scale
    assert np.abs(np.asarray(dx, np.float64) - want_dx).max() < 0.02 * np.abs(want_dx).max()


def test_token_tiles_reported_parts_carry_no_gradient():
    """Only the returned loss is differentiable; nll and z_loss are reports."""
    x, table, targets, mask = (jnp.asarray(a) for a in problem(seed=3))
    dx = jax.grad(lambda x: losses.token_tiled_cross_entropy(
        x, table, targets, mask, z_loss=0.1, chunk_size=3)[1]["nll"])(x)
    assert not np.any(dx)


def count_dots(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("dot_general")


def test_token_tiles_primal_path_computes_no_gradients():
    """Evaluated without a gradient, a tile is one logits matmul; with one, the forward adds
    the two gradient matmuls (dx, dtable) and the backward none (no recomputed logits)."""
    x, table, targets, mask = (jnp.asarray(a, jnp.float32) if a.dtype.kind == "f"
                               else jnp.asarray(a) for a in problem(seed=4))

    def loss(x, table):
        return losses.token_tiled_cross_entropy(x, table, targets, mask, z_loss=0.01,
                                                chunk_size=3)[0]

    assert count_dots(loss, x, table) == 1
    assert count_dots(jax.grad(loss, argnums=(0, 1)), x, table) == 3


def tiny_config(**train_fields):
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.num_layers = 2
    config.model.vocab_size = 300  # not a multiple of the tile: the clamped last tile
    config.train.z_loss = 1e-3
    config.train.update(train_fields)
    return config


@functools.cache
def tiny_model():
    """tiny_config's model, split (graphdef, state); the loss settings leave it unchanged.
    Initialised once for the file: op by op, an initialisation costs a few CPU-s."""
    return nnx.split(Transformer(run_config.model_config(tiny_config()), rngs=nnx.Rngs(params=0)))


def _train_loss_and_gradients(tiles: str, chunk_size: int):
    """(loss, info, grads) of the tiny model's train loss (tied embedding) with the loss on
    `tiles` of `chunk_size` (0: the plain loss), the value and gradient jitted as the train
    step jits them (run op by op they took 20 of this file's 50 CPU-s); its primal (eval)
    path checked against them."""
    config = tiny_config()
    graphdef, params = tiny_model()
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, 300, size=(2, 32)))
    batch = {"inputs": tokens, "targets": jnp.roll(tokens, -1, axis=1),
             "mask": jnp.asarray(rng.random((2, 32)) > 0.2)}
    with config.unlocked():
        config.train.update(loss_chunk_size=chunk_size, loss_tiles=tiles)
    run_config.validate_run_config(config)
    loss_fn = step_lib.make_loss_fn(graphdef, config)
    (loss, info), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch)
    eval_loss, eval_info = jax.jit(loss_fn)(params, batch)  # the primal path
    np.testing.assert_allclose(eval_loss, loss, rtol=1e-6)
    np.testing.assert_allclose(eval_info["nll"], info["nll"], rtol=1e-6)
    return loss, info, grads


# The plain loss (loss_chunk_size 0) ignores train.loss_tiles: computed once for the three
# cases below.
_plain_train_loss_and_gradients = functools.cache(
    lambda: _train_loss_and_gradients("vocab", 0))


@pytest.mark.parametrize("tiles, chunk", [("vocab", 128), ("tokens", 12), ("tokens", 32)])
def test_train_loss_and_gradients_match_the_plain_loss(tiles, chunk):
    """Through the model (tied embedding): the loss step.py takes, either path (sequence 32:
    token tiles of 12 positions leave a clamped last tile)."""
    plain, plain_info, plain_grads = _plain_train_loss_and_gradients()
    chunked, chunked_info, chunked_grads = _train_loss_and_gradients(tiles, chunk)
    np.testing.assert_allclose(chunked, plain, rtol=1e-5)
    for name in ("nll", "z_loss", "tokens"):
        np.testing.assert_allclose(chunked_info[name], plain_info[name], rtol=1e-5)
    for a, b in zip(jax.tree.leaves(plain_grads), jax.tree.leaves(chunked_grads)):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-6)


def test_a_config_saved_without_loss_tiles_tiles_the_vocabulary(monkeypatch):
    """Configs written before train.loss_tiles existed load and keep their meaning."""
    config = tiny_config(loss_chunk_size=128)
    with config.unlocked():
        del config.train["loss_tiles"]
    run_config.validate_run_config(config)
    called = []
    monkeypatch.setattr(losses, "chunked_cross_entropy",
                        lambda *args: called.append(args) or (jnp.zeros(()), {}))
    assert run_config.model_config(config) == run_config.model_config(tiny_config())
    graphdef, params = tiny_model()
    tokens = jnp.zeros((1, 8), jnp.int32)
    # Traced, as the jitted train step traces it: the loss is picked while tracing (run op by
    # op, the model's forward took 5.5 of this file's 52 CPU-s).
    jax.eval_shape(step_lib.make_loss_fn(graphdef, config), params,
                   {"inputs": tokens, "targets": tokens, "mask": tokens == 0})
    assert len(called) == 1 and called[0][5] == 128  # (x, table, targets, mask, z, chunk, ..)


@pytest.mark.parametrize("bad", ["sequence", "", None])
def test_bad_loss_tiles_are_refused_naming_the_field(bad):
    config = tiny_config(loss_tiles=bad)
    with pytest.raises(run_config.ConfigError,
                       match=r"^train.loss_tiles=.* is not allowed; choose one of vocab, tokens$"):
        run_config.validate_run_config(config)


@pytest.mark.parametrize("bad", [-1, -8192])
def test_bad_chunk_sizes_are_refused_naming_the_field(bad):
    config = tiny_config()
    config.train.loss_chunk_size = bad
    with pytest.raises(run_config.ConfigError, match=r"train.loss_chunk_size=.* must be an "
                       r"integer >= 0"):
        run_config.validate_run_config(config)


def test_paper_recipes_chunk_the_loss():
    for arch in ("dense_1p7b_28l", "dense_1p7b_48l", "moe_15a2b"):
        train_section = run_config.base_config(arch).train
        assert train_section.loss_chunk_size == archs.PAPER_LOSS_CHUNK
        assert train_section.loss_tiles == archs.PAPER_LOSS_TILES == "vocab"
    assert run_config.base_config("tiny").train.loss_chunk_size == 0
    assert run_config.base_config("tiny").train.loss_tiles == "vocab"


def numpy_rounded_logits_loss(x, table, targets, mask):
    """The float64 reference's loss and gradients with the logits rounded to bfloat16 once
    (ml_dtypes' rounding of the float64 product): what a matmul that accumulates in float32
    and writes bfloat16 feeds the softmax."""
    import ml_dtypes

    x, table = np.asarray(x, np.float64), np.asarray(table, np.float64)
    logits = (x @ table.T).astype(ml_dtypes.bfloat16).astype(np.float64)
    top = logits.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(logits - top).sum(-1, keepdims=True)))[..., 0]
    w = np.asarray(mask, np.float64)
    denom = max(w.sum(), 1.0)
    target_logit = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    dlogits = (w / denom)[..., None] * (np.exp(logits - lse[..., None])
                                        - np.eye(table.shape[0])[targets])
    return ((lse - target_logit) * w).sum() / denom, dlogits @ table, np.einsum(
        "bsv,bsd->vd", dlogits, x)


BF16_LOSSES = {
    "plain": lambda x, t, y, m, chunk: losses.cross_entropy(
        losses.logits_matmul(x, t, jnp.bfloat16), y, m)[0],  # widened inside
    **{tiles: lambda x, t, y, m, chunk, f=f: f(x, t, y, m, chunk_size=chunk,
                                                logits_dtype=jnp.bfloat16)[0]
       for tiles, f in TILED.items()},
}


@pytest.mark.parametrize("path, chunk", [("plain", 0), ("vocab", 64), ("tokens", 5)])
def test_bfloat16_stored_logits_match_the_float64_loss_of_rounded_logits(path, chunk):
    """Logits written in bfloat16 and read back in float32 (each path): loss and gradients
    are those of the rounded logits in float64; the float32 logits' loss is not (the
    control: the rounding is there, and the tolerance sees it)."""
    x, table, targets, mask = problem(seed=3, s=16, d=32, vocab=300)
    x, table = x * 2.0, table * 2.0  # logits of a few units: a bfloat16 step of 1/64 or more
    want, want_dx, want_dtable = numpy_rounded_logits_loss(x, table, targets, mask)
    exact = numpy_loss_and_grads(x, table, targets, mask, 0.0)[0]
    value, (dx, dtable) = jax.value_and_grad(
        lambda x, t: BF16_LOSSES[path](x, t, jnp.asarray(targets), jnp.asarray(mask), chunk),
        argnums=(0, 1))(jnp.asarray(x, jnp.float32), jnp.asarray(table, jnp.float32))
    assert abs(exact - want) > 20 * 1e-6 * abs(want)  # the control
    np.testing.assert_allclose(value, want, rtol=1e-6)
    if path == "plain":  # autodiff runs the matmul's backward in its output dtype: the
        for got, ref in ((dx, want_dx), (dtable, want_dtable)):  # logit gradient in bfloat16
            assert np.abs(np.asarray(got, np.float64) - ref).max() < 0.02 * np.abs(ref).max()
        return
    np.testing.assert_allclose(dx, want_dx, rtol=1e-3, atol=1e-5)  # the tiles: in float32
    np.testing.assert_allclose(dtable, want_dtable, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("tiles, chunk", [("vocab", 0), ("vocab", 100), ("tokens", 12)])
def test_train_logits_dtype_compute_writes_the_logits_in_bfloat16(tiles, chunk):
    """train.logits_dtype=compute with model.dtype=bfloat16: the lowered train loss's logits
    matmul writes bfloat16 (float32 without it: the control); the eval loss keeps float32."""
    _, params = tiny_model()  # float32 parameters whatever the compute dtype

    def logits_outputs(logits_dtype):
        config = tiny_config(loss_chunk_size=chunk, loss_tiles=tiles, logits_dtype=logits_dtype)
        config.model.dtype = "bfloat16"
        run_config.validate_run_config(config)
        bf16_graphdef = nnx.split(nnx.eval_shape(lambda: Transformer(
            run_config.model_config(config), rngs=nnx.Rngs(params=0))))[0]
        tokens = jnp.zeros((2, 32), jnp.int32)
        text = jax.jit(jax.grad(lambda p: step_lib.make_loss_fn(bf16_graphdef, config)(p, {
            "inputs": tokens, "targets": tokens, "mask": tokens == 0})[0])).lower(
            params).as_text()
        shape = {"plain": "2x32x300", "tokens": f"2x{chunk}x300", "vocab": f"2x32x{chunk}"}[
            tiles if chunk else "plain"]  # a tile's logits (d_model is 128)
        return re.findall(rf"stablehlo.dot_general.*-> tensor<{shape}x(\w+)>", text)

    assert set(logits_outputs("compute")) == {"bf16"}
    assert set(logits_outputs("float32")) == {"f32"}


def test_bad_logits_dtypes_are_refused_naming_the_field():
    with pytest.raises(run_config.ConfigError, match=r"^train.logits_dtype='bfloat16' is not "
                       r"allowed; choose one of float32, compute$"):
        run_config.validate_run_config(tiny_config(logits_dtype="bfloat16"))
