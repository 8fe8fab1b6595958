"""The axes beyond the paper (docs/beyond.md) against the float64 numpy formulas.

Gate input width and rank, 2·sigmoid with zero-initialised weights, biased gates, G1 + G2,
exclusive self-attention and sliding windows: values and gradients of the attention layer
(GQA: 4 query heads over 2 kv heads, with packed segments), parameter counts by hand, the
identity at init, XSA on a hand-built case, window masks against a hand-built mask.
"""

import jax
import jax.numpy as jnp
import layer_params
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx

from gated_attention import ops
from gated_attention.model.accounting import count_params, gate_params_closed_form
from gated_attention.model.layers.attention import Attention, exclusive_self_attention
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.variants import BEYOND_PAPER, VARIANTS, AttentionVariant, VariantError
from gated_attention.ops import chunked, reference

D, H, KV, HD = 16, 4, 2, 8


def tiny_cfg(variant, **kw):
    return ModelConfig(vocab_size=32, num_layers=1, d_model=D, num_heads=H, num_kv_heads=KV,
                       head_dim=HD, mlp_dim=32, variant=variant, **kw)


def randomise(module: nnx.Module, seed: int) -> dict:
    """Random parameters (layer_params.randomise), returned in numpy_reference's layout."""
    params: dict = {"gates": {}}
    variant = module.cfg.variant
    for path, value in layer_params.randomise(module, seed).items():
        if path[0].startswith("gate"):
            position = variant.gate_position if path[0] == "gate" else path[0][len("gate_"):]
            gate = params["gates"].setdefault(position, {})
            gate[{"kernel": "kernel", "kernel_a": "a", "kernel_b": "b", "bias": "bias"}[
                path[-1]]] = value
            gate["width"] = variant.gate_input_width(D)
        else:
            params[path[0]] = value
    return params


def inputs():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(2, 7, D))
    positions = np.tile(np.arange(7), (2, 1))
    segment_ids = np.array([[1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, 1, 1, 1]])
    positions[0, 3:] = np.arange(4)
    return x, positions, segment_ids


def numpy_variant(variant: AttentionVariant, window: int | None = None) -> dict:
    fields = variant.to_dict()
    fields["xsa"] = variant.exclusive_self_attention
    fields["window"] = variant.window if window is None else window
    return fields


# Every new name, plus combinations with GQA-sensitive positions (G2 and G3 on kv heads).
CASES = [*BEYOND_PAPER, "g2_rank_4_input_8", "g5_input_half_bias", "xsa_g2_headwise"]
EXTRA = {
    "g2_rank_4_input_8": AttentionVariant(gate_position="value", gate_rank=4,
                                          gate_input_dims=8),
    "g5_input_half_bias": AttentionVariant(gate_position="dense_output", gate_input_fraction=0.5,
                                           gate_bias=True, gate_bias_init=1.0),
    "xsa_g2_headwise": AttentionVariant(gate_position="value", granularity="headwise",
                                        exclusive_self_attention=True),
}


def variant_of(name: str) -> AttentionVariant:
    variant = EXTRA.get(name) or VARIANTS[name]
    # A window shorter than the 7 test tokens, so the mask bites.
    return variant.replace(window=3) if variant.window else variant


@pytest.mark.parametrize("name", CASES)
def test_layer_matches_numpy_formula(name):
    variant = variant_of(name)
    module = layer_params.build(Attention, tiny_cfg(variant))  # every parameter randomised
    params = randomise(module, seed=1)
    x, positions, segment_ids = inputs()
    got = module(jnp.asarray(x, jnp.float32), jnp.asarray(positions),
                 jnp.asarray(segment_ids, jnp.int32))
    want = ref.attention_layer_beyond(x, params, numpy_variant(variant), positions=positions,
                                      segment_ids=segment_ids)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("name", ["g1_rank_8", "g1_g2", "xsa_g1", "swa_32_g1",
                                  "g1_bias_init_2"])
