"""KV-cache decoding against recomputing the whole prefix, for every kind of model; padding;
sampling rules checked against hand-computed distributions."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention.config.run_config import base_config, model_config
from gated_attention.inference import generation as gen
from gated_attention.model.transformer import build_model


def tiny_model(arch: str = "tiny", variant: str = "baseline", **model_fields):
    config = base_config(arch, variant)
    config.model.update(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                        mlp_dim=32, vocab_size=48, **model_fields)
    if arch == "tiny_moe":
        config.model.update(num_experts=4, experts_per_token=2, expert_mlp_dim=16)
    return build_model(model_config(config), seed=1)


@nnx.jit
def full_logits(model, tokens):
    """The whole sequence in one causal pass: position t's logits are those of prefix [:t+1]."""
    return model(tokens)[0]


@pytest.mark.parametrize("arch,variant,fields", [
    ("tiny", "baseline", {"qkv_bias": True, "o_proj_bias": True}),
    ("tiny", "g1_sdpa_elementwise", {"tied_embeddings": False}),
    ("tiny", "learned_sink", {}),
    ("tiny_moe", "g1_sdpa_headwise", {}),
])
def test_cached_decoding_equals_recomputation_at_every_step(arch, variant, fields):
    model = tiny_model(arch, variant, **fields)
    if fields.get("qkv_bias"):  # zero-initialised: give the biases values that matter
        for layer in model.layers:
            for name in ("q_bias", "k_bias", "v_bias", "o_bias"):
                p = getattr(layer.attention, name)
                p[...] = 0.3 * jax.random.normal(jax.random.key(7), p[...].shape, jnp.float32)
    prompt = np.array([[5, 9, 2, 30, 11], [7, 7, 1, 40, 3]], np.int32)
    steps = 4
    decoder = gen.Decoder(model, batch=2, max_len=prompt.shape[1] + steps)
    positions = np.broadcast_to(np.arange(prompt.shape[1]), prompt.shape)
    logits, caches = decoder.prefill(jnp.asarray(prompt), jnp.asarray(positions))
    sequence, cached = prompt, [np.asarray(logits)]
    for _ in range(steps):
        token = np.asarray(jnp.argmax(logits, -1), np.int32)
        position = np.full((2,), sequence.shape[1], np.int32)
        logits, caches = decoder.step(caches, jnp.asarray(token), jnp.asarray(position))
        sequence = np.concatenate([sequence, token[:, None]], axis=1)
        cached.append(np.asarray(logits))
    full = np.asarray(full_logits(model, jnp.asarray(sequence)))
    for step, logits in enumerate(cached):
        np.testing.assert_allclose(logits, full[:, prompt.shape[1] - 1 + step], atol=2e-5,
                                   rtol=0, err_msg=f"step {step}")


def test_greedy_scan_is_greedy_and_padding_changes_nothing():
    model = tiny_model(variant="g1_sdpa_elementwise")
    prompts = [[5, 9, 2, 30, 11], [7, 1, 4, 4, 9]]
    alone = gen.generate(model, prompts, max_new_tokens=5)
    for row, prompt in enumerate(prompts):  # every new token is the argmax of a full pass
        sequence = np.array([prompt + list(alone[row])], np.int32)
        full = np.asarray(full_logits(model, jnp.asarray(sequence)))[0]
        np.testing.assert_array_equal(full[len(prompt) - 1:-1].argmax(-1), alone[row])
    # a shorter prompt beside a longer one is left-padded; its tokens do not change
    padded = gen.generate(model, [prompts[0], prompts[1][2:]], max_new_tokens=5)
    short = gen.generate(model, [prompts[1][2:], prompts[1][2:]], max_new_tokens=5)
    np.testing.assert_array_equal(padded[0], alone[0])
    np.testing.assert_array_equal(padded[1], short[0])
    # EOS ends a row: once emitted, it repeats
    eos = int(alone[0, 1])
    ended = gen.generate(model, prompts, max_new_tokens=5, eos_id=eos)
    assert list(ended[0]) == list(alone[0, :2]) + [eos] * 3


