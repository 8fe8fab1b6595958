"""Pallas GPU (Triton) attention: interpret mode on CPU against the float64 XLA reference.

Each case covers several features at once (normaliser x gate granularity x activation x
segments x GQA ratio x odd length x dtype) to keep the suite fast; a lowering test checks
that the same kernels, forward and backward, lower to Triton for a CUDA target.
"""

import flash_cases
import pytest
from flash_cases import Case

from gated_attention import ops
from gated_attention.ops import pallas_gpu

CASES = [
    # GQA 4, odd length, two to four segments per row, elementwise sigmoid gate.
    Case("softmax", "elementwise", "sigmoid", heads=4, kv_heads=1, seq=37),
    # GQA 2, no gate, no segments, q tile larger than the kv tile.
    Case("softmax_off_by_one", None, segments=False, seq=33, block_q=32),
    # GQA 8, learned sink (its gradient too), ns_sigmoid gate, batch 2.
    Case("learned_sink", "elementwise", "ns_sigmoid", batch=2, heads=8, kv_heads=1, seq=24),
    # GQA 1, softpick, non-causal with segments, headwise identity gate.
    Case("softpick", "headwise", "identity", causal=False, heads=2, kv_heads=2, seq=45),
    # bfloat16 inputs with float32 accumulation, headwise silu gate.
    Case("softpick", "headwise", "silu", heads=4, kv_heads=2, seq=40, dtype="bfloat16"),
]
FORWARD_ONLY = [
    Case("softmax", "headwise", "sigmoid", head_dim=128, seq=20, heads=2, kv_heads=1,
         grads=False),
]


def _kernel(q, k, v, **kwargs):
    """Through the public dispatcher, so every case also checks that path."""
    return ops.attention(q, k, v, impl="pallas_gpu", interpret=True, **kwargs)


@pytest.mark.parametrize("case", CASES + FORWARD_ONLY, ids=str)
def test_matches_float64_reference(case: Case):
    flash_cases.check_case(_kernel, case)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_lowers_to_triton(head_dim: int):
    """Forward and backward lower to Triton IR for CUDA with every feature on (no device needed)."""
    text = flash_cases.lowered_text(pallas_gpu, "h200", "cuda", 512, head_dim)
    assert "xla.gpu.triton" in text


def test_split_dq_backward_matches_and_lowers(monkeypatch):
    """FlashAttention-2's split backward (a dq kernel of its own), kept as the alternative to
    the atomic dq: same values, and its three kernels lower to Triton."""
    monkeypatch.setattr(pallas_gpu, "DQ_BY_ATOMICS", False)
    flash_cases.check_case(_kernel, Case("softmax", "headwise", "sigmoid", heads=4, kv_heads=2,
                                         seq=24))
    assert "xla.gpu.triton" in flash_cases.lowered_text(pallas_gpu, "h200", "cuda", 256, 64)


def test_bad_input_is_refused():
    flash_cases.check_refusals(pallas_gpu.attention)
