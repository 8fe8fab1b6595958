"""Kernel choices follow the platform a program is lowered for, whatever the entry point.

A user who compiles with plain `jax.jit(f).lower(...)` over compile-only TPU or GPU devices
(no `ops.compiling_for`), or exports for a platform, must get that platform's kernel: the
Mosaic kernel and no host callback (the CPU interpreter) for a TPU, Triton or cuDNN for a GPU;
the same function run on this CPU interprets and matches an independent float64 reference.
An explicit interpret=False is never overridden. About 15 s of CPU in all.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gated_attention import ops

B, S, H, KV, D = 2, 128, 4, 2, 64


@pytest.fixture(autouse=True)
def no_process_wide_target(monkeypatch):
    """These tests are about the lowering platform deciding: no process-wide override."""
    monkeypatch.delenv("GATED_ATTENTION_TARGET", raising=False)


def test_a_process_wide_target_traces_once_for_it(monkeypatch):
    monkeypatch.setenv("GATED_ATTENTION_TARGET", "cpu")
    q = jax.ShapeDtypeStruct((1, 32, 2, 32), jnp.float32)
    jaxpr = jax.make_jaxpr(lambda q: ops.attention(q, q, q, impl="auto"))(q)
    assert "platform_index" not in str(jaxpr)
    monkeypatch.setenv("GATED_ATTENTION_TARGET", "cpux")
    with pytest.raises(ValueError, match="GATED_ATTENTION_TARGET='cpux'.*cpu, gpu, tpu"):
        ops.target_platform()
    monkeypatch.delenv("GATED_ATTENTION_TARGET")
    assert "platform_index" in str(jax.make_jaxpr(
        lambda q: ops.attention(q, q, q, impl="auto"))(q))


def gated_call(impl):
    def f(q, k, v, gate, seg):
        return ops.attention(q, k, v, gate=gate, segment_ids=seg, impl=impl)
    return f


def abstract_args(devices, dtype=jnp.bfloat16):
    mesh = jax.sharding.Mesh(np.array(devices[:2]), ("data",))
    rows = NamedSharding(mesh, PartitionSpec("data"))
    qs = jax.ShapeDtypeStruct((B, S, H, D), dtype, sharding=rows)
    kvs = jax.ShapeDtypeStruct((B, S, KV, D), dtype, sharding=rows)
    seg = jax.ShapeDtypeStruct((B, S), jnp.int32, sharding=rows)
    return qs, kvs, kvs, qs, seg


def custom_calls(text: str) -> list[str]:
    """Custom-call targets of an optimized HLO or a StableHLO module."""
    return (re.findall(r'custom_call_target="([^"]+)"', text)
            + re.findall(r'stablehlo.custom_call @([\w$.]+)', text))


def host_callbacks(text: str) -> list[str]:
    """The CPU interpreter's trace in a program: calls back into Python on the host."""
    return [c for c in custom_calls(text) if "callback" in c]


@pytest.fixture(scope="module")
def tpu_devices():  # for tests marked needs("libtpu")
    from gated_attention.compile.target import tpu_devices

    return tpu_devices("v5e:2x2")


@pytest.fixture(scope="module")
def gpu_devices():  # for tests marked needs("jax_plugins.xla_cuda12")
    from gated_attention.compile import gpu_targets
    from gated_attention.compile import target as target_compile

    return target_compile.gpu_devices(gpu_targets.parse_accelerator("h200-2"))


@pytest.mark.needs("libtpu")
@pytest.mark.parametrize("impl", ["pallas_tpu", "auto"])
def test_plain_aot_for_tpu_devices_holds_mosaic_kernels_and_no_host_callback(tpu_devices, impl):
    def loss(*args):
        return jnp.sum(gated_call(impl)(*args).astype(jnp.float32))

    args = abstract_args(tpu_devices)
    with jax.set_mesh(args[0].sharding.mesh):  # the kernel runs per device (shard_map)
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(*args).compile()
    text = compiled.as_text()
    # forward and backward of the gated kernel (pallas_tpu: forward, dq, dk/dv; auto takes
    # jax's splash for packed softmax: its forward, dq and dk/dv too)
    assert custom_calls(text).count("tpu_custom_call") >= 3, custom_calls(text)
    assert not host_callbacks(text)


