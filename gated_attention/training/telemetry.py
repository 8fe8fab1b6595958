"""Sink, gate and activation statistics while a run trains (train.telemetry_every).

After every `train.telemetry_every` updates (not at step 0) the training loop runs one extra
forward pass, without gradients, on rows of the step's own batch and the weights that step
starts from. The rows are one micro-batch (train.batch_size / train.grad_accum, the rows the
train step holds activations for at once; rows i, i+k, ... so they stay spread over every data
shard), or `train.telemetry_rows` of them: the statistics of the whole global batch at once
would hold grad_accum times the step's activations (the 1.7B paper recipe: 379 GiB per v5p
chip), so a run whose step fits would die at its first telemetry point. The cost is one
forward of those rows every N steps (at most 1/(3N) of the training FLOPs, plus the
first-token pass below).
Per layer, and per head where the quantity is a head's:

- F-Attn: the weight each query puts on the first token of its own segment (the row's
  first token when there are no segment ids), averaged over queries, leaving out each
  segment's first query (it sees only itself) and padding; beside it the level a uniform
  causal head gives on the same rows (f_attn_uniform); the sink rate is the share of
  (layer, head) pairs whose F-Attn exceeds 0.3 (Gu et al.'s threshold, so the numbers
  compare with theirs).
- gate scores: mean and a histogram (fixed bins over the activation's range, as analysis).
- M-Act: the largest |layer output| (the residual stream after the block).
- gate weight norms (Frobenius, per layer and per head).

Nothing S x S is materialised. The first-token weight is exp(x_f - L) where x_f is the
query's logit on its segment's first key and L the normaliser's log-denominator, which
`first_token_weights` computes here blockwise (query blocks x key blocks, an online running
max and sum, as a flash kernel does) with plain XLA ops, so it works whatever attention
implementation the run trains with (XLA, Pallas, splash, cuDNN): they all compute the same
logits from the same q and k. Cost: one q.k^T over every (query block, key block) pair,
without skipping the blocks above the diagonal, i.e. 2 x b x S^2 x heads x head_dim FLOPs per
layer, about the forward's own QK^T counted without causal skipping, once every N steps.
The attention layer hands q and k (after QK-norm and RoPE) to the analysis capture
`first_token_attention`; during the telemetry forward that capture is routed to this
module's blockwise, segment-aware version.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.model import capture as capture_lib
from gated_attention.model import reductions
from gated_attention.ops import reference

SINK_THRESHOLD = 0.3
CAPTURES = ("first_token_attention", "gate_scores", "resid_after_ffn")
BLOCK = 256  # query and key block of the first-token pass
NEG = -1e30


def segment_starts(segment_ids: jax.Array | None, shape: tuple[int, int]) -> jax.Array:
    """[b, s] int32: the index of the first token of each token's segment (0 without ids)."""
    b, s = shape
    if segment_ids is None:
        return jnp.zeros((b, s), jnp.int32)
    index = jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (b, s))
    change = jnp.concatenate([jnp.ones((b, 1), bool),
                              segment_ids[:, 1:] != segment_ids[:, :-1]], axis=1)
    return jax.lax.cummax(jnp.where(change, index, 0), axis=1)


