"""Per-batch reductions of captured intermediates, and how to merge them across batches.

A batch reduces to small sums, counts, minima and maxima (never S x S arrays), so statistics
over many held-out batches are exact pooled statistics: means over all query positions of all
batches, not means of per-batch means. Merging happens in float64 numpy.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

ACTIVATION_TENSORS = ("attn_output", "resid_after_attn", "ffn_output", "resid_after_ffn")
SPARSITY_THRESHOLDS = (1e-2, 1e-3)
# Histogram range per gate activation; values outside are counted in the edge bins.
HISTOGRAM_RANGES = {"sigmoid": (0.0, 1.0), "ns_sigmoid": (0.0, 1.0), "silu": (-0.5, 3.0),
                    "identity": (-3.0, 3.0)}
HISTOGRAM_BINS = 50


def token_mask(segment_ids: jax.Array | None, shape: tuple[int, int]) -> jax.Array:
    """[b, s] bool: real tokens (segment id 0 marks padding in packed batches)."""
    if segment_ids is None:
        return jnp.ones(shape, dtype=bool)
    return segment_ids != 0


def first_token_query_mask(segment_ids: jax.Array | None, shape: tuple[int, int],
                           exclude_first_query: bool) -> jax.Array:
    """[b, s] bool: queries that can see key 0 of their row.

    Key 0 is the first token of a row's first segment, so in a packed row only the queries of
    that first segment count. Query 0 attends only to itself (weight 1 under softmax), so it is
    excluded by default.
    """
    mask = token_mask(segment_ids, shape)
    if segment_ids is not None:
        mask = mask & (segment_ids == segment_ids[:, :1])
    if exclude_first_query:
        mask = mask.at[:, 0].set(False)
    return mask


def _moments(x: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """count, mean, sum of squared deviations (M2), min, max of x over masked tokens.

    x is [b, s, ...]; mask is [b, s]. M2 around the batch mean is merged across batches with
    Chan et al.'s parallel formula, which stays accurate where E[x^2] - E[x]^2 would not.
    """
    x = x.astype(jnp.float32)
    w = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (x.ndim - 2)), x.shape)
    count = jnp.sum(w, dtype=jnp.float32)
    mean = jnp.sum(jnp.where(w, x, 0.0)) / jnp.maximum(count, 1.0)
    m2 = jnp.sum(jnp.where(w, jnp.square(x - mean), 0.0))
    return {"count": count, "mean": mean, "m2": m2,
            "min": jnp.min(jnp.where(w, x, jnp.inf)), "max": jnp.max(jnp.where(w, x, -jnp.inf))}


def _abs_stats(y: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """Sum of |y| and counts of |y| below each sparsity threshold, over masked tokens."""
    a = jnp.abs(y.astype(jnp.float32))
    w = jnp.broadcast_to(mask.reshape(mask.shape + (1,) * (a.ndim - 2)), a.shape)
    out = {"count": jnp.sum(w, dtype=jnp.float32), "abs_sum": jnp.sum(jnp.where(w, a, 0.0))}
    for t in SPARSITY_THRESHOLDS:
        out[f"below_{t:g}"] = jnp.sum(w & (a < t), dtype=jnp.float32)
    return out


def reduce_layer(layer: dict[str, jax.Array], segment_ids: jax.Array | None,
                 shape: tuple[int, int], *, exclude_first_query: bool,
                 histogram_range: tuple[float, float]) -> dict[str, Any]:
    """One layer's captures -> small per-batch statistics (all float32 scalars or vectors)."""
    tokens = token_mask(segment_ids, shape)
    out: dict[str, Any] = {}
    if "first_token_attention" in layer:
        fta = layer["first_token_attention"].astype(jnp.float32)  # [b, h, q]
        queries = first_token_query_mask(segment_ids, shape, exclude_first_query)
        out["fta_sum"] = jnp.einsum("bhq,bq->h", fta, queries.astype(jnp.float32))
        out["fta_count"] = jnp.sum(queries, dtype=jnp.float32)
    for name in ACTIVATION_TENSORS:
        if name in layer:
            a = jnp.abs(layer[name].astype(jnp.float32))
            out[f"max_{name}"] = jnp.max(jnp.where(tokens[..., None], a, 0.0))
    if "gate_scores" in layer:
        g = layer["gate_scores"]
        out["gate"] = _moments(g, tokens)
        lo, hi = histogram_range
        clipped = jnp.clip(g.astype(jnp.float32), lo, hi)
        weights = jnp.broadcast_to(tokens.reshape(shape + (1,) * (g.ndim - 2)), g.shape)
        out["gate_hist"], _ = jnp.histogram(clipped, bins=HISTOGRAM_BINS, range=(lo, hi),
                                            weights=weights.astype(jnp.float32))
    for name in ("sdpa_before_gate", "sdpa_after_gate"):
        if name in layer:
            out[name] = _abs_stats(layer[name], tokens)
    return out


def merge(acc: list[dict[str, Any]] | None, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fold one batch's per-layer statistics (device arrays) into float64 accumulators."""
    batch = jax.tree.map(lambda x: np.asarray(x, dtype=np.float64), batch)
    if acc is None:
        return batch
    return [_merge_layer(a, b) for a, b in zip(acc, batch, strict=True)]


def _merge_layer(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, va in a.items():
        vb = b[key]
        if key == "gate":
            out[key] = _merge_moments(va, vb)
        elif key.startswith("max_"):
            out[key] = np.maximum(va, vb)
        elif isinstance(va, dict):
            out[key] = {k: va[k] + vb[k] for k in va}
        else:  # sums, counts, histograms
            out[key] = va + vb
    return out


def _merge_moments(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    n = a["count"] + b["count"]
    if n == 0:
        return a
    delta = b["mean"] - a["mean"]
    mean = a["mean"] + delta * b["count"] / n
    m2 = a["m2"] + b["m2"] + delta**2 * a["count"] * b["count"] / n
    return {"count": n, "mean": mean, "m2": m2, "min": np.minimum(a["min"], b["min"]),
            "max": np.maximum(a["max"], b["max"])}
