"""Meshes, logical rules and sharded training on 8 fake CPU devices.

The sharded loss and gradients are checked against the same model jitted on one device, the
parameter layouts against hand-written PartitionSpecs, and a checkpoint saved on one mesh
against its restored copy on two others.
"""

import dataclasses
import importlib.util
import math
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gated_attention.parallel import sharding
from gated_attention.training import checkpoint, losses
from gated_attention.training import step as step_lib

_spec = importlib.util.spec_from_file_location(
    "multiprocess_worker", Path(__file__).with_name("multiprocess_worker.py"))
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)

MESHES = [(8, 1, 1), (2, 4, 1), (2, 2, 2), (1, 1, 8)]  # (data, fsdp, tensor)


def mesh_dict(shape):
    return dict(zip(("data", "fsdp", "tensor"), shape))


# ----------------------------------------------------------------------------- mesh and rules

def test_mesh_shape_fills_one_axis_and_rejects_bad_sizes():
    assert sharding.mesh_shape({"data": -1, "fsdp": 2}, 8) == (4, 2, 1, 1)
    assert sharding.mesh_shape({"data": 1, "fsdp": 4, "tensor": 2}, 8) == (1, 4, 2, 1)
    with pytest.raises(ValueError, match="mesh.pipeline is not a mesh setting"):
        sharding.mesh_shape({"pipeline": 2}, 8)
    with pytest.raises(ValueError, match="at most one axis may be -1"):
        sharding.mesh_shape({"data": -1, "fsdp": -1}, 8)
    with pytest.raises(ValueError, match="needs 6 devices per slice; 8 are available"):
        sharding.mesh_shape({"data": 3, "fsdp": 2}, 8)
    with pytest.raises(ValueError, match="do not split into 3 slices"):
        sharding.mesh_shape({"data": -1, "dcn_data": 3}, 8)


@dataclasses.dataclass(frozen=True)
class FakeTpu:
    id: int
    slice_index: int
    process_index: int
    platform: str = "cpu"
    device_kind: str = "fake"


def test_hybrid_mesh_puts_only_dcn_axes_across_slices():
    devices = [FakeTpu(i, slice_index=i // 4, process_index=i // 2) for i in range(8)]
    config = {"data": 1, "fsdp": 2, "tensor": 2, "dcn_data": 2}
    grid = sharding.device_grid(config, devices)
    assert grid.shape == (2, 2, 2, 1)
    assert sharding.full_mesh_shape(config, 8) == {"data": 2, "fsdp": 2, "tensor": 2,
                                                   "expert": 1}
    for data_index in range(2):  # each data row is one whole slice: fsdp/tensor stay on ICI
        assert {d.slice_index for d in grid[data_index].ravel()} == {data_index}


def test_rule_overrides_from_config():
    rules = dict(sharding.rules_from_config({"rules": "vocab=,mlp=fsdp+tensor"}))
    assert rules["vocab"] is None and rules["mlp"] == ("fsdp", "tensor")
    assert rules["heads"] == "tensor"  # untouched rules stay
    with pytest.raises(ValueError, match="'mlpp' is not a logical axis name"):
        sharding.rules_from_config({"rules": "mlpp=tensor"})
    with pytest.raises(ValueError, match="mlp='model' is not a mesh axis"):
        sharding.rules_from_config({"rules": "mlp=model"})
    with pytest.raises(ValueError, match="must look like name=axis"):
        sharding.rules_from_config({"rules": "mlp"})


def test_constrain_is_a_noop_without_mesh_and_pins_layout_under_one():
    x = np.ones((8, 4, 16), np.float32)
    fn = jax.jit(lambda a: sharding.constrain(a * 2, ("batch", "length", "embed")))
    assert not isinstance(fn(x).sharding, NamedSharding)
    mesh = sharding.create_mesh(mesh_dict((2, 2, 2)))
    with jax.set_mesh(mesh):
        out = fn(x)
    assert out.sharding.is_equivalent_to(NamedSharding(mesh, P(("data", "fsdp"))), 3)
    with jax.set_mesh(mesh):  # batch 2 does not divide over data x fsdp = 4: replicated
        small = fn(x[:2])
    assert small.sharding.is_equivalent_to(NamedSharding(mesh, P()), 3)
    per_device = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=P("data"), out_specs=P("data")))
    with jax.set_mesh(mesh):  # inside shard_map the layout is manual: constrain stays out
        np.testing.assert_array_equal(per_device(x), 2 * x)


# ----------------------------------------------------------------------------- parameters

def abstract_params(mesh_shape):
    config = worker.tiny_config(mesh_dict(mesh_shape))
    mesh = sharding.create_mesh(config.mesh)
    spec = step_lib.train_state_spec(config, mesh)
    return spec.abstract, spec.shardings


def leaf(tree, path):
    for key in path:
        tree = tree[key]
    return tree


