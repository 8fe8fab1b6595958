"""Pallas TPU (Mosaic) attention: interpret mode on CPU against the float64 XLA reference.

Each case covers several features at once (normaliser x gate granularity x activation x
segments x GQA ratio x odd length x dtype) to keep the suite fast; a lowering test checks
that the same kernels, forward and backward, lower with Mosaic for a TPU target.
"""

import re

import flash_cases
import pytest
from flash_cases import Case
from jax.experimental.pallas import tpu as pltpu

from gated_attention import ops
from gated_attention.ops import pallas_tpu

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
    flash_cases.check_case(_kernel, case)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_lowers_to_mosaic(head_dim: int):
    """Forward and backward lower with Mosaic for TPU with every feature on (no device needed)."""
    text = flash_cases.lowered_text(pallas_tpu, "tpu", "tpu", 1024, head_dim)
    assert "tpu_custom_call" in text


@pytest.mark.needs("libtpu")
def test_training_configuration_compiles_for_a_tpu():
    """The kernel as a training step calls it (packed rows: segment ids; elementwise gate;
    GQA; tiles from the TPU table, not the host's) compiles through Mosaic, forward and
    backward, for a v5e target with no device: forward, dq and dk/dv custom calls."""
    text = flash_cases.tpu_compiled_text("v5e:2x2")
    assert text.count("tpu_custom_call") >= 3
    for kernel in ("gated_flash_fwd", "gated_flash_dq", "gated_flash_dkv"):
        assert kernel in text


# Mosaic compiles of the kernel alone, forward + backward, for each TPU generation: between
# them every gate kind and activation, every normaliser, with and without segment ids, GQA
# ratios 1, 2 and 4, head_dim 64 / 128 / 256, the TPU tile table and tiles under 128 that
# differ per phase. About 2 s each on one core.
SMALL_TILES = dict(block_q=64, block_kv=128, block_q_dq=128, block_kv_dq=64, block_q_dkv=64,
                   block_kv_dkv=128)
TPU_COMPILES = [
    ("v5e:2x2", dict(normalizer="softpick", gate="headwise", activation="silu",
                     segments=False, kv_heads=1)),
    ("v5e:2x2", dict(normalizer="softmax", gate=None, head_dim=64, seq=2048)),
    ("v5p:2x2x1", dict(normalizer="learned_sink", gate="elementwise", activation="silu",
                       kv_heads=4)),
    ("v5p:2x2x1", dict(normalizer="softmax_off_by_one", gate=None, head_dim=256)),
    ("v6e:2x2", dict(normalizer="softmax", gate="headwise", activation="sigmoid")),
    ("v6e:2x2", dict(normalizer="learned_sink", gate="elementwise", activation="ns_sigmoid",
                     segments=False, kv_heads=1, seq=640)),
    ("v5p:2x2x1", dict(normalizer="softmax", gate="headwise", activation="ns_sigmoid",
                       block_sizes=SMALL_TILES)),
]
# An array whose last dim is 1, such as a [b, h, S, 1] column of per-row statistics: TPU
# memory pads its last dim to 128 lanes.
COLUMN = re.compile(r"\b(?:f32|bf16|s32)\[[\d,]*,1\]")


def _compile_id(topology: str, features: dict) -> str:
    return "-".join([topology] + [str(v) if not isinstance(v, dict) else "tiles"
                                  for v in features.values()])


@pytest.mark.needs("libtpu")
@pytest.mark.parametrize("topology, features", TPU_COMPILES,
                         ids=[_compile_id(t, f) for t, f in TPU_COMPILES])
def test_compiles_for_tpu_generations(topology: str, features: dict):
    """Forward, dq and dk/dv compile through Mosaic, and the per-row vectors (lse, delta,
    segment ids, headwise gate) stay lane-dense: no array of the program ends in a dim of 1."""
    text = flash_cases.tpu_compiled_text(topology, **features)
    for kernel in ("gated_flash_fwd", "gated_flash_dq", "gated_flash_dkv"):
        assert kernel in text
    assert "tpu_custom_call" in text
    assert not COLUMN.findall(text), sorted(set(COLUMN.findall(text)))


def test_bad_input_is_refused():
    flash_cases.check_refusals(pallas_tpu.attention)