def test_layer_gradients_match_numpy_finite_differences(name):
    """d(sum(out * R)) / d(parameters), a few entries each, by central differences in float64."""
    variant = variant_of(name)
    module = layer_params.build(Attention, tiny_cfg(variant))  # every parameter randomised
    params = randomise(module, seed=5)
    x, positions, segment_ids = inputs()
    weights = np.random.default_rng(6).normal(size=(2, 7, D))
    graphdef, state = nnx.split(module, nnx.Param)

    def loss(state):
        out = nnx.merge(graphdef, state)(jnp.asarray(x, jnp.float32), jnp.asarray(positions),
                                         jnp.asarray(segment_ids, jnp.int32))
        return jnp.sum(out * jnp.asarray(weights, jnp.float32))

    grads = dict(nnx.to_flat_state(jax.grad(loss)(state)))
    fields = numpy_variant(variant)

    def numpy_loss(p):
        return float(np.sum(ref.attention_layer_beyond(x, p, fields, positions=positions,
                                                       segment_ids=segment_ids) * weights))

    rng = np.random.default_rng(7)
    checked = 0
    for path, grad in grads.items():
        if path[0] in ("q_norm", "k_norm"):
            continue
        if path[0].startswith("gate"):
            position = variant.gate_position if path[0] == "gate" else path[0][len("gate_"):]
            key = {"kernel": "kernel", "kernel_a": "a", "kernel_b": "b", "bias": "bias"}[path[-1]]
            holder, leaf = params["gates"][position], key
        else:
            holder, leaf = params, path[0]
        for _ in range(2):
            index = tuple(rng.integers(0, n) for n in holder[leaf].shape)
            eps = 1e-5
            plus, minus = holder[leaf].copy(), holder[leaf].copy()
            plus[index] += eps
            minus[index] -= eps
            holder[leaf] = plus
            up = numpy_loss(params)
            holder[leaf] = minus
            down = numpy_loss(params)
            holder[leaf] = (plus + minus) / 2
            want = (up - down) / (2 * eps)
            got = float(np.asarray(grad.get_value())[index])
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-4, err_msg=str(path))
            checked += 1
    assert checked >= 8


def test_two_sigmoid_zero_init_is_the_ungated_layer_at_init():
    """2·sigmoid(0 · X) = 1: at step 0 the gated layer's output is the baseline's, exactly."""
    gated = Attention(tiny_cfg(VARIANTS["g1_two_sigmoid_zero_init"]), rngs=nnx.Rngs(params=0))
    plain = Attention(tiny_cfg(VARIANTS["baseline"]), rngs=nnx.Rngs(params=0))
    assert not np.any(np.asarray(gated.gate.kernel.get_value()))
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        getattr(plain, name).set_value(getattr(gated, name).get_value())
    x, positions, _ = inputs()
    x = jnp.asarray(x, jnp.float32)
    got, want = gated(x, jnp.asarray(positions)), plain(x, jnp.asarray(positions))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # ... and it is a gate: a trained (non-zero) kernel changes the output.
    gated.gate.kernel.set_value(jnp.full(gated.gate.kernel.get_value().shape, 0.5))
    assert np.abs(np.asarray(gated(x, jnp.asarray(positions)) - want)).max() > 1e-3


def test_bias_starts_at_its_init_value():
    module = Attention(tiny_cfg(VARIANTS["g1_bias_init_2"]), rngs=nnx.Rngs(params=0))
    np.testing.assert_array_equal(np.asarray(module.gate.bias.get_value()),
                                  np.full((H, HD), 2.0, np.float32))


# Hand counts for D=16, 4 heads over 2 kv heads, head_dim 8, one layer: G1 elementwise scores
# 4 x 8 = 32, headwise 4, G2 elementwise 2 x 8 = 16.
HAND_COUNTS = {
    "g1_sdpa_elementwise": 16 * 32,
    "g1_input_16th": 1 * 32,                      # round(16 / 16) = 1 input dimension
    "g1_input_12": 12 * 32,
    "g1_headwise_input_12": 12 * 4,
    "g1_rank_8": 16 * 8 + 8 * 32,
    "g1_two_sigmoid_zero_init": 16 * 32,
    "g1_bias_init_2": 16 * 32 + 32,
    "g1_g2": 16 * 32 + 16 * 16,
    "g1_g2_headwise": 16 * 4 + 16 * 2,
    "xsa": 0, "swa_32": 0,
    "xsa_g1": 16 * 32, "swa_32_g1": 16 * 32, "swa_32_g1_headwise": 16 * 4,
}