def test_parameter_shardings_follow_the_rules():
    _, sh = abstract_params((2, 2, 2))
    attention = ("params", "layers", 0, "attention")
    assert leaf(sh, attention + ("q_proj",)).spec == P("fsdp", "tensor", None)
    assert leaf(sh, attention + ("k_proj",)).spec == P("fsdp", "tensor", None)
    assert leaf(sh, attention + ("o_proj",)).spec == P("tensor", None, "fsdp")
    assert leaf(sh, attention + ("gate", "kernel")).spec == P("fsdp", "tensor", None)
    assert leaf(sh, ("params", "layers", 0, "ffn", "down_proj")).spec == P("tensor", "fsdp")
    assert leaf(sh, ("params", "embed")).spec == P("tensor", "fsdp")
    # AdamW moments shard like their parameter: each parameter's two moments (mu and nu, the
    # optimizer-state leaves whose path ends in the parameter's path) have its spec.
    param_specs = {jax.tree_util.keystr(path): s.spec
                   for path, s in jax.tree_util.tree_leaves_with_path(sh["params"])}
    moments = {name: [] for name in param_specs}
    for path, s in jax.tree_util.tree_leaves_with_path(sh["opt_state"]):
        text = jax.tree_util.keystr(path)
        owners = [name for name in param_specs if text.endswith(name)]
        if owners:
            moments[max(owners, key=len)].append(s.spec)
    assert {name: specs for name, specs in moments.items()} == {
        name: [spec, spec] for name, spec in param_specs.items()}
    _, sh8 = abstract_params((1, 1, 8))
    assert leaf(sh8, attention + ("q_proj",)).spec == P("fsdp", "tensor", None)  # 8 heads / 8
    assert leaf(sh8, attention + ("k_proj",)).spec == P("fsdp", None, None)  # 4 kv heads: whole


def per_device_param_bytes(mesh_shape):
    abstract, sh = abstract_params(mesh_shape)
    total = per_device = 0
    for var, s in zip(jax.tree.leaves(abstract["params"]), jax.tree.leaves(sh["params"])):
        total += math.prod(var.shape) * var.dtype.itemsize
        per_device += math.prod(s.shard_shape(var.shape)) * var.dtype.itemsize
    return total, per_device


@pytest.mark.parametrize("mesh_shape", [(1, 8, 1), (1, 4, 2), (2, 2, 2)])
def test_per_device_parameter_bytes_shrink_by_fsdp_times_tensor(mesh_shape):
    total, per_device = per_device_param_bytes(mesh_shape)
    factor = mesh_shape[1] * mesh_shape[2]
    # Norm scales and (at tensor=8) the 4 kv heads are kept whole: under 3% of the bytes.
    assert total / factor <= per_device <= 1.03 * total / factor


# ----------------------------------------------------------------------------- equivalence

def loss_and_grads_fn(graphdef):
    def loss_fn(params, batch):
        logits, _ = nnx.merge(graphdef, params)(
            batch["inputs"], positions=batch["positions"], segment_ids=batch["segment_ids"])
        return losses.cross_entropy(logits, batch["targets"], batch["mask"])[0]

    return jax.value_and_grad(loss_fn)


@pytest.fixture(scope="module")
def single_device_reference():
    config = worker.tiny_config({"data": 1})
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    spec = step_lib.train_state_spec(config, mesh)
    params = jax.device_get(worker.host_init(spec)["params"])
    batch = worker.synthetic_batch(0)
    fn = jax.jit(loss_and_grads_fn(spec.graphdef), compiler_options=worker.FAST_COMPILE)
    loss, grads = jax.device_get(fn(params, batch))
    return params, batch, loss, grads


@pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda s: "x".join(map(str, s)))
def test_sharded_loss_and_grads_equal_single_device(mesh_shape, single_device_reference):
    params, batch, ref_loss, ref_grads = single_device_reference
    config = worker.tiny_config(mesh_dict(mesh_shape))
    mesh = sharding.create_mesh(config.mesh)
    spec = step_lib.train_state_spec(config, mesh)
    param_sh = spec.shardings["params"]
    batch_sh = sharding.batch_sharding(mesh)
    fn = jax.jit(loss_and_grads_fn(spec.graphdef), in_shardings=(param_sh, batch_sh),
                 out_shardings=(None, param_sh), compiler_options=worker.FAST_COMPILE)
    with jax.set_mesh(mesh):
        loss, grads = fn(jax.device_put(params, param_sh), jax.device_put(batch, batch_sh))
    q_grad = grads["layers"][0]["attention"]["q_proj"][...]
    assert q_grad.sharding.spec == leaf(param_sh, ("layers", 0, "attention", "q_proj")).spec
    np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
    got = jax.tree.leaves(jax.device_get(grads))
    want = jax.tree.leaves(ref_grads)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        scale = np.max(np.abs(w))
        assert scale > 0
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * scale)


