"""The project's GPU kernels compile for real NVIDIA targets, deviceless (XLA:GPU down to a
cubin: Triton IR -> PTX -> ptxas, whose shared-memory limit is the GPU's).

- the gated Triton kernel, forward and backward, for H200: a cover of every gate kind (none,
  elementwise, headwise), every normaliser, with and without segment ids, GQA groups 1 and 2
  (4 cases, 8 kernels, one program); for H100 the training configuration's case;
- every row of ops/block_sizes.py for the GPU it names, head_dim 64, 128 and 256 (rows with
  the same tiles on the same SM compiled once: 3 programs, marked slow), and a row that
  overflows shared memory fails;
- cuDNN (plain and packed) with jax's checks answered for the target: H200 compiles, an
  A100 is refused head_dim 256 and packed layouts, as jax refuses them on that GPU;
- the packed-cuDNN segment conversion against a hand-built case.
"""

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention.compile import gpu_targets
from gated_attention.compile import target as target_compile
from gated_attention.ops import block_sizes, cudnn, cudnn_packed, pallas_gpu
from gated_attention.ops.target import compiling_for

TRITON = "__gpu$xla.gpu.triton"
# The GPU each row of ops/block_sizes.py is for (GH200 has the H200's SM; the generic row is
# for any GPU, so it must fit the smallest shared memory here, the A100's).
ROW_GPU = {"h200": "h200", "h100": "h100", "gh200": "h200", "b200": "b200",
           "a100": "a100-80gb", "gpu": "a100-80gb"}


@functools.cache
def device(gpu: str):
    return target_compile.gpu_devices(gpu_targets.parse_accelerator(f"{gpu}-1"))[0]


def on(gpu: str, shape, dtype=jnp.bfloat16):
    return jax.ShapeDtypeStruct(shape, dtype, sharding=jax.sharding.SingleDeviceSharding(
        device(gpu)))


def custom_calls(compiled) -> list[str]:
    return re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())


@dataclasses.dataclass(frozen=True)
class Kernel:
    """One gated-kernel call: its features and shape."""

    gate: str | None
    normalizer: str
    segments: bool
    group: int  # query heads per kv head
    head_dim: int = 64
    seq: int = 256
    sizes: tuple = ()  # tile sizes (a row of ops/block_sizes.py); () = the target's row

    def args(self, gpu: str):
        h = 2 * self.group
        q = on(gpu, (1, self.seq, h, self.head_dim))
        kv = on(gpu, (1, self.seq, 2, self.head_dim))
        gate = {None: None, "elementwise": q, "headwise": on(gpu, (1, self.seq, h))}[self.gate]
        seg = on(gpu, (1, self.seq), jnp.int32) if self.segments else None
        sink = on(gpu, (h,), jnp.float32) if self.normalizer == "learned_sink" else None
        return q, kv, kv, gate, seg, sink

    def loss(self, q, k, v, gate, seg, sink):
        static = pallas_gpu._static(q, k, gate, "sigmoid", seg, True, self.normalizer, False,
                                    None)
        if self.sizes:
            static = dataclasses.replace(static, sizes=tuple(sorted(self.sizes)))
        out = pallas_gpu._flash(static, q, k, v, seg, gate, sink)
        return jnp.sum(out.astype(jnp.float32))


def compile_kernels(gpu: str, kernels: list[Kernel]):
    """Forward and backward of every kernel in one program for `gpu`, traced for it."""
    argsets = [k.args(gpu) for k in kernels]

    def program(argsets):
        grads = []
        for kernel, args in zip(kernels, argsets):
            wrt = tuple(i for i, a in enumerate(args) if a is not None and i != 4)
            grads.append(jax.grad(kernel.loss, argnums=wrt)(*args))
        return grads

    with compiling_for("gpu", device_kind=device(gpu).device_kind):
        return jax.jit(program).lower(argsets).compile()


# Every gate kind, every normaliser, segments on and off, GQA 1 and 2: a cover in 4 cases
# (the 3 x 4 x 2 x 2 product would be 48 compiles of 2 kernels each).
COVER = [Kernel("elementwise", "softmax", True, 2),
         Kernel("headwise", "softmax_off_by_one", False, 1),
         Kernel(None, "learned_sink", True, 1),
         Kernel("elementwise", "softpick", False, 2)]
# The H100 has the H200's SM (compute capability 9.0, 227 KiB of shared memory per block)
# and tile row: the training configuration's case is compiled for it.
CASES = {"h200": COVER, "h100": COVER[:1]}


@pytest.mark.needs("jax_plugins.xla_cuda12")
@pytest.mark.parametrize("gpu", ["h100", "h200"])
def test_gated_triton_kernel_compiles_forward_and_backward_for_hopper(gpu):
    calls = custom_calls(compile_kernels(gpu, CASES[gpu]))
    # the forward and dk/dv (dq added atomically inside it) of each case
    assert calls.count(TRITON) == 2 * len(CASES[gpu]), calls
    assert not [c for c in calls if "callback" in c]


def row_kernels(kind: str) -> list[Kernel]:
    """The row's tiles at each head_dim it holds, every feature on, a sequence of 512."""
    return [Kernel("elementwise", "learned_sink", True, 2, head_dim=d, seq=512,
                   sizes=tuple(block_sizes.block_sizes_for(d, kind=kind).items()))
            for d in sorted(block_sizes.TABLE[kind])]


