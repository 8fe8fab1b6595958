"""The gate is live on every path: perturbing the gate's weights changes the output of the
training forward, the train step, eval, prefill, cached decode, scanned and per-layer models,
remat, the sharded step (8 CPU devices), every attention implementation that runs on CPU
(xla and chunked in the model; the Pallas TPU and GPU kernels in interpret mode), and the model
exported to each Hugging Face layout and imported back. Where a variant has an identity value
(a constant sigmoid gate at +30, whose sigmoid is 1.0 in float32; an additive silu gate at 0),
setting it reproduces the ungated model. A path that dropped the gate would fail here.
Tiny shapes throughout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention import hf, ops
from gated_attention.config import run_config
from gated_attention.hf import safetensors_io
from gated_attention.inference import generation as generate
from gated_attention.model.transformer import build_model, stack_layer_params
from gated_attention.parallel import sharding
from gated_attention.training import optim
from gated_attention.training import step as step_lib

TOKENS = np.array([[5, 9, 2, 30, 11, 7, 40, 3], [1, 60, 8, 8, 21, 4, 17, 33]], np.int32)


def tiny_config(variant: str = "g1_sdpa_elementwise", **model):
    config = run_config.base_config("tiny", variant)
    config.model.update(dict(vocab_size=64, num_layers=2, d_model=32, num_heads=4,
                             num_kv_heads=2, head_dim=8, mlp_dim=40, tied_embeddings=False))
    config.model.update(model)
    config.data.seq_len = TOKENS.shape[1]
    config.train.update(dict(batch_size=8, steps=100))
    config.optimizer.update(dict(warmup_steps=1))
    return config


def _is_gate(path) -> bool:
    names = [str(p) for p in path]
    return "attention" in names and "gate" in names


def perturb_gate(model, scale: float = 0.7, seed: int = 1):
    """A copy of `model` whose attention-gate parameters (and only those) are moved."""
    model = nnx.clone(model)
    rng = np.random.default_rng(seed)
    moved = 0
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if _is_gate(path):
            value = np.asarray(var.get_value())
            var.set_value(jnp.asarray(value + scale * rng.standard_normal(value.shape),
                                      jnp.float32))
            moved += 1
    assert moved, "the model has no gate parameters"
    return model


def assert_live(a, b, what: str) -> None:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    assert np.all(np.isfinite(a)) and np.all(np.isfinite(b)), what
    assert np.abs(a - b).max() > 1e-4, f"{what}: the gate does not reach the output"


# One jitted forward for the module, the graph definition static: models of one structure
# share one compile across calls and tests (a fresh jit per call compiled the baseline twice
# in the identity test and each imported model anew).
_forward = jax.jit(lambda graphdef, state, t: nnx.merge(graphdef, state)(t)[0],
                   static_argnums=0)


def jit_logits(*models, tokens=TOKENS):
    """Logits of models of one structure, through one compiled forward."""
    graphdef = nnx.split(models[0])[0]
    return [_forward(graphdef, nnx.split(m)[1], jnp.asarray(tokens)) for m in models]


def _batch(tokens=TOKENS, rows: int = 2):
    tokens = np.concatenate([tokens] * (rows // tokens.shape[0]), axis=0)
    inputs = tokens[:, :-1]
    return {"inputs": jnp.asarray(inputs), "targets": jnp.asarray(tokens[:, 1:]),
            "mask": jnp.ones(inputs.shape, jnp.float32),
            "positions": jnp.broadcast_to(jnp.arange(inputs.shape[1]), inputs.shape),
            "segment_ids": jnp.ones(inputs.shape, jnp.int32)}


@pytest.mark.parametrize("variant", ["g1_sdpa_elementwise", "g1_sdpa_additive_silu"])
def test_forward_eval_prefill_and_decode(variant):
    """elementwise: the gate fused into the attention kernel; additive silu: applied after it."""
    config = tiny_config(variant)
    model = build_model(run_config.model_config(config), seed=0)
    moved = perturb_gate(model)
    assert_live(*jit_logits(model, moved), "training forward")

    graphdef = nnx.split(model, nnx.Param, ...)[0]
    eval_step = jax.jit(step_lib.make_eval_step(graphdef))
    evals = [eval_step(nnx.state(m, nnx.Param), _batch())["nll_sum"] for m in (model, moved)]
    assert_live(*evals, "eval step")

    decoder = generate.Decoder(model, batch=2, max_len=12)  # one compiled step, two states
    tokens, positions = generate.left_pad([[5, 9, 2], [1, 60, 8]])
    outs = []
    for m in (model, moved):
        decoder.state = nnx.split(m)[1]
        prefill, caches = decoder.prefill(jnp.asarray(tokens), jnp.asarray(positions))
        step, _ = decoder.step(caches, jnp.asarray([7, 7]), jnp.asarray([3, 3]))
        outs.append((prefill, step))
    assert_live(outs[0][0], outs[1][0], "prefill")
    assert_live(outs[0][1], outs[1][1], "cached decode step")


def test_train_step_with_remat_reaches_the_gate():
    config = tiny_config(remat="full")
    model = build_model(run_config.model_config(config), seed=0)
    graphdef = nnx.split(model, nnx.Param)[0]
    tx = optim.make_optimizer(config.optimizer, config.train.steps)
    step = jax.jit(step_lib.make_train_step(graphdef, config, tx))
    losses, gate_moves = [], []
    for m in (model, perturb_gate(model)):
        params = nnx.state(m, nnx.Param)
        before = {path: np.asarray(var.get_value())
                  for path, var in nnx.to_flat_state(params) if _is_gate(path)}
        state = {"params": params, "opt_state": tx.init(params),
                 "step": jnp.zeros((), jnp.int32)}
        state, metrics = step(state, _batch())
        losses.append(metrics["loss"])
        state, _ = step(state, _batch())  # the schedule's first update has lr 0
        gate_moves.append(max(np.abs(np.asarray(var.get_value()) - before[path]).max()
                              for path, var in nnx.to_flat_state(state["params"])
                              if path in before))
    assert_live(*losses, "train step loss (remat=full)")
    assert min(gate_moves) > 0, "the update leaves the gate where it was"


def test_scanned_and_per_layer_models():
    config = tiny_config()
    cfg = run_config.model_config(config)
    per_layer = build_model(cfg, seed=0)
    scanned_cfg = cfg.replace(scan_layers=True)
    results = []
    for m in (per_layer, perturb_gate(per_layer)):
        scanned = nnx.eval_shape(lambda: build_model(scanned_cfg))
        graphdef, _, rest = nnx.split(scanned, nnx.Param, ...)
        stacked = stack_layer_params(nnx.state(m, nnx.Param), cfg)
        results.append(jit_logits(m) + jit_logits(nnx.merge(graphdef, stacked, rest)))
    np.testing.assert_allclose(np.asarray(results[0][1]), np.asarray(results[0][0]), atol=1e-5)
    assert_live(results[0][0], results[1][0], "per-layer model")
    assert_live(results[0][1], results[1][1], "scanned model")


@pytest.mark.parametrize("impl", ["xla", "chunked"])
def test_every_attention_implementation_in_the_model(impl):
    for variant in ("g1_sdpa_elementwise", "g1_sdpa_headwise"):
        config = tiny_config(variant, attention_impl=impl)
        model = build_model(run_config.model_config(config), seed=0)
        assert_live(*jit_logits(model, perturb_gate(model)), f"{impl}, {variant}")


def _kernel_inputs(headwise: bool):
    rng = np.random.default_rng(0)
    q = jnp.asarray(rng.standard_normal((1, 16, 2, 8)), jnp.float32)
    k = jnp.asarray(rng.standard_normal((1, 16, 1, 8)), jnp.float32)
    v = jnp.asarray(rng.standard_normal((1, 16, 1, 8)), jnp.float32)
    gate = jnp.asarray(rng.standard_normal((1, 16, 2) if headwise else (1, 16, 2, 8)),
                       jnp.float32)
    return q, k, v, gate


@pytest.mark.parametrize("impl", ["xla", "chunked",
                                  pytest.param("pallas_tpu", marks=pytest.mark.slow),
                                  pytest.param("pallas_gpu", marks=pytest.mark.slow)])
def test_every_attention_kernel_applies_the_fused_gate(impl):
    """The kernels as the model calls them (pallas in interpret mode; ~10 s each idle)."""
    from jax.experimental.pallas import tpu as pltpu

    def run(q, k, v, gate):
        kwargs = dict(impl=impl, gate=gate)
        if impl in ("pallas_tpu", "pallas_gpu"):
            kwargs.update(interpret=True, block_sizes={"block_q": 16, "block_kv": 16})
        if impl == "pallas_tpu":
            with pltpu.force_tpu_interpret_mode():
                return ops.attention(q, k, v, **kwargs)
        return ops.attention(q, k, v, **kwargs)

    for headwise in ((False, True) if impl in ("xla", "chunked") else (False,)):
        q, k, v, gate = _kernel_inputs(headwise)
        gated = run(q, k, v, gate)
        assert_live(gated, run(q, k, v, gate + 0.7), f"{impl} kernel, headwise={headwise}")
        ungated = ops.attention(q, k, v, impl="xla")
        # identity: sigmoid(30) is 1.0 in float32, so the gated kernel is the plain one
        np.testing.assert_allclose(np.asarray(run(q, k, v, jnp.full_like(gate, 30.0))),
                                   np.asarray(ungated), atol=2e-6)
        assert np.abs(np.asarray(gated) - np.asarray(ungated)).max() > 1e-3


@pytest.mark.slow  # compiles an 8-device step: ~10 s idle
def test_the_sharded_train_step_on_eight_devices():
    devices = jax.devices()
    assert len(devices) >= 8, "the suite runs with 8 fake CPU devices"
    config = tiny_config()
    config.mesh.update(dict(data=2, fsdp=2, tensor=2))
    mesh = sharding.create_mesh(config.mesh, devices[:8])
    graphdef, state, shardings = step_lib.create_train_state(config, mesh)
    step = step_lib.jit_train_step(step_lib.make_train_step(graphdef, config), mesh, shardings)
    fresh = lambda x: jax.device_put(jnp.copy(x), x.sharding)  # noqa: E731 - steps donate
    moved_params = []
    for path, var in nnx.to_flat_state(jax.tree.map(fresh, state["params"])):
        value = var.get_value()
        if _is_gate(path):
            value = jax.device_put(value + 0.7, value.sharding)
        moved_params.append((path, var.replace(value)))
    moved = {"params": nnx.from_flat_state(moved_params),
             "opt_state": jax.tree.map(fresh, state["opt_state"]), "step": fresh(state["step"])}
    _, metrics_moved = step(moved, _batch(rows=8))
    _, metrics = step(state, _batch(rows=8))
    assert_live(metrics["loss"], metrics_moved["loss"], "sharded train step")


@pytest.mark.parametrize("variant,layout", [("g1_sdpa_elementwise", "official"),
                                            ("g1_sdpa_headwise", "official"),
                                            ("g1_sdpa_elementwise", "qwen3_next"),
                                            ("g1_sdpa_headwise", "qwen3_5")])
def test_exported_then_imported_model(tmp_path, variant, layout):
    config = tiny_config(variant)
    model = build_model(run_config.model_config(config), seed=0)
    outs = []
    for name, m in (("a", model), ("b", perturb_gate(model))):
        hf.save_pretrained(m, config, tmp_path / name, layout=layout)
        imported, _ = hf.load_pretrained(tmp_path / name)
        gate = imported.layers[0].attention.gate.kernel[...]
        assert gate.shape[:2] == (32, 4)  # the gate is its own tensor, not rows of q_proj
        assert imported.layers[0].attention.q_proj[...].shape == (32, 4, 8)
        outs.append(jit_logits(imported)[0])
    assert_live(*outs, f"exported to {layout} and imported")
    a = safetensors_io.read_tensors(tmp_path / "a")["model.layers.0.self_attn.q_proj.weight"]
    b = safetensors_io.read_tensors(tmp_path / "b")["model.layers.0.self_attn.q_proj.weight"]
    assert not np.array_equal(a, b)  # the gate rows are written


def _copy_without_gate(gated, config_ungated):
    params = {k: v for k, v in hf.flat_params(gated).items() if ".attention.gate." not in k}
    return hf.model_from_params(run_config.model_config(config_ungated), params)


@pytest.mark.parametrize("variant,identity", [("g1_input_independent", 30.0),
                                              ("g1_sdpa_additive_silu", 0.0)])
def test_the_identity_gate_reproduces_the_ungated_model(variant, identity):
    gated = build_model(run_config.model_config(tiny_config(variant)), seed=0)
    for path, var in nnx.to_flat_state(nnx.state(gated, nnx.Param)):
        if _is_gate(path):
            var.set_value(jnp.full(var.get_value().shape, identity, jnp.float32))
    baseline = _copy_without_gate(gated, tiny_config("baseline"))
    np.testing.assert_allclose(np.asarray(jit_logits(gated)[0]),
                               np.asarray(jit_logits(baseline)[0]), atol=1e-6, rtol=0)
    off = perturb_gate(gated, scale=30.0)  # far from the identity value
    assert_live(jit_logits(off)[0], jit_logits(baseline)[0], f"{variant} off its identity")
