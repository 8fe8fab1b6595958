"""ops/chunked.py: values and gradients against the float64 reference, and no S x S buffer."""

import dataclasses

import flash_cases
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flash_cases import Case

from gated_attention import ops
from gated_attention.ops import chunked, reference

CASES = [
    Case("softmax", "elementwise"),
    Case("softmax_off_by_one", "headwise", activation="silu", segments=False, causal=False,
         grads=False),
    Case("learned_sink", "elementwise", heads=4, kv_heads=1),
    Case("softpick", None, dtype="bfloat16", block_q=8, block_kv=32, grads=False),
]


def _chunked(q, k, v, *, block_sizes, **kwargs):
    return chunked.attention(q, k, v, **kwargs, **block_sizes)


@pytest.mark.parametrize("case", [dataclasses.replace(c, head_dim=16) for c in CASES], ids=str)
def test_matches_float64_reference(case: Case):
    # seq 37 with 16-wide blocks: ragged last blocks on both axes, skipped future blocks.
    flash_cases.check_case(_chunked, case)


def test_queries_shorter_than_keys_and_the_dispatcher_match_the_reference(x64):
    rng = np.random.default_rng(1)
    q = jnp.asarray(rng.standard_normal((1, 5, 2, 8)))
    k, v = (jnp.asarray(rng.standard_normal((1, 21, 2, 8))) for _ in range(2))
    for causal in (True, False):
        got = chunked.attention(q, k, v, causal=causal, block_q=2, block_kv=4)
        want = reference.attention(q, k, v, causal=causal)
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-12)
    got = ops.attention(k, k, v, impl="chunked", block_sizes=dict(block_q=8, block_kv=8))
    np.testing.assert_allclose(np.asarray(got), np.asarray(reference.attention(k, k, v)),
                               atol=1e-12)


def test_memory_stays_linear_in_length():
    """At 8k tokens the S x S logits of one head would take 256 MiB; chunked needs a few MiB."""
    s, h, d = 8192, 2, 32
    spec = jax.ShapeDtypeStruct((1, s, h, d), jnp.float32)
    fn = jax.jit(lambda q, k, v: chunked.attention(q, k, v, block_q=512, block_kv=512))
    temp = fn.lower(spec, spec, spec).compile().memory_analysis().temp_size_in_bytes
    assert temp < s * s * 4 / 16, f"{temp / 2**20:.1f} MiB of temporaries"


def test_bad_arguments_are_refused():
    q = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(ValueError, match="normalizer='nope' is not allowed"):
        chunked.attention(q, q, q, normalizer="nope")
    with pytest.raises(ValueError, match="block_q=0"):
        chunked.attention(q, q, q, block_q=0)