# ----------------------------------------------------------------------------- checkpoints

@pytest.mark.slow
def test_checkpoint_saved_on_one_mesh_restores_on_others(tmp_path):
    config = worker.tiny_config(mesh_dict((2, 4, 1)))
    _, state, _, _ = worker.train_steps(config, 2)
    saved = jax.device_get(state)
    ckpt = checkpoint.Checkpointer(tmp_path, keep=1, async_save=False)
    ckpt.save(2, state, None)
    ckpt.wait()
    expected, _, _, _ = worker.train_steps(config, 2, state=state, first_step=2)
    for shape in [(8, 1, 1), (1, 2, 4)]:
        other = worker.tiny_config(mesh_dict(shape))
        mesh = sharding.create_mesh(other.mesh)
        spec = step_lib.train_state_spec(other, mesh)
        target = checkpoint.abstract_with_shardings(spec.abstract, spec.shardings)
        restored = ckpt.restore(2, target, None)
        q = restored["params"]["layers"][0]["attention"]["q_proj"][...]
        assert q.sharding == leaf(spec.shardings, ("params", "layers", 0, "attention", "q_proj"))
        assert q.sharding.mesh.shape == mesh.shape
        for a, b in zip(jax.tree.leaves(jax.device_get(restored)), jax.tree.leaves(saved)):
            np.testing.assert_array_equal(a, b)
        got, _, _, _ = worker.train_steps(other, 2, state=restored, first_step=2)
        np.testing.assert_allclose(got, expected, rtol=1e-5)
    ckpt.close()


# ----------------------------------------------------------------------------- memory plan

def test_memory_plan_matches_hand_count():
    from gated_attention.compile import memory
    from gated_attention.config import run_config

    cfg = run_config.model_config(worker.tiny_config())
    one_way = {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}
    fsdp8 = {"data": 1, "fsdp": 8, "tensor": 1, "expert": 1}
    # embed 256x64, q/o/gate 3 x 64x8x8, k/v 2 x 64x4x8, FFN 3 x 64x128, norms 3 x 64 + 2 x 8
    total = 256 * 64 + 3 * 4096 + 2 * 2048 + 3 * 8192 + 3 * 64 + 2 * 8
    assert memory.parameter_bytes(cfg, one_way) == 4 * total
    # fsdp splits every embed dimension; only the two head_dim norms stay whole.
    assert memory.parameter_bytes(cfg, fsdp8) == 4 * ((total - 16) // 8 + 16)
    info = memory.per_device(cfg.replace(remat="full"), {"data": 2, "fsdp": 4, "tensor": 1,
                                                         "expert": 1},
                             batch_size=8, grad_accum=1, seq_len=16)
    assert info["tokens_per_device"] == 16  # 8 sequences over 2 x 4 batch shards, x 16
    # per token: kept block input 4*64; one recomputed layer 4*(5*64 + 6*64 + 6*32 + 2*64
    # + 3*128) + 4*8 (LSE) + 4*8*16 (xla probabilities); logits and their gradient 8*256.
    per_token = 4 * 64 + (4 * 1408 + 32 + 512) + 8 * 256
    assert info["activations"] == 16 * per_token
    assert info["optimizer_state"] == 2 * info["params"]
    assert info["total"] == 4 * info["params"] + info["activations"]
    assert info["loss_logits"] == info["loss_logits_plain"] == 16 * 8 * 256
    # The chunked loss holds one tile: [1 row, 16 positions, 64 entries] of the vocabulary,
    # or [1 row, 4 positions, 256] of the sequence; the plain loss's figure stays beside it.
    for tiles, chunk, live in (("vocab", 64, 16 * 64), ("tokens", 4, 4 * 256),
                               ("tokens", 64, 16 * 256), ("vocab", 0, 16 * 256)):
        chunked = memory.per_device(cfg.replace(remat="full"), {"data": 2, "fsdp": 4,
                                                                "tensor": 1, "expert": 1},
                                    batch_size=8, grad_accum=1, seq_len=16, loss_tiles=tiles,
                                    loss_chunk=chunk)
        assert (chunked["loss_logits"], chunked["loss_logits_plain"]) == (8 * live, 8 * 4096)
        assert chunked["activations"] == 16 * (per_token - 8 * 256) + 8 * live
    rows = dict(memory.format_rows({**info, "mesh": {"data": 2}, "fits_on": [],
                                    "loss_logits": 8 * 2**20, "loss_logits_plain": 32 * 2**20}))
    assert rows["  of which the loss's float32 logits and gradient"] == (
        "8.0 MiB (the plain loss: 32.0 MiB, 24.0 MiB more)")
    with pytest.raises(ValueError, match="--mesh part 'model=2' must look like axis=size"):
        memory.parse_mesh_flag("data=1,model=2")
