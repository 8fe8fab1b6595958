"""ops.attention(impl="xla") against the numpy formula, and its structural properties."""

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest

from gated_attention import ops
from gated_attention.ops import reference

# ops.attention(impl="xla") in float64 against the float64 numpy formula, to 1e-10.
pytestmark = pytest.mark.usefixtures("x64")


def random_qkv(seed, b=2, s=9, h=4, kv=2, d=8):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(b, s, h, d)), rng.normal(size=(b, s, kv, d)),
            rng.normal(size=(b, s, kv, d)))


SEGMENTS = np.array([[1, 1, 1, 2, 2, 3, 3, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 0]])


@pytest.mark.parametrize("normalizer", ops.NORMALIZERS)
@pytest.mark.parametrize("segmented", [False, True])
def test_xla_attention_matches_numpy(normalizer, segmented):
    q, k, v = random_qkv(0)
    sink = np.array([0.5, -1.0, 2.0, 0.0]) if normalizer == "learned_sink" else None
    seg = SEGMENTS if segmented else None
    got = ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                        segment_ids=None if seg is None else jnp.asarray(seg),
                        normalizer=normalizer,
                        sink_logits=None if sink is None else jnp.asarray(sink), impl="xla")
    want = ref.sdpa(q, k, v, causal=True, segment_ids=seg, normalizer=normalizer, sink=sink)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("granularity", ["elementwise", "headwise"])
@pytest.mark.parametrize("activation", ops.GATE_ACTIVATIONS)
def test_fused_gate_argument_is_out_times_activation(granularity, activation):
    q, k, v = random_qkv(1)
    rng = np.random.default_rng(2)
    gate = rng.normal(size=q.shape if granularity == "elementwise" else q.shape[:3])
    got = ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), gate=jnp.asarray(gate),
                        gate_activation=activation, impl="xla")
    scores = ref.ACT[activation](gate)
    want = ref.sdpa(q, k, v) * (scores if scores.ndim == 4 else scores[..., None])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


def test_gqa_equals_mha_with_repeated_kv_heads():
    q, k, v = random_qkv(3, h=8, kv=2)
    gqa = ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), impl="xla")
    mha = ops.attention(jnp.asarray(q), jnp.asarray(np.repeat(k, 4, axis=2)),
                        jnp.asarray(np.repeat(v, 4, axis=2)), impl="xla")
    np.testing.assert_allclose(np.asarray(gqa), np.asarray(mha), rtol=1e-12)


def test_causal_changing_a_later_token_never_changes_earlier_outputs():
    q, k, v = random_qkv(4)
    out = np.asarray(ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v)))
    k2, v2, q2 = k.copy(), v.copy(), q.copy()
    k2[:, 5:] += 3.0
    v2[:, 5:] -= 2.0
    q2[:, 5:] *= -1.0
    out2 = np.asarray(ops.attention(jnp.asarray(q2), jnp.asarray(k2), jnp.asarray(v2)))
    np.testing.assert_array_equal(out[:, :5], out2[:, :5])
    assert np.abs(out[:, 5:] - out2[:, 5:]).max() > 1e-3


def test_packed_segments_do_not_attend_across_boundaries():
    """Each packed segment's output equals attention on that segment alone."""
    q, k, v = random_qkv(5, b=1)
    seg = SEGMENTS[:1]
    packed = np.asarray(ops.attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v),
                                      segment_ids=jnp.asarray(seg)))
    for sid in (1, 2, 3):
        idx = np.where(seg[0] == sid)[0]
        alone = ops.attention(jnp.asarray(q[:, idx]), jnp.asarray(k[:, idx]),
                              jnp.asarray(v[:, idx]))
        np.testing.assert_allclose(packed[:, idx], np.asarray(alone), rtol=1e-12)


@pytest.mark.parametrize("normalizer", ops.NORMALIZERS)
def test_first_token_weights_equal_column_zero_of_probs(normalizer):
    q, k, _ = random_qkv(6, s=21)
    sink = jnp.asarray([0.1, 0.2, 0.3, 0.4]) if normalizer == "learned_sink" else None
    kw = dict(normalizer=normalizer, sink_logits=sink, segment_ids=None)
    full = reference.attention_weights(jnp.asarray(q), jnp.asarray(k), **kw)[..., 0]
    chunked = reference.first_token_weights(jnp.asarray(q), jnp.asarray(k), chunk=8, **kw)
    want = ref.attention_probs(q, k, normalizer=normalizer,
                               sink=None if sink is None else np.asarray(sink))[..., 0]
    np.testing.assert_allclose(np.asarray(full), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(chunked), want, rtol=1e-10, atol=1e-12)


def test_softmax_rows_sum_to_one_and_sink_variants_below_one():
    q, k, _ = random_qkv(7)
    for normalizer, below in (("softmax", False), ("softmax_off_by_one", True),
                              ("softpick", True)):
        probs = reference.attention_weights(jnp.asarray(q), jnp.asarray(k),
                                            normalizer=normalizer)
        sums = np.asarray(probs.sum(-1))
        if below:
            assert np.all(sums < 1.0)
        else:
            np.testing.assert_allclose(sums, 1.0, rtol=1e-12)


def test_large_logits_stay_finite():
    q, k, v = (x * 200.0 for x in random_qkv(8))
    for normalizer in ops.NORMALIZERS:
        sink = jnp.zeros(4) if normalizer == "learned_sink" else None
        out = ops.attention(jnp.asarray(q, jnp.float32), jnp.asarray(k, jnp.float32),
                            jnp.asarray(v, jnp.float32), normalizer=normalizer, sink_logits=sink)
        assert bool(jnp.all(jnp.isfinite(out))), normalizer


@pytest.mark.parametrize("kwargs, message", [
    (dict(impl="flash"), "impl='flash' is not allowed; choose one of xla, cudnn"),
    (dict(normalizer="sparsemax"), "normalizer='sparsemax' is not allowed"),
    (dict(gate_activation="tanh"), "gate_activation='tanh' is not allowed"),
    (dict(normalizer="learned_sink"), "needs sink_logits of shape (4,)"),
    (dict(segment_ids=jnp.zeros((2, 3), jnp.int32)), "segment_ids must be [batch, seq]"),
    (dict(gate=jnp.zeros((2, 9, 4, 3))), "gate must be [b, s, h, d]"),
])
def test_bad_arguments_name_the_field(kwargs, message):
    q, k, v = (jnp.asarray(x) for x in random_qkv(9))
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("]", r"\]")):
        ops.attention(q, k, v, **kwargs)


def test_cudnn_refuses_segments_instead_of_dropping_them():
    q, k, v = (jnp.asarray(x) for x in random_qkv(10))
    with pytest.raises(ValueError, match="does not support segment_ids"):
        ops.attention(q, k, v, segment_ids=jnp.asarray(SEGMENTS), impl="cudnn")
    if jax.default_backend() != "gpu":
        with pytest.raises(ValueError, match="needs a GPU"):
            ops.attention(q, k, v, impl="cudnn")