def test_export_for_tpu_carries_the_mosaic_kernel():
    exported = jax.export.export(jax.jit(gated_call("pallas_tpu")), platforms=["tpu"])(
        *(jax.ShapeDtypeStruct(a.shape, a.dtype) for a in abstract_args(jax.devices())))
    text = exported.mlir_module()
    assert "tpu_custom_call" in custom_calls(text) and not host_callbacks(text)


@pytest.mark.needs("jax_plugins.xla_cuda12")
@pytest.mark.parametrize("impl, kernel", [("pallas_gpu", "__gpu$xla.gpu.triton"),
                                          ("auto", "__gpu$xla.gpu.triton")])
def test_plain_aot_for_gpu_devices_holds_triton_kernels(gpu_devices, impl, kernel):
    args = abstract_args(gpu_devices)
    with jax.set_mesh(args[0].sharding.mesh):
        compiled = jax.jit(gated_call(impl)).lower(*args).compile()
    text = compiled.as_text()
    assert kernel in custom_calls(text) and not host_callbacks(text)


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_plain_aot_for_gpu_devices_takes_cudnn_for_unpacked_16_bit(gpu_devices):
    """auto without segment ids in bfloat16 takes cuDNN: jax's host checks are answered for
    the target (this host has neither a GPU nor cuDNN)."""
    q, k, v, gate, _ = abstract_args(gpu_devices)
    f = jax.jit(lambda q, k, v, g: ops.attention(q, k, v, gate=g, impl="auto"))
    calls = custom_calls(f.lower(q, k, v, gate).compile().as_text())
    assert any(c.startswith("__cudnn$fmha") for c in calls), calls


def test_the_same_function_interprets_on_this_cpu_and_matches_float64(monkeypatch):
    """pallas_tpu and pallas_gpu with interpret left to the lowering platform run here."""
    rng = np.random.default_rng(0)
    b, s = 1, 24
    q, k, v = (rng.normal(size=(b, s, h, 32)).astype(np.float32) for h in (2, 1, 1))
    gate = rng.normal(size=(b, s, 2, 32)).astype(np.float32)
    seg = np.repeat([[0] * 10 + [1] * 14], b, 0).astype(np.int32)
    with jax.enable_x64(True):
        want = numpy_reference.sdpa(q.astype(np.float64), k.astype(np.float64),
                                    v.astype(np.float64), segment_ids=seg)
    want = want * numpy_reference.sigmoid(gate.astype(np.float64))
    with jax.enable_x64(False):
        for impl in ("pallas_tpu", "pallas_gpu"):
            got = jax.jit(gated_call(impl))(q, k, v, gate, seg)
            np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, err_msg=impl)


def test_explicit_interpret_false_is_never_overridden():
    q = jnp.zeros((1, 32, 2, 32), jnp.float32)
    f = jax.jit(lambda q: ops.attention(q, q, q, impl="pallas_gpu", interpret=False))
    with pytest.raises(ValueError, match="Only interpret mode is supported on CPU"):
        f.lower(q).compile()  # the real Triton kernel for a CPU: refused, not interpreted
    text = jax.jit(lambda q: ops.attention(q, q, q, impl="pallas_tpu", interpret=False)).trace(
        q).lower(lowering_platforms=("tpu",)).as_text()
    assert "tpu_custom_call" in text


def test_kernels_cached_in_one_trace_serve_the_next(monkeypatch):
    """A CPU run traces the TPU branch too (libtpu installed): splash's cached kernel, first
    built inside one jit's trace, must hold constants, not that trace's tracers (it leaked an
    int8 mask tracer into the next jit: UnexpectedTracerError)."""
    q = jnp.asarray(np.random.default_rng(0).normal(size=(1, 128, 2, 32)), jnp.float32)
    first = jax.jit(lambda q: ops.attention(q, q, q, impl="auto"))(q)
    second = jax.jit(lambda q: ops.attention(2 * q, q, q, impl="auto"))(q)
    grad = jax.grad(lambda q: ops.attention(q, q, q, impl="auto").sum())(q)
    want = numpy_reference.sdpa(np.asarray(q, np.float64), np.asarray(q, np.float64),
                                np.asarray(q, np.float64))
    np.testing.assert_allclose(np.asarray(first), want, rtol=2e-5, atol=2e-5)
    assert second.shape == first.shape and grad.shape == q.shape
