"""Pallas TPU (Mosaic) attention: interpret mode on CPU against the float64 XLA reference.

Each case covers several features at once (normaliser x gate granularity x activation x
segments x GQA ratio x odd length x dtype) to keep the suite fast; a lowering test checks
that the same kernels, forward and backward, lower with Mosaic for a TPU target.
"""

import dataclasses

import flash_cases
import jax
import jax.numpy as jnp
import pytest
from flash_cases import Case
from jax.experimental.pallas import tpu as pltpu

from gated_attention import ops
from gated_attention.ops import pallas_tpu
from gated_attention.ops.block_sizes import block_sizes_for

CASES = [
    # GQA 4, odd length, segments, learned sink (and its gradient), elementwise ns_sigmoid gate.
    Case("learned_sink", "elementwise", "ns_sigmoid", heads=4, kv_heads=1, seq=37),
    # bfloat16, GQA 2, no segments, headwise silu gate, q tile larger than the kv tile.
    Case("softpick", "headwise", "silu", segments=False, seq=33, block_q=32, dtype="bfloat16"),
    # GQA 1, non-causal with segments, no gate.
    Case("softmax_off_by_one", None, causal=False, heads=2, kv_heads=2, seq=29),
]
FORWARD_ONLY = [
    Case("softmax", "elementwise", "identity", head_dim=256, seq=20, heads=2, kv_heads=2,
         grads=False),
]


def _kernel(q, k, v, **kwargs):
    """Through the public dispatcher, inside the documented way to run Mosaic kernels on CPU
    (the kernels also pick the TPU interpret mode on their own)."""
    with pltpu.force_tpu_interpret_mode():
        return ops.attention(q, k, v, impl="pallas_tpu", interpret=True, **kwargs)


@pytest.mark.parametrize("case", CASES + FORWARD_ONLY, ids=str)
def test_matches_float64_reference(case: Case):
    errs = flash_cases.errors(_kernel, case,
                              block_sizes=dict(block_q=case.block_q, block_kv=case.block_kv))
    assert set(errs) >= {"out", "dq", "dk", "dv"} or not case.grads
    bad = {name: err for name, err in errs.items() if not err <= case.tol}
    assert not bad, f"errors above {case.tol}: {bad}"


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_lowers_to_mosaic(head_dim: int):
    """Forward and backward lower to Mosaic for TPU with every feature on (no TPU needed)."""
    b, s, h, n = 1, 1024, 4, 2
    bf16 = jnp.bfloat16
    q = jax.ShapeDtypeStruct((b, s, h, head_dim), bf16)
    kv = jax.ShapeDtypeStruct((b, s, n, head_dim), bf16)
    gate = jax.ShapeDtypeStruct((b, s, h, head_dim), bf16)
    seg = jax.ShapeDtypeStruct((b, s), jnp.int32)
    sink = jax.ShapeDtypeStruct((h,), jnp.float32)

    def loss(q, k, v, gate, seg, sink):
        static = pallas_tpu._static(q, k, gate, "sigmoid", seg, True, "learned_sink", False,
                                    None)
        sizes = block_sizes_for(head_dim, None, kind="tpu")
        static = dataclasses.replace(static, interpret=False, sizes=tuple(sorted(sizes.items())))
        out = pallas_tpu._flash(static, q, k, v, seg, gate, sink)
        return jnp.sum(out.astype(jnp.float32))

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 5)))
    text = grads.trace(q, kv, kv, gate, seg, sink).lower(lowering_platforms=("tpu",)).as_text()
    for kernel in ("gated_flash_fwd", "gated_flash_dq", "gated_flash_dkv"):
        assert kernel in text
    assert "tpu_custom_call" in text


def test_bad_block_size_is_refused():
    q = jnp.zeros((1, 16, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="block_sizes\\['block_q'\\]"):
        pallas_tpu.attention(q, q, q, block_sizes=dict(block_q=24))
    with pytest.raises(ValueError, match="unknown key 'block_x'"):
        pallas_tpu.attention(q, q, q, block_sizes=dict(block_x=16))


def test_cross_lengths_are_refused():
    q = jnp.zeros((1, 16, 2, 64), jnp.float32)
    k = jnp.zeros((1, 32, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="equal query and key lengths"):
        pallas_tpu.attention(q, k, k)