def first_token_weights(q: jax.Array, k: jax.Array, *, segment_ids: jax.Array | None = None,
                        causal: bool = True, normalizer: str = "softmax",
                        sink_logits: jax.Array | None = None, scale: float | None = None,
                        block: int | None = None, window: int = 0) -> jax.Array:
    """[b, heads, q_len]: each query's attention weight on its segment's first key.

    q [b, s, heads, d], k [b, s, kv_heads, d] (self-attention: the same positions); window > 0:
    sliding-window attention (a query sees its last `window` keys; a first key outside the
    window gets weight 0). The
    normaliser's log-denominator is accumulated over key blocks with a running max, so at
    most b x heads x block x block logits are alive.
    """
    if not causal:
        raise ValueError("telemetry's first-token weights are for causal attention")
    b, s, h, d = q.shape
    n = k.shape[2]
    g = h // n
    dtype = jnp.promote_types(q.dtype, k.dtype)
    scale = d**-0.5 if scale is None else scale
    starts = segment_starts(segment_ids, (b, s))
    seg = jnp.ones((b, s), jnp.int32) if segment_ids is None else segment_ids
    qg = q.reshape(b, s, n, g, d).astype(dtype)
    kd = k.astype(dtype)
    k_first = jnp.take_along_axis(kd, starts[:, :, None, None], axis=1)  # [b, s, n, d]
    first = jnp.einsum("bsngd,bsnd->bngs", qg, k_first) * scale
    block = min(BLOCK if block is None else block, s)
    pad = (-s) % block
    blocks = (s + pad) // block
    q_pad = jnp.pad(qg, ((0, 0), (0, pad), (0, 0), (0, 0), (0, 0)))
    k_pad = jnp.pad(kd, ((0, 0), (0, pad), (0, 0), (0, 0)))
    seg_pad = jnp.pad(seg, ((0, 0), (0, pad)), constant_values=-1)
    softpick = normalizer == "softpick"

    def query_block(i: jax.Array) -> tuple[jax.Array, jax.Array]:
        q_blk = jax.lax.dynamic_slice_in_dim(q_pad, i * block, block, axis=1)
        seg_q = jax.lax.dynamic_slice_in_dim(seg_pad, i * block, block, axis=1)
        q_pos = i * block + jnp.arange(block)

        def key_block(carry: tuple[jax.Array, jax.Array], j: jax.Array):
            m, total = carry
            k_blk = jax.lax.dynamic_slice_in_dim(k_pad, j * block, block, axis=1)
            seg_k = jax.lax.dynamic_slice_in_dim(seg_pad, j * block, block, axis=1)
            k_pos = j * block + jnp.arange(block)
            logits = jnp.einsum("bqngd,bknd->bngqk", q_blk, k_blk) * scale
            near = q_pos[:, None] >= k_pos[None, :]
            if window:
                near = near & (q_pos[:, None] - k_pos[None, :] < window)
            visible = (near[None] & (seg_q[:, :, None] == seg_k[:, None, :]))[:, None, None]
            masked = jnp.where(visible, logits, NEG)
            new_m = jnp.maximum(m, jnp.max(masked, axis=-1))
            if softpick:  # sum |e^(x - m) - e^(-m)| over visible keys
                terms = jnp.abs(jnp.exp(masked - new_m[..., None]) - jnp.exp(-new_m)[..., None])
            else:
                terms = jnp.exp(masked - new_m[..., None])
            total = total * jnp.exp(m - new_m) + jnp.sum(jnp.where(visible, terms, 0.0), -1)
            return (new_m, total), None

        init_m = jnp.full((b, n, g, block), 0.0 if softpick else NEG, dtype)
        init = (init_m, jnp.zeros((b, n, g, block), dtype))
        (m, total), _ = jax.lax.scan(key_block, init, jnp.arange(blocks))
        return m, total

    m, total = jax.lax.map(query_block, jnp.arange(blocks))  # [blocks, b, n, g, block]
    m = jnp.moveaxis(m, 0, 3).reshape(b, n, g, blocks * block)[..., :s]
    total = jnp.moveaxis(total, 0, 3).reshape(b, n, g, blocks * block)[..., :s]
    if normalizer == "softmax":
        weight = jnp.exp(first - m) / total
    elif normalizer == "softmax_off_by_one":
        top = jnp.maximum(m, 0.0)
        weight = jnp.exp(first - top) / (jnp.exp(-top) + total * jnp.exp(m - top))
    elif normalizer == "learned_sink":
        sink = sink_logits.astype(dtype).reshape(1, n, g, 1)
        top = jnp.maximum(m, sink)
        weight = jnp.exp(first - top) / (jnp.exp(sink - top) + total * jnp.exp(m - top))
    elif normalizer == "softpick":
        weight = (jax.nn.relu(jnp.exp(first - m) - jnp.exp(-m))
                  / (total + reference.SOFTPICK_EPS * jnp.exp(-m)))
    else:
        raise ValueError(f"normalizer={normalizer!r} is not allowed; choose one of "
                         f"{reference.NORMALIZERS}")
    if window:  # the segment's first key is out of reach of queries `window` or more past it
        reach = (jnp.arange(s)[None, :] - starts) < window
        weight = jnp.where(reach[:, None, None, :], weight, 0.0)
    return weight.reshape(b, h, s)


@contextlib.contextmanager
def _segment_first_token_capture() -> Iterator[None]:
    """Route the attention layer's first_token_attention capture to this module's version
    while a telemetry forward is traced."""
    original = reference.first_token_weights
    reference.first_token_weights = first_token_weights
    try:
        yield
    finally:
        reference.first_token_weights = original


