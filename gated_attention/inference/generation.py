"""Text generation with a KV cache: one jitted prefill of the prompts, then a jitted decode loop.

    python -m gated_attention.generate --workdir=runs/x --prompt="The gate" --max_new_tokens=64
    python -m gated_attention.generate --hf=path/to/hf_folder --prompt="..." --temperature=0.7

Works for every variant (gates, MoE and all): the model's own forward pass runs on the new
tokens only, with each layer's keys and values kept in layers/kv_cache.py. Prompts of
different lengths are left-padded (their pads never attend or get attended to). Sampling is
greedy (temperature 0), or softmax(logits / temperature) restricted to the smallest set of
tokens whose probability reaches top_p (nucleus sampling). A continuation that shows nothing
(no tokens, only whitespace, one short piece repeated: what greedy decoding of an
under-trained model writes) gets a note on stderr saying so and what to try.

    decoder = Decoder(model, batch=1, max_len=128)
    logits, caches = decoder.prefill(tokens, positions)      # logits of the last position
    logits, caches = decoder.step(caches, next_token, position)
    new_tokens = generate(model, [prompt_ids], max_new_tokens=32)

KV-cache eviction (layers/kv_cache.py, StreamingLLM): `evict_window=W` keeps the last W
tokens, `keep_first=k` also the first k (`--evict_window=256 --keep_first=4`);
`streaming_logits` scores whole rows under the same eviction, chunk by chunk.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.core.errors import UserError
from gated_attention.model.layers.kv_cache import KVCache, empty_caches
from gated_attention.model.transformer import Transformer, per_layer

Caches = list[KVCache]


def top_p_filter(logits: jax.Array, top_p: float) -> jax.Array:
    """Logits [b, V] with every token outside the top-p nucleus set to -inf.

    The nucleus is the smallest set of most likely tokens whose probabilities sum to at least
    top_p; the most likely token is always kept.
    """
    if top_p >= 1.0:
        return logits
    order = jnp.argsort(-logits, axis=-1)
    sorted_logits = jnp.take_along_axis(logits, order, axis=-1)
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass of the more likely tokens
    keep_sorted = before < top_p
    keep = jnp.zeros_like(keep_sorted).at[
        jnp.arange(logits.shape[0])[:, None], order].set(keep_sorted)
    return jnp.where(keep, logits, -jnp.inf)


def sample(logits: jax.Array, key: jax.Array, temperature: float, top_p: float) -> jax.Array:
    """Next tokens [b] from float32 logits [b, V]."""
    if temperature <= 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    scaled = top_p_filter(logits / temperature, top_p)
    return jax.random.categorical(key, scaled, axis=-1).astype(jnp.int32)


def _forward(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array,
             positions: jax.Array, caches: Caches) -> tuple[jax.Array, Caches]:
    """Logits of the last new token [b, V] (float32), and the caches holding the new tokens."""
    model = nnx.merge(graphdef, state)
    logits, _ = model(tokens, positions=positions, kv_caches=caches)
    return logits[:, -1].astype(jnp.float32), caches


class Decoder:
    """Prefill and decode steps of one model for a fixed batch size and cache length."""

    def __init__(self, model: Transformer, *, batch: int, max_len: int, evict_window: int = 0,
                 keep_first: int = 0):
        self.cfg = model.cfg
        self.batch, self.max_len = batch, max_len
        self.evict_window, self.keep_first = evict_window, keep_first
        self.graphdef, self.state = nnx.split(model)
        self._forward = jax.jit(functools.partial(_forward, self.graphdef))

    def empty_caches(self) -> Caches:
        return empty_caches(self.cfg, self.batch, self.max_len, evict_window=self.evict_window,
                            keep_first=self.keep_first)

    def prefill(self, tokens: jax.Array, positions: jax.Array,
                caches: Caches | None = None) -> tuple[jax.Array, Caches]:
        """Run the prompts [b, P] (positions [b, P], negative for left padding)."""
        caches = self.empty_caches() if caches is None else caches
        return self._forward(self.state, tokens, positions, caches)

    def step(self, caches: Caches, token: jax.Array, position: jax.Array
             ) -> tuple[jax.Array, Caches]:
        """One new token per row [b] at `position` [b]."""
        return self._forward(self.state, token[:, None], position[:, None], caches)


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [b, P], positions [b, P]): prompts right-aligned, pads at negative positions."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise UserError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts)
    tokens = np.full((len(prompts), longest), pad_id, np.int32)
    positions = np.zeros((len(prompts), longest), np.int32)
    for row, prompt in enumerate(prompts):
        pad = longest - len(prompt)
        tokens[row, pad:] = prompt
        positions[row] = np.arange(longest) - pad
    return tokens, positions


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens", "temperature",
                                             "top_p", "eos_id"))
def _generate(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array,
              positions: jax.Array, caches: Caches, key: jax.Array, *, max_new_tokens: int,
              temperature: float, top_p: float, eos_id: int | None) -> jax.Array:
    logits, caches = _forward(graphdef, state, tokens, positions, caches)
    keys = jax.random.split(key, max_new_tokens)
    first = sample(logits, keys[0], temperature, top_p)
    start = positions[:, -1] + 1

    def body(carry, step_key):
        caches, token, position, done = carry
        logits, caches = _forward(graphdef, state, token[:, None], position[:, None], caches)
        nxt = sample(logits, step_key, temperature, top_p)
        if eos_id is not None:  # a finished row keeps emitting EOS
            done = done | (token == eos_id)
            nxt = jnp.where(done, eos_id, nxt)
        return (caches, nxt, position + 1, done), nxt

    done = jnp.zeros(first.shape, bool)
    _, rest = jax.lax.scan(body, (caches, first, start, done), keys[1:])
    return jnp.concatenate([first[:, None], rest.T], axis=1)


def generate(model: Transformer, prompts: Sequence[Sequence[int]], max_new_tokens: int, *,
             temperature: float = 0.0, top_p: float = 1.0, seed: int = 0,
             eos_id: int | None = None, pad_id: int = 0, evict_window: int = 0,
             keep_first: int = 0) -> np.ndarray:
    """New tokens [b, max_new_tokens] for each prompt (token ids), prefill + scan under jit."""
    if max_new_tokens < 1:
        raise UserError(f"max_new_tokens={max_new_tokens} must be >= 1")
    if not 0.0 < top_p <= 1.0:
        raise UserError(f"top_p={top_p} must be in (0, 1]")
    if temperature < 0:
        raise UserError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    tokens, positions = left_pad(prompts, pad_id)
    model = per_layer(model)  # one KV cache per layer: a scanned model is unstacked first
    graphdef, state = nnx.split(model)
    caches = empty_caches(model.cfg, len(prompts), tokens.shape[1] + max_new_tokens,
                          evict_window=evict_window, keep_first=keep_first)
    out = _generate(graphdef, state, jnp.asarray(tokens), jnp.asarray(positions), caches,
                    jax.random.key(seed), max_new_tokens=max_new_tokens,
                    temperature=float(temperature), top_p=float(top_p), eos_id=eos_id)
    return np.asarray(out)


@functools.partial(jax.jit, static_argnames=("graphdef",))
def _forward_all(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array,
                 positions: jax.Array, caches: Caches) -> tuple[jax.Array, Caches]:
    model = nnx.merge(graphdef, state)
    logits, _ = model(tokens, positions=positions, kv_caches=caches)
    return logits.astype(jnp.float32), caches


def streaming_logits(model: Transformer, tokens: np.ndarray | jax.Array, *, evict_window: int,
                     keep_first: int = 0, chunk: int = 0) -> jax.Array:
    """Logits [b, L, V] of rows [b, L] read through an evicting KV cache, `chunk` tokens at
    a time (default: the window): what a streaming model predicts at every position."""
    model = per_layer(model)
    tokens = jnp.asarray(tokens, jnp.int32)
    b, length = tokens.shape
    chunk = chunk or evict_window
    graphdef, state = nnx.split(model)
    caches = empty_caches(model.cfg, b, 0, evict_window=evict_window, keep_first=keep_first)
    out = []
    for start in range(0, length, chunk):
        piece = tokens[:, start:start + chunk]
        positions = jnp.broadcast_to(jnp.arange(start, start + piece.shape[1]), piece.shape)
        logits, caches = _forward_all(graphdef, state, piece, positions, caches)
        out.append(logits)
    return jnp.concatenate(out, axis=1)


# ------------------------------------ command line ------------------------------------

SHORTEST_LOOP = 8  # continuations this long or longer are checked for a repeated piece
LONGEST_PERIOD = 4  # a loop of up to this many tokens counts as "one piece repeated"


def degenerate(new_ids: Sequence[int], text: str) -> str:
    """Why a continuation shows nothing a reader can use ('' when it does): no tokens before
    the end-of-text token, only whitespace, or one piece of up to LONGEST_PERIOD tokens
    repeated over its second half. Greedy decoding of an under-trained model does all three
    (a 100-step model continued "The" with 40 newlines)."""
    ids = [int(i) for i in new_ids]
    if not ids:
        return "the model ended the text at once (end-of-text token)"
    if not text.strip():
        return "the continuation is only whitespace"
    tail = ids[len(ids) // 2:]
    if len(ids) >= SHORTEST_LOOP and any(
            all(tail[i] == tail[i % period] for i in range(len(tail)))
            for period in range(1, LONGEST_PERIOD + 1)):
        return "the continuation repeats one short piece"
    return ""


def continuation(new: np.ndarray, tokenizer: Any, *, ignore_eos: bool, temperature: float
                 ) -> tuple[str, str]:
    """(the new tokens' text, cut at the first end-of-text token unless `ignore_eos`; a note
    saying why it shows nothing and what to try, or '')."""
    eos = np.flatnonzero(new == tokenizer.eos_id)
    if eos.size and not ignore_eos:
        new = new[: eos[0]]
    text = tokenizer.decode([int(i) for i in new])
    reason = degenerate(new, text)
    return text, degenerate_note(reason, temperature) if reason else ""


def degenerate_note(reason: str, temperature: float) -> str:
    """The note printed under a degenerate continuation: what it means and what to try."""
    if temperature <= 0:
        advice = ("greedy decoding (--temperature=0, the default) of a model this under-trained "
                  "picks its most common piece again and again; sample instead, e.g. "
                  "--temperature=0.7 --top_p=0.9, ")
    else:
        advice = "the model has not learned enough to write yet; "
    return (f"note: {reason}: {advice}or use a model trained longer (`make demo`'s text "
            "models trained 100 steps)")


def load_for_generation(workdir: str = "", hf_dir: str = "") -> tuple[Transformer, Any, Any]:
    """(model, run config, tokenizer) of a run's workdir or of a Hugging Face folder."""
    if bool(workdir) == bool(hf_dir):
        raise UserError("give exactly one of --workdir (a run) and --hf (a Hugging Face folder)")
    from gated_attention.data.tokenizer import get_tokenizer

    if hf_dir:
        from gated_attention import hf
        from gated_attention.hf import run_files

        model, config = hf.load_pretrained(hf_dir)
        # the folder's tokenizer and input settings (data.add_bos, ...), as an import reads them
        if not run_files.apply(pathlib.Path(hf_dir), config):
            raise FileNotFoundError(f"{hf_dir} holds no tokenizer: --hf needs the model's "
                                    "tokenizer.model or tokenizer.json beside config.json")
        tokenizer = get_tokenizer(config.data.tokenizer, config.model.vocab_size,
                                  model_path=config.data.get("tokenizer_path", ""))
        return model, config, tokenizer
    from gated_attention.training import loop

    model, config = loop.load_params(workdir)
    tokenizer = get_tokenizer(config.data.tokenizer, config.model.vocab_size, workdir=workdir,
                              model_path=config.data.get("tokenizer_path", ""))
    return model, config, tokenizer


def encode_prompt(text: str, tokenizer: Any, config: Any) -> list[int]:
    """The prompt's ids as the run's input had them (a BOS first when data.add_bos)."""
    prompt = [int(i) for i in tokenizer.encode([text])[0]]
    if config.data.get("add_bos", False):
        prompt = [int(tokenizer.bos_id)] + prompt
    return prompt