def row_groups() -> dict[str, list[str]]:
    """GPU rows that are the same tiles for the same SM (compute capability and shared memory
    per block), by the first such row: one compile checks them all."""
    groups: dict[tuple, list[str]] = {}
    for kind, gpu in sorted(ROW_GPU.items()):
        spec = gpu_targets.GPUS[gpu]
        key = (repr(sorted(block_sizes.TABLE[kind].items())), spec.compute_capability,
               spec.shared_per_block_optin)
        groups.setdefault(key, []).append(kind)
    return {kinds[0]: kinds for kinds in groups.values()}


@pytest.mark.needs("jax_plugins.xla_cuda12")
@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(row_groups()))
def test_every_gpu_row_of_the_tile_table_compiles_for_its_gpu(kind):
    """About 15 s of CPU per group (3 head dims x 2 kernels); the groups: a100 (with the
    generic row), b200, gh200 (with h100 and h200)."""
    kernels = row_kernels(kind)
    assert custom_calls(compile_kernels(ROW_GPU[kind], kernels)).count(TRITON) == 2 * len(
        kernels)


def test_every_gpu_row_of_the_tile_table_is_compiled_above():
    """A GPU row added to ops/block_sizes.py must name its GPU here, or this fails."""
    assert set(block_sizes.TABLE) - {"tpu", "cpu"} == set(ROW_GPU)


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_a_tile_row_over_the_gpus_shared_memory_fails_to_compile():
    """256 x 256 tiles at head_dim 256 with 4 stages need about 1 MiB of shared memory: the
    A100's 163 KiB (and any GPU's) refuse it, so a table like that fails the suite."""
    huge = dict(block_sizes.block_sizes_for(256, kind="a100"), block_q=256, block_kv=256,
                num_stages=4)
    kernel = Kernel(None, "softmax", False, 1, head_dim=256, seq=512,
                    sizes=tuple(huge.items()))
    with pytest.raises(Exception, match="(?i)shared memory"):
        compile_kernels("a100-80gb", [kernel])


def cudnn_loss(impl, q, k, v, gate, seg):
    if impl == "cudnn":
        out = cudnn.attention(q, k, v, gate=gate)
    else:
        out = cudnn_packed.attention(q, k, v, gate=gate, segment_ids=seg)
    return jnp.sum(out.astype(jnp.float32))


def compile_cudnn(gpu: str, impl: str, head_dim: int):
    q = on(gpu, (2, 256, 4, head_dim))
    kv = on(gpu, (2, 256, 2, head_dim))
    seg = on(gpu, (2, 256), jnp.int32)
    grad = jax.grad(functools.partial(cudnn_loss, impl), argnums=(0, 1, 2, 3))
    with compiling_for("gpu", device_kind=device(gpu).device_kind):
        return jax.jit(grad).lower(q, kv, kv, q, seg).compile()


@pytest.mark.needs("jax_plugins.xla_cuda12")
@pytest.mark.parametrize("impl", ["cudnn", "cudnn_packed"])
def test_cudnn_compiles_for_h200_with_the_checks_answered_for_it(impl):
    calls = custom_calls(compile_cudnn("h200", impl, 256))
    assert "__cudnn$fmhaSoftmax" in calls and "__cudnn$fmhaSoftmaxBackward" in calls, calls


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_cudnn_is_refused_what_the_a100_cannot_do():
    """jax refuses head_dim 256 below Hopper, and the packed layout too: asked about the
    A100 target (not this host, which has no GPU), it says so."""
    with pytest.raises(NotImplementedError, match="head dim must be <= 128"):
        compile_cudnn("a100-80gb", "cudnn", 256)
    with pytest.raises(NotImplementedError, match="Packed layout requires .*Hopper"):
        compile_cudnn("a100-80gb", "cudnn_packed", 64)


def test_segment_conversion_matches_a_hand_built_case():
    seg = jnp.array([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 7, 7], [3, 3, 3, 3, 3, 3],
                     [0, 1, 2, 3, 4, 5]])
    lengths, offsets = jax.jit(cudnn_packed.segment_offsets)(seg)
    np.testing.assert_array_equal(lengths, [[2, 3, 1, -1, -1, -1], [4, 2, -1, -1, -1, -1],
                                            [6, -1, -1, -1, -1, -1], [1, 1, 1, 1, 1, 1]])
    np.testing.assert_array_equal(offsets, [[0, 2, 5, -1, -1, -1, -1],
                                            [0, 4, -1, -1, -1, -1, -1],
                                            [0, -1, -1, -1, -1, -1, -1],
                                            [0, 1, 2, 3, 4, 5, -1]])


def test_packed_cudnn_refuses_what_it_cannot_serve():
    q = jnp.zeros((1, 16, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="bfloat16 or float16"):
        cudnn_packed.attention(q, q, q)
    with pytest.raises(ValueError, match="normalizer='softmax' only"):
        cudnn_packed.attention(q, q, q, normalizer="softpick")
    with pytest.raises(ValueError, match="needs a GPU"):
        cudnn_packed.attention(q.astype(jnp.bfloat16), q.astype(jnp.bfloat16),
                               q.astype(jnp.bfloat16))  # eager on this CPU
    assert cudnn_packed.TESTED_JAX[0] <= cudnn_packed._jax_version() < cudnn_packed.TESTED_JAX[1]


def test_row_groups_cover_every_gpu_row():
    groups = row_groups()
    assert sorted(k for kinds in groups.values() for k in kinds) == sorted(ROW_GPU)
    assert len(groups) == 3, groups  # Ampere rows, Blackwell, Hopper