def query_mask(segment_ids: jax.Array | None, shape: tuple[int, int]) -> jax.Array:
    """[b, s] bool: the queries F-Attn averages over (real tokens that are not the first of
    their segment)."""
    index = jnp.arange(shape[1])[None]
    return reductions.token_mask(segment_ids, shape) & (
        segment_starts(segment_ids, shape) != index)


def uniform_first_token_weight(segment_ids: jax.Array | None, shape: tuple[int, int]
                               ) -> jax.Array:
    """F-Attn a uniform causal head would give on these rows: the mean over F-Attn's queries
    of 1 / (keys the query sees in its segment). With segments (packed documents, BOS at each)
    it is higher than the whole row's level, so a sink is judged against this one."""
    index = jnp.arange(shape[1])[None]
    seen = (index - segment_starts(segment_ids, shape) + 1).astype(jnp.float32)
    queries = query_mask(segment_ids, shape).astype(jnp.float32)
    return jnp.sum(queries / seen) / jnp.maximum(jnp.sum(queries), 1.0)


def histogram(values: jax.Array, weights: jax.Array, lo: float, hi: float,
              bins: int = reductions.HISTOGRAM_BINS) -> jax.Array:
    """Counts of `values` in `bins` equal bins over [lo, hi] (outside values clipped in),
    each value counted with its weight (0 for padding).

    A compare against every bin and a sum, not a scatter-add: the TPU compiler costs a
    scatter-add at about 8 KB of memory traffic per value (G1 elementwise at 1.7B: 2.8e11
    bytes per layer, 15% of a step at telemetry_every=100), the fused compare-and-sum at
    32 bytes."""
    position = jnp.floor((values - lo) / (hi - lo) * bins)
    index = jnp.clip(position, 0, bins - 1).astype(jnp.int32)
    in_bin = index.reshape(-1, 1) == jnp.arange(bins, dtype=jnp.int32)  # [values, bins]
    return jnp.sum(jnp.where(in_bin, weights.astype(jnp.float32).reshape(-1, 1), 0.0), axis=0)


def gate_norms(params: Any, cfg: Any) -> dict[str, list[Any]]:
    """Frobenius norm of each layer's gate weights (kernel [D, heads(, d)], or theta
    [heads(, d)] of an input-independent gate), and per head unless the gate is G5's."""
    per_layer: dict[int, jax.Array] = {}
    per_head: dict[int, jax.Array] = {}
    headed = cfg.variant.gate_position != "dense_output"
    for path, value in jax.tree_util.tree_leaves_with_path(params):
        parts = [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]
        if parts and parts[-1] == "value":
            parts = parts[:-1]
        if "gate" not in parts or parts[-1] not in ("kernel", "theta"):
            continue
        layer = next((int(p) for p in parts if p.isdigit()), None)
        stacked = [value] if layer is not None else [value[i] for i in range(value.shape[0])]
        for offset, w in enumerate(stacked):
            i = layer if layer is not None else offset
            w = w.astype(jnp.float32)
            per_layer[i] = jnp.sqrt(jnp.sum(jnp.square(w)))
            if headed:
                axis = 1 if parts[-1] == "kernel" else 0
                others = tuple(a for a in range(w.ndim) if a != axis)
                per_head[i] = jnp.sqrt(jnp.sum(jnp.square(w), axis=others))
    layers = sorted(per_layer)
    return {"gate_norm_per_layer": [per_layer[i] for i in layers],
            "gate_norm_per_head": [per_head[i] for i in layers if i in per_head]}


def telemetry_rows(config: Any, batch_shards: int = 1) -> int:
    """How many rows of the global batch a telemetry point reads: train.telemetry_rows, or
    (0, the default) one micro-batch. ConfigError unless they divide the batch into equal
    pieces that split evenly over the mesh's `batch_shards`."""
    from gated_attention.core.checks import ConfigError

    train = config.train
    asked = train.get("telemetry_rows", 0)
    if isinstance(asked, bool) or not isinstance(asked, int) or asked < 0:
        raise ConfigError(f"train.telemetry_rows={asked!r} must be an integer >= 0 (0 = one "
                          "micro-batch, train.batch_size / train.grad_accum rows)")
    rows = asked or train.batch_size // train.grad_accum
    if train.batch_size % rows or rows % batch_shards:
        raise ConfigError(f"train.telemetry_rows={asked} must divide train.batch_size="
                          f"{train.batch_size} and be divisible by the mesh's {batch_shards} "
                          "batch shards (0 = one micro-batch)")
    return rows


