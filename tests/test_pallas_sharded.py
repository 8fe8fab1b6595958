"""Pallas kernels under a device mesh run per device (shard_map) and equal the XLA reference."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gated_attention import ops
from gated_attention.parallel import sharding


@pytest.mark.parametrize("mesh_shape, kv_heads", [
    (dict(data=2, fsdp=2, tensor=2), 2),   # batch over data x fsdp, heads over tensor
    (dict(data=2, fsdp=1, tensor=4), 2),   # kv heads cannot split 4 ways: heads stay whole
])
def test_pallas_gpu_under_a_mesh_matches_xla(mesh_shape, kv_heads):
    mesh = sharding.create_mesh(mesh_shape)
    rng = np.random.default_rng(0)
    b, s, h, d = 4, 24, 4, 64
    q = jnp.asarray(rng.normal(size=(b, s, h, d)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(b, s, kv_heads, d)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(b, s, kv_heads, d)), jnp.float32)
    gate = jnp.asarray(rng.normal(size=(b, s, h)), jnp.float32)
    segments = jnp.asarray(np.repeat([[1] * 10 + [2] * 14], b, axis=0), jnp.int32)
    sink = jnp.asarray(rng.normal(size=(h,)), jnp.float32)
    kw = dict(gate=gate, segment_ids=segments, normalizer="learned_sink", sink_logits=sink)
    # as the model's attention layer passes them: the mesh axes of the logical rules
    axes = {name: sharding.logical_to_spec((name,))[0] for name in ("batch", "heads")}

    def loss(impl, q, k, v):
        return jnp.sum(jnp.sin(ops.attention(q, k, v, impl=impl, interpret=True, mesh_axes=axes,
                                             **kw)))

    want, want_grads = jax.value_and_grad(loss, argnums=(1, 2, 3))("xla", q, k, v)
    batch = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    with jax.set_mesh(mesh):
        args = [jax.device_put(x, batch) for x in (q, k, v)]
        step = jax.jit(jax.value_and_grad(lambda *a: loss("pallas_gpu", *a), argnums=(0, 1, 2)))
        got, got_grads = step(*args)
        assert "shard_map" in str(jax.make_jaxpr(step)(*args))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for g, w in zip(got_grads, want_grads):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_per_device_axes_divide_their_dimension():
    from gated_attention.ops import sharded

    sizes = dict(data=2, fsdp=2, tensor=4, expert=1)
    assert sharded.fit_axes(("data", "fsdp"), 4, sizes) == ("data", "fsdp")
    assert sharded.fit_axes(("data", "fsdp"), 2, sizes) is None  # 4 pieces of 2 rows
    assert sharded.fit_axes("tensor", 8, sizes) == ("tensor",)
    assert sharded.fit_axes("tensor", 2, sizes) is None  # 2 kv heads cannot split 4 ways
    assert sharded.fit_axes("expert", 4, sizes) is None  # a size-1 axis splits nothing
    # without the caller's axes: the batch over every mesh axis that divides it, in order
    assert sharded.default_batch_axes(4, sizes) == ("data", "fsdp")
    assert sharded.default_batch_axes(6, sizes) == ("data",)
    assert sharded.default_batch_axes(1, sizes) is None
