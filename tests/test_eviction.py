"""KV-cache eviction (StreamingLLM): a cache of W tokens (and the first k) gives the logits of
attention restricted to those tokens, with positions inside the cache."""

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as ref
import pytest
from flax import nnx
from test_beyond_variants import numpy_variant, randomise, tiny_cfg

from gated_attention.inference import generation as gen
from gated_attention.model.layers.attention import Attention
from gated_attention.model.layers.kv_cache import KVCache
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.transformer import build_model
from gated_attention.model.variants import VARIANTS


def run_streaming(module, x, *, window, keep_first, chunk):
    """The layer over x [b, L, D] through an evicting cache, `chunk` tokens per call."""
    b, length, _ = x.shape
    cfg = module.cfg
    cache = KVCache.empty(b, 0, cfg.heads[1], cfg.head_dim, evict_window=window,
                          keep_first=keep_first)
    graphdef, state = nnx.split(module)

    @jax.jit
    def step(state, piece, positions, cache):
        return nnx.merge(graphdef, state)(piece, positions, kv_cache=cache), cache

    outs = []
    for start in range(0, length, chunk):
        piece = jnp.asarray(x[:, start:start + chunk], jnp.float32)
        positions = jnp.broadcast_to(jnp.arange(start, start + piece.shape[1]), piece.shape[:2])
        out, cache = step(state, piece, positions, cache)
        outs.append(np.asarray(out))
    return np.concatenate(outs, axis=1)


@pytest.mark.parametrize("name, keep_first, chunk", [
    ("baseline", 0, 1), ("g1_sdpa_elementwise", 2, 3),
    ("learned_sink", 1, 5), ("xsa_g1", 2, 4)])
def test_cached_attention_equals_attention_over_the_kept_tokens(name, keep_first, chunk):
    """Output at query i = the numpy layer run on [x_0..x_{k-1}, x_{i-W+1}..x_i] alone, at
    positions 0..k+W-1 (for every query once the cache is full)."""
    variant, window = VARIANTS[name], 4
    module = Attention(tiny_cfg(variant), rngs=nnx.Rngs(params=0))
    params = randomise(module, seed=1)
    x = np.random.default_rng(2).normal(size=(2, 11, 16))
    got = run_streaming(module, x, window=window, keep_first=keep_first, chunk=chunk)
    fields = numpy_variant(variant)
    for i in range(keep_first + window - 1, x.shape[1]):
        kept = list(range(keep_first)) + list(range(i - window + 1, i + 1))
        positions = np.tile(np.arange(len(kept)), (2, 1))
        want = ref.attention_layer_beyond(x[:, kept], params, fields, positions=positions)
        np.testing.assert_allclose(got[:, i], want[:, -1], rtol=2e-4, atol=2e-5,
                                   err_msg=f"query {i}")
    # Before the cache fills, every earlier token is still there: plain causal attention.
    full = ref.attention_layer_beyond(x, params, fields, positions=np.tile(np.arange(11), (2, 1)))
    early = keep_first + window - 1
    np.testing.assert_allclose(got[:, :early], full[:, :early], rtol=2e-4, atol=2e-5)


@pytest.mark.slow
def test_window_without_kept_tokens_is_sliding_window_attention():
    """Without kept tokens, relative positions are the true ones: the model's streaming logits
    equal its full forward pass with a sliding window of W."""
    cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=48, variant=VARIANTS["g1_sdpa_headwise"])
    model = build_model(cfg, seed=0)
    windowed = build_model(cfg.replace(variant=cfg.variant.replace(window=5)), seed=0)
    tokens = np.random.default_rng(0).integers(0, 64, (2, 17))
    got = gen.streaming_logits(model, tokens, evict_window=5, chunk=3)
    want, _ = windowed(jnp.asarray(tokens, jnp.int32))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_generation_with_a_big_enough_window_is_unchanged():
    cfg = ModelConfig(vocab_size=64, num_layers=2, d_model=32, num_heads=4, num_kv_heads=2,
                      head_dim=8, mlp_dim=48, variant=VARIANTS["g1_sdpa_elementwise"])
    model = build_model(cfg, seed=0)
    prompts = [[1, 2, 3, 4, 5], [7, 8, 9]]
    plain = gen.generate(model, prompts, 6)
    evicting = gen.generate(model, prompts, 6, evict_window=16, keep_first=2)
    np.testing.assert_array_equal(plain, evicting)


def test_bad_eviction_settings_name_the_field():
    with pytest.raises(ValueError, match="keep_first=2 needs evict_window > 0"):
        KVCache.empty(1, 8, 2, 8, keep_first=2)
    with pytest.raises(ValueError, match="evict_window=-1 and keep_first=0 must be >= 0"):
        KVCache.empty(1, 8, 2, 8, evict_window=-1)


def test_eviction_eval_refuses_bad_windows_before_loading(tmp_path):
    from gated_attention.analysis import length as evaluate_length

    with pytest.raises(FileNotFoundError, match="holds no config.json"):
        evaluate_length.eviction_eval(tmp_path, [8])
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"--evict_windows=\[0\] must be >= 1"):
        evaluate_length.eviction_eval(tmp_path, [0])
