"""The compiled work behind the lm-eval backend: scoring padded rows and decoding with a KV cache.

Scoring reads the model's final hidden states and forms the logits only at the scored
positions (a continuation's, not its context's), at most 128 positions at a time (a [batch,
length, vocab] array of a 151,936-entry vocabulary would not fit), keeping per position the
target's log-probability and whether it is the argmax, and, for rows that other requests
share, the last position's whole log-softmax. Continuations that share a context (the choices
of a multiple-choice question) run over that context's KV cache: the context once, not once
per choice. Decoding is the model's KV-cache path
(layers/kv_cache.py): one prefill of the left-padded prompts, then blocks of steps in one
`lax.scan` each, so stop sequences are checked on the host once per block.

The batch axis is split over the mesh's data x fsdp devices; parameters keep the sharding
they come with (replicated for a loaded checkpoint, the training layout inside a run). Every
host of a multi-host mesh runs the same calls on the same rows; results are replicated.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gated_attention.model.layers.kv_cache import empty_caches
from gated_attention.model.transformer import Transformer, per_layer
from gated_attention.parallel import sharding

LOGITS_CHUNK = 128


def _target_logp(x: jax.Array, table: jax.Array, targets: jax.Array
                 ) -> tuple[jax.Array, jax.Array]:
    """(target log-prob [b, K], target is argmax [b, K]) of hidden states x [b, K, d], the
    logits formed at most LOGITS_CHUNK positions at a time."""
    b, span, d = x.shape
    chunk = span if span <= LOGITS_CHUNK else math.gcd(span, LOGITS_CHUNK)

    def one(carry: None, piece: tuple[jax.Array, jax.Array]) -> tuple[None, tuple]:
        xc, tc = piece  # [b, chunk, d], [b, chunk]
        logits = jnp.einsum("bcD,VD->bcV", xc, table, preferred_element_type=jnp.float32)
        picked = jnp.take_along_axis(logits, tc[..., None], axis=-1)[..., 0]
        logp = picked - jax.nn.logsumexp(logits, axis=-1)
        return None, (logp, jnp.argmax(logits, axis=-1) == tc)

    pieces = (x.reshape(b, span // chunk, chunk, d).swapaxes(0, 1),
              targets.reshape(b, span // chunk, chunk).swapaxes(0, 1))
    _, (logp, greedy) = jax.lax.scan(one, None, pieces)
    return logp.swapaxes(0, 1).reshape(b, span), greedy.swapaxes(0, 1).reshape(b, span)


def _score(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array, targets: jax.Array,
           ends: jax.Array, *, want_last: bool) -> tuple[jax.Array, ...]:
    """(target log-prob [b, K], target is argmax [b, K], last position's log-softmax [b, V]
    or []) of the K positions ending at each row's `ends`: only the scored positions (a
    continuation, not its context) get the vocabulary projection."""
    model = nnx.merge(graphdef, state)
    x, table, _ = model.features(tokens)
    span = targets.shape[1]
    where = jnp.maximum(ends[:, None] - span + jnp.arange(span), 0)  # [b, K]
    x = jnp.take_along_axis(x, where[..., None], axis=1)
    logp, greedy = _target_logp(x, table, targets)
    if not want_last:
        return logp, greedy, jnp.zeros((0,), jnp.float32)
    logits = jnp.einsum("bD,VD->bV", x[:, -1], table, preferred_element_type=jnp.float32)
    return logp, greedy, jax.nn.log_softmax(logits, axis=-1)


def _score_shared(graphdef: nnx.GraphDef, state: nnx.State, contexts: jax.Array,
                  context_positions: jax.Array, owner: jax.Array, suffixes: jax.Array,
                  suffix_positions: jax.Array, targets: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """Continuations scored over their contexts' KV cache: each left-padded context [c, Lc]
    runs once, its cache rows are gathered to its continuations (`owner` [b]), and each
    suffix row [b, K] (the context's last token, then the continuation but its last token)
    runs over them; (target log-prob [b, K], target is argmax [b, K])."""
    model = nnx.merge(graphdef, state)
    caches = empty_caches(model.cfg, contexts.shape[0], contexts.shape[1] + suffixes.shape[1])
    model.features(contexts, positions=context_positions, kv_caches=caches)
    caches = jax.tree.map(lambda a: jnp.take(a, owner, axis=0) if a.ndim else a, caches)
    x, table, _ = model.features(suffixes, positions=suffix_positions, kv_caches=caches)
    return _target_logp(x, table, targets)


def _forward(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array, positions: jax.Array,
             caches: list) -> tuple[jax.Array, list]:
    model = nnx.merge(graphdef, state)
    logits, _ = model(tokens, positions=positions, kv_caches=caches)
    return logits[:, -1].astype(jnp.float32), caches


def choose(logits: jax.Array, key: jax.Array, temperature: float, top_p: float,
           top_k: int) -> jax.Array:
    """Greedy at temperature 0, else a draw from softmax(logits / T) within top-k and top-p."""
    if temperature <= 0.0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    # as transformers orders its warpers: temperature, then top-k, then top-p (nucleus)
    ranked, order = jax.lax.top_k(logits / temperature, logits.shape[-1])
    keep = jnp.arange(ranked.shape[-1]) < (top_k or ranked.shape[-1])
    probs = jax.nn.softmax(jnp.where(keep, ranked, -jnp.inf), axis=-1)
    keep &= jnp.cumsum(probs, axis=-1) - probs < top_p  # the most likely one always stays
    pick = jax.random.categorical(key, jnp.where(keep, ranked, -jnp.inf), axis=-1)
    return jnp.take_along_axis(order, pick[:, None], axis=-1)[:, 0].astype(jnp.int32)


def _prefill(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array,
             positions: jax.Array, *, cache_len: int) -> tuple[jax.Array, list]:
    cfg = nnx.merge(graphdef, state).cfg
    caches = empty_caches(cfg, tokens.shape[0], cache_len)
    return _forward(graphdef, state, tokens, positions, caches)


def _decode(graphdef: nnx.GraphDef, state: nnx.State, caches: list, logits: jax.Array,
            position: jax.Array, key: jax.Array, *, steps: int, temperature: float,
            top_p: float, top_k: int) -> tuple[list, jax.Array, jax.Array, jax.Array]:
    """`steps` new tokens per row [b, steps]; returns the state to continue from."""

    def body(carry: tuple, step_key: jax.Array) -> tuple[tuple, jax.Array]:
        caches, logits, position = carry
        token = choose(logits, step_key, temperature, top_p, top_k)
        logits, caches = _forward(graphdef, state, token[:, None], position[:, None], caches)
        return (caches, logits, position + 1), token

    (caches, logits, position), tokens = jax.lax.scan(
        body, (caches, logits, position), jax.random.split(key, steps))
    # replicated: every host reads every row (stop sequences are checked on the host)
    return caches, logits, position, jax.lax.with_sharding_constraint(tokens.T,
                                                                      PartitionSpec())


class Engine:
    """One model on one mesh: `score` rows and `decode` prompts, compiled per shape."""

    def __init__(self, model: Transformer, mesh: Mesh | None = None,
                 rules: Any = sharding.LOGICAL_RULES):
        self.mesh = mesh if mesh is not None else sharding.create_mesh({"data": -1})
        self.rules = rules
        self.cfg = model.cfg
        replicated = NamedSharding(self.mesh, PartitionSpec())
        self._replicated = replicated
        self._rows = sharding.batch_sharding(self.mesh, rules)
        self._vector = NamedSharding(self.mesh, PartitionSpec(self._rows.spec[0]))
        graphdef, state = nnx.split(model)
        self.state = _placed(state, replicated)
        self.graphdef = graphdef
        self._score = jax.jit(functools.partial(_score, graphdef),
                              static_argnames=("want_last",), out_shardings=replicated)
        self._decoder_state, self._decoder_jits, self._shared_jit = None, None, None
        self.row_multiple = int(np.prod([self.mesh.shape[a] for a in ("data", "fsdp")
                                         if a in self.mesh.shape]))

    def _put(self, array: np.ndarray, where: NamedSharding) -> jax.Array:
        return jax.make_array_from_callback(array.shape, where, lambda index: array[index])

    def score(self, tokens: np.ndarray, targets: np.ndarray, ends: np.ndarray,
              want_last: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right-padded rows [b, L]; targets [b, K] of the K positions before `ends` [b]."""
        with jax.set_mesh(self.mesh), sharding.logical_rules(self.rules):
            out = self._score(self.state, self._put(tokens, self._rows),
                              self._put(targets, self._rows), self._put(ends, self._vector),
                              want_last=want_last)
        return tuple(np.asarray(o) for o in out)

    def score_shared(self, contexts: np.ndarray, context_positions: np.ndarray,
                     owner: np.ndarray, suffixes: np.ndarray, suffix_positions: np.ndarray,
                     targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """See `_score_shared`: contexts run once, continuations over their KV cache."""
        state, *_ = self._decoding()
        with jax.set_mesh(self.mesh), sharding.logical_rules(self.rules):
            out = self._shared_jit(
                state, self._put(contexts, self._rows), self._put(context_positions, self._rows),
                self._put(owner, self._vector), self._put(suffixes, self._rows),
                self._put(suffix_positions, self._rows), self._put(targets, self._rows))
        return tuple(np.asarray(o) for o in out)

    def update(self, state: nnx.State) -> None:
        """New weights of the same model (a training run's later step): nothing recompiles."""
        self.state = _placed(state, self._replicated)
        self._decoder_state = None

    def _decoding(self) -> tuple[nnx.State, Any, Any]:
        """Per-layer blocks (the KV cache needs them) and the jitted prefill / decode."""
        if self._decoder_state is None:
            graphdef, self._decoder_state = nnx.split(
                per_layer(nnx.merge(self.graphdef, self.state)))
            if self._decoder_jits is None:
                self._decoder_jits = (
                    jax.jit(functools.partial(_prefill, graphdef),
                            static_argnames=("cache_len",)),
                    jax.jit(functools.partial(_decode, graphdef),
                            static_argnames=("steps", "temperature", "top_p", "top_k"),
                            donate_argnums=(1,)))
                self._shared_jit = jax.jit(functools.partial(_score_shared, graphdef),
                                           out_shardings=self._replicated)
        return (self._decoder_state, *self._decoder_jits)

    def generate(self, tokens: np.ndarray, positions: np.ndarray, *, max_new: int, block: int,
                 key: jax.Array, temperature: float, top_p: float, top_k: int,
                 finished: Any) -> np.ndarray:
        """New tokens [b, <= max_new rounded up to `block`] for left-padded prompts; stops
        early once `finished(tokens so far)` says every row is done."""
        state, prefill, decode = self._decoding()
        steps_total = -(-max_new // block) * block
        out = []
        with jax.set_mesh(self.mesh), sharding.logical_rules(self.rules):
            logits, caches = prefill(state, self._put(tokens, self._rows),
                                     self._put(positions, self._rows),
                                     cache_len=tokens.shape[1] + steps_total)
            position = self._put(positions[:, -1] + 1, self._vector)
            for done in range(0, steps_total, block):
                caches, logits, position, new = decode(
                    state, caches, logits, position, jax.random.fold_in(key, done), steps=block,
                    temperature=temperature, top_p=top_p, top_k=top_k)
                out.append(np.asarray(jax.device_get(new)))
                if finished(np.concatenate(out, axis=1)):
                    break
        return np.concatenate(out, axis=1)[:, :max_new]


def _placed(state: nnx.State, replicated: NamedSharding) -> nnx.State:
    """Arrays already on the mesh keep their layout; host or single-device ones replicate."""

    def one(x: Any) -> Any:
        if isinstance(x, jax.Array) and isinstance(x.sharding, NamedSharding) and (
                x.sharding.mesh.devices.size == replicated.mesh.devices.size):
            return x
        return jax.device_put(x, replicated)

    return jax.tree.map(one, state)