@pytest.mark.parametrize("name, want", sorted(HAND_COUNTS.items()))
def test_parameter_counts_by_hand(name, want):
    cfg = tiny_cfg(VARIANTS[name])
    added = count_params(cfg) - count_params(tiny_cfg(VARIANTS["baseline"]))
    assert added == want
    assert gate_params_closed_form(cfg) == want


def test_closed_form_counts_other_combinations():
    for variant, want in [
        (EXTRA["g2_rank_4_input_8"], 8 * 4 + 4 * 16),
        (EXTRA["g5_input_half_bias"], 8 * 16 + 16),
        (AttentionVariant(gate_position="query", extra_gate_positions="key,dense_output",
                          gate_rank=2), (16 * 2 + 2 * 32) + (16 * 2 + 2 * 16) + (16 * 2 + 2 * 16)),
    ]:
        cfg = tiny_cfg(variant).replace(num_layers=3)
        assert gate_params_closed_form(cfg) == 3 * want
        assert count_params(cfg) - count_params(cfg.replace(variant=VARIANTS["baseline"])) \
            == 3 * want


def test_xsa_on_a_hand_built_case():
    """One head, d=2: y = (3, 4), own value v = (1, 0): z = y - (y.v / |v|^2) v = (0, 4)."""
    y = jnp.asarray([[[[3.0, 4.0]]]])
    v = jnp.asarray([[[[2.0, 0.0]]]])  # |v| does not matter: the projection is normalised
    np.testing.assert_allclose(np.asarray(exclusive_self_attention(y, v)), [[[[0.0, 4.0]]]],
                               atol=1e-6)
    # GQA: query heads 0, 1 read kv head 0; heads 2, 3 read kv head 1.
    y = jnp.asarray(np.ones((1, 1, 4, 2)))
    v = jnp.asarray([[[[1.0, 0.0], [0.0, 1.0]]]])
    np.testing.assert_allclose(np.asarray(exclusive_self_attention(y, v))[0, 0],
                               [[0, 1], [0, 1], [1, 0], [1, 0]], atol=1e-7)


def test_window_mask_against_a_hand_built_mask():
    want = np.array([[1, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0],
                     [0, 1, 1, 0, 0],
                     [0, 0, 1, 1, 0],
                     [0, 0, 0, 1, 1]], bool)
    got = np.asarray(reference.attention_mask(5, 5, causal=True, window=2))[0, 0]
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(ref.window_mask(5, 5, 2), want)
    # Queries the last 2 of 5 keys (decoding), window 3: query 3 sees 1..3, query 4 sees 2..4.
    got = np.asarray(reference.attention_mask(2, 5, causal=True, window=3))[0, 0]
    np.testing.assert_array_equal(got, [[0, 1, 1, 1, 0], [0, 0, 1, 1, 1]])