def test_top_p_keeps_the_smallest_nucleus():
    probs = np.array([[0.5, 0.2, 0.25, 0.05]])
    logits = jnp.log(jnp.asarray(probs, jnp.float32))
    kept = np.isfinite(np.asarray(gen.top_p_filter(logits, 0.7)))
    np.testing.assert_array_equal(kept, [[True, False, True, False]])  # 0.5 + 0.25 >= 0.7
    kept = np.isfinite(np.asarray(gen.top_p_filter(logits, 0.5)))
    np.testing.assert_array_equal(kept, [[True, False, False, False]])
    # sampling follows the renormalised nucleus: 0.5 / 0.75 and 0.25 / 0.75
    rows = jnp.tile(logits, (2000, 1))  # 2000 independent draws, one per row
    draws = np.asarray(gen.sample(rows, jax.random.key(0), 1.0, 0.7))
    assert set(np.unique(draws)) == {0, 2}
    assert abs(np.mean(draws == 0) - 2 / 3) < 0.04  # 4 standard errors
    # greedy ignores the key
    assert int(gen.sample(logits, jax.random.key(1), 0.0, 1.0)[0]) == 0


def test_bad_arguments_are_refused():
    model = tiny_model()
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        gen.generate(model, [[1]], 0)
    with pytest.raises(ValueError, match="top_p=1.5"):
        gen.generate(model, [[1]], 2, top_p=1.5)
    with pytest.raises(ValueError, match="at least one token"):
        gen.generate(model, [[]], 2)
    caches = gen.empty_caches(model.cfg, 1, 4)
    with pytest.raises(ValueError, match="capture needs the whole sequence"):
        model(jnp.asarray([[1, 2]]), capture={"attention_probs"}, kv_caches=caches)


def test_a_scanned_model_generates_what_its_per_layer_twin_generates():
    """Scanned layers (the paper archs' default) decode through per-layer KV caches."""
    from gated_attention.model.transformer import per_layer

    config = base_config("tiny", "g1_sdpa_elementwise")
    config.model.num_layers = 2
    scanned = build_model(model_config(config).replace(scan_layers=True), seed=3)
    twin = per_layer(scanned)
    assert not twin.cfg.scan_layers and len(twin.layers) == 2
    tokens = jnp.asarray([[5, 6, 7, 8, 9]])
    np.testing.assert_allclose(np.asarray(scanned(tokens)[0]), np.asarray(twin(tokens)[0]),
                               rtol=1e-5, atol=1e-5)
    prompts = [[5, 6, 7], [9, 10, 11]]
    np.testing.assert_array_equal(gen.generate(scanned, prompts, 4),
                                  gen.generate(twin, prompts, 4))


@pytest.mark.reference("golden")
def test_a_continuation_that_shows_nothing_says_so_and_what_to_try():
    """Greedy decoding of the demo's 100-step model continued "The" with 40 newlines and no
    word about it. Byte tokens: each id is a character, so the cases are written as text."""
    from gated_attention.data.tokenizer import ByteTokenizer

    tok = ByteTokenizer()

    def ids(text: str) -> np.ndarray:
        return tok.encode([text])[0]

    text, note = gen.continuation(ids("\n" * 40), tok, ignore_eos=False, temperature=0.0)
    assert text == "\n" * 40
    assert note.startswith("note: the continuation is only whitespace: greedy decoding")
    assert "--temperature=0.7 --top_p=0.9" in note
    _, note = gen.continuation(ids(" \n\t "), tok, ignore_eos=False, temperature=0.7)
    assert "only whitespace" in note and "--temperature=0.7" not in note  # it sampled already
    _, note = gen.continuation(ids("the " * 10), tok, ignore_eos=False, temperature=0.0)
    assert "repeats one short piece" in note  # a loop of 4 tokens
    eos_first = np.concatenate([[tok.eos_id], ids("text after the end")])
    text, note = gen.continuation(eos_first, tok, ignore_eos=False, temperature=0.0)
    assert text == "" and "ended the text at once" in note
    # Text that reads as text: printed as it is, with no note; cut at the end-of-text token.
    words = np.concatenate([ids("Return the rgetigce of of the"), [tok.eos_id], ids("zz")])
    assert gen.continuation(words, tok, ignore_eos=False, temperature=0.7) == (
        "Return the rgetigce of of the", "")
    assert gen.continuation(words, tok, ignore_eos=True, temperature=0.7)[0].endswith("zz")
    assert gen.degenerate(ids("abcabcabcabd"), "abcabcabcabd") == ""  # the loop breaks