def first_rows(batch: Mapping[str, jax.Array], pieces: int) -> dict[str, jax.Array]:
    """Rows 0, k, 2k, ... of the batch (k = pieces): the first of the train step's
    micro-batches when pieces = grad_accum (step.split_micro_batches), spread over every data
    shard as the batch is: taken through the same reshape, so each shard keeps its own rows."""
    return {name: x.reshape(x.shape[0] // pieces, pieces, *x.shape[1:])[:, 0]
            for name, x in batch.items()}


def make_telemetry_fn(graphdef: nnx.GraphDef, config: Any):
    """A pure `(params, batch) -> dict of arrays` with every statistic of one telemetry point,
    read from `telemetry_rows(config)` rows of the global batch it is given."""
    from gated_attention.config import run_config

    cfg = run_config.model_config(config)
    lo, hi = reductions.HISTOGRAM_RANGES[cfg.variant.activation]
    pieces = config.train.batch_size // telemetry_rows(config)

    def telemetry(params: Any, batch: Mapping[str, jax.Array]) -> dict[str, Any]:
        batch = first_rows(batch, pieces)
        model = nnx.merge(graphdef, params)
        segment_ids = batch.get("segment_ids")
        shape = batch["inputs"].shape
        with _segment_first_token_capture():
            model(batch["inputs"], positions=batch.get("positions"), segment_ids=segment_ids,
                  capture=CAPTURES)
        layers = capture_lib.collect(model)
        queries = query_mask(segment_ids, shape).astype(jnp.float32)  # [b, s]
        tokens = reductions.token_mask(segment_ids, shape)
        count = jnp.maximum(jnp.sum(queries), 1.0)
        out: dict[str, Any] = {
            "f_attn_per_head": [jnp.einsum("bhs,bs->h", layer["first_token_attention"]
                                           .astype(jnp.float32), queries) / count
                                for layer in layers],
            "f_attn_uniform": uniform_first_token_weight(segment_ids, shape),
            "m_act_per_layer": [jnp.max(jnp.where(tokens[..., None],
                                                  jnp.abs(layer["resid_after_ffn"]), 0.0))
                                .astype(jnp.float32) for layer in layers],
        }
        if all("gate_scores" in layer for layer in layers):
            means, hists = [], []
            for layer in layers:
                scores = layer["gate_scores"].astype(jnp.float32)
                w = jnp.broadcast_to(tokens.reshape(*shape, *([1] * (scores.ndim - 2))),
                                     scores.shape).astype(jnp.float32)
                means.append(jnp.sum(scores * w) / jnp.maximum(jnp.sum(w), 1.0))
                hists.append(histogram(scores, w, lo, hi))
            out["gate_mean_per_layer"] = means
            out["gate_hist_per_layer"] = hists
            out.update(gate_norms(params, cfg))
        return out

    return telemetry


def to_record(values: Mapping[str, Any], variant_activation: str) -> dict[str, Any]:
    """Fetched arrays -> the JSON record (plain floats and lists; non-finite as None)."""

    def plain(x: Any) -> Any:
        array = np.asarray(x, np.float64)
        return [None if not math.isfinite(v) else float(v) for v in array.reshape(-1)] \
            if array.ndim else (float(array) if math.isfinite(float(array)) else None)

    per_head = [np.asarray(h, np.float64) for h in values["f_attn_per_head"]]
    record: dict[str, Any] = {
        "f_attn": float(np.mean([h.mean() for h in per_head])),
        "sink_rate": float(np.mean(np.concatenate(per_head) > SINK_THRESHOLD)),
        "f_attn_per_layer": [float(h.mean()) for h in per_head],
        "f_attn_per_head": [plain(h) for h in per_head],
        "f_attn_uniform": plain(values["f_attn_uniform"]),
        "m_act_per_layer": [plain(x) for x in values["m_act_per_layer"]],
    }
    record["m_act"] = float(np.mean(values["m_act_per_layer"]))
    if "gate_mean_per_layer" in values:
        lo, hi = reductions.HISTOGRAM_RANGES[variant_activation]
        record["gate_mean_per_layer"] = [plain(x) for x in values["gate_mean_per_layer"]]
        record["gate_mean"] = float(np.mean(values["gate_mean_per_layer"]))
        record["gate_hist_per_layer"] = [plain(x) for x in values["gate_hist_per_layer"]]
        record["gate_hist_range"] = [lo, hi]
        record["gate_norm_per_layer"] = [plain(x) for x in values["gate_norm_per_layer"]]
        record["gate_norm_per_head"] = [plain(x) for x in values["gate_norm_per_head"]]
    return record