@pytest.mark.parametrize("normalizer", ["softmax", "learned_sink"])
def test_windowed_reference_and_chunked_match_numpy(normalizer):
    rng = np.random.default_rng(3)
    b, s, h, kv, d = 2, 21, 4, 2, 8
    q, k, v = (rng.normal(size=(b, s, n, d)) for n in (h, kv, kv))
    segment_ids = np.array([[1] * 9 + [2] * 12, [1] * 21])
    sink = rng.normal(size=(h,)) if normalizer == "learned_sink" else None
    probs = ref.attention_probs_window(q, k, window=5, segment_ids=segment_ids,
                                       normalizer=normalizer, sink=sink)
    want = np.einsum("bhst,bthd->bshd", probs, np.repeat(v, h // kv, axis=2))
    args = [jnp.asarray(a, jnp.float32) for a in (q, k, v)]
    kw = dict(segment_ids=jnp.asarray(segment_ids, jnp.int32), normalizer=normalizer,
              sink_logits=None if sink is None else jnp.asarray(sink, jnp.float32), window=5)
    for impl in ("xla", "chunked"):
        extra = {"block_sizes": {"block_q": 4, "block_kv": 4}} if impl == "chunked" else {}
        got = ops.attention(*args, impl=impl, **kw, **extra)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5,
                                   err_msg=impl)
    # Blocks outside the window are skipped, not just masked: same values either way.
    got = chunked.attention(*args, block_q=4, block_kv=4, **kw)
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_windowed_chunked_gradients_match_reference():
    rng = np.random.default_rng(4)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 9, n, 8)), jnp.float32) for n in (4, 2, 2))

    def loss(fn, q, k, v):
        return jnp.sum(jnp.sin(fn(q, k, v, window=4)))

    # jitted, as training calls them (op by op each small op compiled on its own)
    want = jax.jit(jax.grad(lambda *a: loss(reference.attention, *a), argnums=(0, 1, 2)))(
        q, k, v)
    got = jax.jit(jax.grad(lambda *a: loss(lambda *b, **kw: chunked.attention(
        *b, block_q=4, block_kv=4, **kw), *a), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


def test_an_implementation_without_windows_names_those_with_them():
    q = jnp.zeros((1, 8, 2, 8))
    with pytest.raises(ValueError, match=r"impl='cudnn' has no sliding window \(window=4\); "
                                         r"choose one of xla, chunked, pallas_gpu, pallas_tpu, "
                                         r"splash or auto"):
        ops.attention(q, q, q, impl="cudnn", window=4)
    # cuDNN (first on GPUs) has no window: the Triton kernel serves it.
    assert ops.dispatch.resolve_impl("auto", segment_ids=None, normalizer="softmax",
                                     platform="gpu", dtype=jnp.bfloat16, window=4) == "pallas_gpu"
    assert ops.dispatch.resolve_impl("auto", segment_ids=None, normalizer="softmax",
                                     platform="cpu", dtype=jnp.float32, window=4) == "xla"
    with jax.enable_x64(False):  # jax's splash kernel does not trace with x64 on
        assert ops.dispatch.resolve_impl("auto", segment_ids=None, normalizer="softmax",
                                         platform="tpu", dtype=jnp.bfloat16,
                                         window=4) == "splash"


@pytest.mark.parametrize("fields, message", [
    (dict(gate_rank=4), "gate_rank, gate_scale, gate_init, gate_bias and extra_gate_positions "
                        "need a gate"),
    (dict(gate_position="sdpa", gate_init="ones"),
     "gate_init='ones' is not allowed; choose one of normal, zeros"),
    (dict(gate_position="sdpa", gate_input_fraction=1.5), "gate_input_fraction=1.5 must be in"),
    (dict(gate_position="sdpa", gate_input_dims=4, gate_input_fraction=0.5),
     "gate_input_dims and gate_input_fraction both set"),
    (dict(gate_position="sdpa", extra_gate_positions="G1"), "repeats a gated position"),
    (dict(gate_position="sdpa", extra_gate_positions="values"),
     "extra_gate_positions='values' is not allowed; choose one of sdpa, value"),
    (dict(gate_position="sdpa", granularity="headwise", extra_gate_positions="G5"),
     "'dense_output' \\(G5\\), which has no heads"),
    (dict(window=-1), "window=-1 must be >= 0"),
    (dict(gate_position="sdpa", gate_input="constant", gate_rank=2),
     "gate_input='constant' reads no input"),
    (dict(gate_position="sdpa", gate_scale=0.0), "gate_scale=0.0 must be > 0"),
])
def test_bad_combinations_raise_naming_the_field(fields, message):
    with pytest.raises(VariantError, match=message):
        AttentionVariant(**fields)


def test_gate_input_wider_than_the_model_is_refused():
    with pytest.raises(VariantError, match="gate_input_dims=32 must be <= d_model=16"):
        Attention(tiny_cfg(AttentionVariant(gate_position="sdpa", gate_input_dims=32)),
                  rngs=nnx.Rngs(params=0))
