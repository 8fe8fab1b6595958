"""The paper's analysis metrics for one model on held-out batches (docs/method.md, "Metrics").

    stats = model_statistics(model, batches)

`batches` are dicts in the training format: "inputs" [b, s] and optionally "segment_ids",
"positions", "targets", "mask". Rows that are each one whole window from position 0
(data.pipeline.analysis_batches) measure F-Attn on every query; packed rows work too.

- F-Attn: attention on key 0, averaged over query positions (pooled over every batch), then
  over heads, then over layers. Query 0 only sees itself, so it is excluded by default. In a
  packed row only the first segment's queries can see key 0, so only they count.
- Sink rate (Gu et al., ICLR 2025): share of (layer, head) pairs whose mean attention on key 0
  exceeds `sink_threshold` (0.3).
- M-Act: per layer, max |value| of attention output, residual after attention, FFN output and
  residual after FFN; the headline number (Table 4) is the mean over layers of max |layer
  output| (= resid_after_ffn).
- Gate score: mean/std/min/max of act(X W) per layer and pooled over layers, tokens and
  elements; a histogram per layer.
- Sparsity: mean |Y| of the SDPA output before and after the G1 gate (or parameter-free
  transform) per layer, and the fraction of values with |Y| below 1e-2 and 1e-3. For models
  without a G1 gate "before" and "after" are the same tensor.
- With "targets" in the batches: held-out loss and perplexity (mean over masked tokens).
Padding (segment id 0) never counts. The model runs under nnx.jit, one compile per call.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.model import capture as capture_lib
from gated_attention.model import reductions
from gated_attention.training.losses import cross_entropy

STAT_CAPTURES = frozenset({"first_token_attention", "gate_scores", "sdpa_before_gate",
                           "sdpa_after_gate", *reductions.ACTIVATION_TENSORS})
SINK_THRESHOLD = 0.3


def _optional(batch: Mapping[str, Any], key: str) -> jax.Array | None:
    value = batch.get(key)
    return None if value is None else jnp.asarray(value)


@functools.partial(nnx.jit, static_argnames=("exclude_first_query", "histogram_range"))
def _reduce_batch(model, inputs, positions, segment_ids, targets, mask, *,
                  exclude_first_query: bool, histogram_range: tuple[float, float]):
    """One batch -> per-layer reductions (and loss sums); compiled once per model structure."""
    logits, _ = model(inputs, positions=positions, segment_ids=segment_ids,
                      capture=STAT_CAPTURES)
    layers = capture_lib.collect(model)
    per_layer = [reductions.reduce_layer(layer, segment_ids, inputs.shape,
                                         exclude_first_query=exclude_first_query,
                                         histogram_range=histogram_range) for layer in layers]
    loss = None
    if targets is not None:
        weights = reductions.token_mask(segment_ids, inputs.shape)
        if mask is not None:
            weights = weights & mask.astype(bool)
        nll, info = cross_entropy(logits, targets, weights)
        loss = {"nll_sum": info["nll"] * info["tokens"], "tokens": info["tokens"]}
    return per_layer, loss


def model_statistics(model: nnx.Module, batches: Iterable[Mapping[str, Any]], *,
                     exclude_first_query: bool = True, sink_threshold: float = SINK_THRESHOLD,
                     max_batches: int | None = None) -> dict[str, Any]:
    """F-Attn, sink rate, M-Act, gate scores, sparsity (and loss) as plain JSON-able Python."""
    if not 0.0 < sink_threshold < 1.0:
        raise ValueError(f"sink_threshold={sink_threshold} must be in (0, 1)")
    variant = model.cfg.variant
    hist_range = reductions.HISTOGRAM_RANGES[variant.activation]

    acc, loss_acc, n_batches = None, None, 0
    for batch in batches:
        if max_batches is not None and n_batches >= max_batches:
            break
        if "inputs" not in batch:
            raise KeyError(f"batch has keys {sorted(batch)}; model_statistics needs 'inputs'")
        inputs = jnp.asarray(batch["inputs"], dtype=jnp.int32)
        per_layer, loss = _reduce_batch(model, inputs, _optional(batch, "positions"),
                                        _optional(batch, "segment_ids"),
                                        _optional(batch, "targets"), _optional(batch, "mask"),
                                        exclude_first_query=exclude_first_query,
                                        histogram_range=hist_range)
        acc = reductions.merge(acc, per_layer)
        if loss is not None:
            loss = {k: float(v) for k, v in loss.items()}
            loss_acc = loss if loss_acc is None else {k: loss_acc[k] + loss[k] for k in loss}
        n_batches += 1
    if acc is None:
        raise ValueError("model_statistics got no batches")
    out = metrics_from_accumulators(acc, exclude_first_query=exclude_first_query,
                                    sink_threshold=sink_threshold, histogram_range=hist_range)
    out["variant"] = variant.name
    out["batches"] = n_batches
    if loss_acc is not None and loss_acc["tokens"] > 0:
        out["loss"] = loss_acc["nll_sum"] / loss_acc["tokens"]
        out["perplexity"] = math.exp(min(out["loss"], 700.0))
        out["loss_tokens"] = int(loss_acc["tokens"])
    return out


def _fraction_stats(s: Mapping[str, np.ndarray]) -> dict[str, float]:
    count = max(float(s["count"]), 1.0)
    out = {"mean_abs": float(s["abs_sum"]) / count}
    for t in reductions.SPARSITY_THRESHOLDS:
        out[f"frac_below_{t:g}"] = float(s[f"below_{t:g}"]) / count
    return out


def metrics_from_accumulators(acc: Sequence[Mapping[str, Any]], *, exclude_first_query: bool,
                              sink_threshold: float, histogram_range: tuple[float, float]
                              ) -> dict[str, Any]:
    """Pooled per-layer accumulators (from reductions.merge) -> the metrics dict."""
    out: dict[str, Any] = {"num_layers": len(acc), "exclude_first_query": exclude_first_query,
                           "sink_threshold": sink_threshold}
    per_head = [(a["fta_sum"] / max(float(a["fta_count"]), 1.0)).tolist() for a in acc]
    per_layer = [float(np.mean(h)) for h in per_head]
    out["first_token_attention"] = float(np.mean(per_layer))
    out["first_token_attention_per_layer"] = per_layer
    out["first_token_attention_per_head"] = per_head
    out["first_token_queries"] = int(acc[0]["fta_count"])
    out["sink_rate"] = float(np.mean(np.asarray(per_head) > sink_threshold))
    out["max_activation_per_layer"] = {
        name: [float(a[f"max_{name}"]) for a in acc] for name in reductions.ACTIVATION_TENSORS}
    out["massive_activation"] = float(np.mean(out["max_activation_per_layer"]["resid_after_ffn"]))

    if "gate" in acc[0]:
        gates = [a["gate"] for a in acc]
        out["gate_score_per_layer"] = [
            {"mean": float(g["mean"]), "std": float(np.sqrt(g["m2"] / max(g["count"], 1.0))),
             "min": float(g["min"]), "max": float(g["max"])} for g in gates]
        total = sum(float(g["count"]) for g in gates)
        out["gate_score_mean"] = sum(float(g["mean"] * g["count"]) for g in gates) / total
        hists = [a["gate_hist"] for a in acc]
        edges = np.linspace(*histogram_range, reductions.HISTOGRAM_BINS + 1)
        out["gate_histogram"] = {
            "edges": edges.tolist(),
            "per_layer": [(h / max(h.sum(), 1.0)).tolist() for h in hists],
            "all": (sum(hists) / max(sum(h.sum() for h in hists), 1.0)).tolist(),
        }
    else:
        out["gate_score_per_layer"] = out["gate_score_mean"] = out["gate_histogram"] = None

    if "sdpa_before_gate" in acc[0]:
        out["sparsity"] = [{"before": _fraction_stats(a["sdpa_before_gate"]),
                            "after": _fraction_stats(a["sdpa_after_gate"])} for a in acc]
        out["sparsity_mean"] = {
            side: {k: float(np.mean([layer[side][k] for layer in out["sparsity"]]))
                   for k in out["sparsity"][0][side]} for side in ("before", "after")}
    else:
        out["sparsity"] = out["sparsity_mean"] = None
    return out


@functools.partial(nnx.jit, static_argnames=("layers",))
def _head_averaged_probs(model, tokens, segment_ids, *, layers: tuple[int, ...]):
    model(tokens, segment_ids=segment_ids, capture=frozenset({"attention_probs"}))
    captured = capture_lib.collect(model)
    return jnp.stack([jnp.mean(captured[i]["attention_probs"][0].astype(jnp.float32), 0)
                      for i in layers])


def attention_maps(model: nnx.Module, tokens: Any, layers: Sequence[int] | None = None,
                   segment_ids: Any = None) -> np.ndarray:
    """Head-averaged attention probabilities [len(layers), s, s] for one prompt (row 0).

    Probabilities are S x S per head: use short prompts (the paper's Figure 2 uses a few dozen
    tokens).
    """
    tokens = jnp.asarray(tokens, dtype=jnp.int32)
    if tokens.ndim == 1:
        tokens = tokens[None]
    num_layers = model.cfg.num_layers
    layers = list(range(num_layers)) if layers is None else list(layers)
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"layers {bad} out of range; the model has layers 0..{num_layers - 1}")

    seg = None if segment_ids is None else jnp.asarray(segment_ids).reshape(tokens.shape)
    return np.asarray(_head_averaged_probs(model, tokens, seg, layers=tuple(layers)))
