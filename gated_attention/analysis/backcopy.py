"""Task metrics of the Bigram-Backcopy sink task (data/bigram_backcopy.py) for one model.

    stats = task_statistics(model, chain, batches)

On this task a head is useful only at trigger queries (where the next token copies the one
before the trigger) and must do nothing at every other query. So the metrics split by query:
- trigger accuracy: argmax prediction = target at copy positions (chance ~ 1/64);
- bigram excess loss: mean NLL at the other positions minus the entropy of the chain's row
  there (0 for a model that learned the chain exactly);
- F-Attn (attention on BOS, key 0) per layer and head at trigger / other queries (query 0,
  BOS itself, excluded); a sink head has F-Attn above `sink_threshold` at other queries;
- gate score (mean act(XW)) at trigger / other queries, for gated models;
- BOS residual ratio: mean L2 norm of each layer's output at BOS over its mean at the other
  positions (a sink token's residual grows large: massive activation);
- where each layer's largest |output| sits: position kind (bos / trigger / other), token,
  position and model dimension, and the largest |output| at BOS and elsewhere.
Sums are pooled over all batches in float64 (means over all queries, not means of means).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.data.synthetic.bigram_backcopy import BOS_ID, Chain, copy_positions
from gated_attention.model import capture as capture_lib

TASK_CAPTURES = frozenset({"first_token_attention", "gate_scores", "resid_after_ffn"})
SINK_THRESHOLD = 0.3


@nnx.jit
def _forward(model, inputs, positions, segment_ids):
    logits, _ = model(inputs, positions=positions, segment_ids=segment_ids,
                      capture=TASK_CAPTURES)
    layers = capture_lib.collect(model)
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return log_probs, layers


def _gate_per_query(scores: np.ndarray) -> np.ndarray:
    """[b, s, ...] gate scores -> [b, s] mean over heads and elements."""
    return scores.reshape(scores.shape[0], scores.shape[1], -1).mean(axis=-1)


class _Pool:
    """Running float64 sums and counts under string keys."""

    def __init__(self) -> None:
        self.sums: dict[str, Any] = {}

    def add(self, key: str, value: Any, count: float) -> None:
        value = np.asarray(value, np.float64)
        total, n = self.sums.get(key, (0.0, 0.0))
        self.sums[key] = (total + value, n + count)

    def mean(self, key: str) -> Any:
        total, n = self.sums.get(key, (None, 0.0))
        if total is None or n == 0:
            return None
        out = total / n
        return out.tolist() if np.ndim(out) else float(out)


def task_statistics(model: nnx.Module, chain: Chain, batches: Iterable[Mapping[str, Any]], *,
                    sink_threshold: float = SINK_THRESHOLD) -> dict[str, Any]:
    """The task metrics above as plain JSON-able Python (per layer lists, per head lists)."""
    pool, peaks = _Pool(), None
    n_batches = 0
    for batch in batches:
        inputs = np.asarray(batch["inputs"], np.int32)
        targets = np.asarray(batch["targets"], np.int32)
        log_probs, layers = _forward(model, jnp.asarray(inputs),
                                     jnp.asarray(batch["positions"]),
                                     jnp.asarray(batch["segment_ids"]))
        log_probs = np.asarray(log_probs, np.float64)
        copy = copy_positions(chain, inputs)
        other = ~copy
        other[:, 0] = False  # query 0 is BOS: it sees only itself (and its target is a start)
        nll = -np.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
        pool.add("trigger_accuracy", np.sum((log_probs.argmax(-1) == targets) & copy),
                 copy.sum())
        pool.add("copy_loss", np.sum(nll * copy), copy.sum())
        excess = nll - chain.row_entropy[inputs]
        pool.add("bigram_excess_loss", np.sum(excess * other), other.sum())
        pool.add("bigram_loss", np.sum(nll * other), other.sum())
        fta = np.stack([np.asarray(layer["first_token_attention"], np.float64)
                        for layer in layers])  # [L, b, h, q]
        pool.add("f_attn_trigger", np.einsum("lbhq,bq->lh", fta, copy), copy.sum())
        pool.add("f_attn_other", np.einsum("lbhq,bq->lh", fta, other), other.sum())
        pool.add("f_attn_all", np.einsum("lbhq,bq->lh", fta, copy | other), (copy | other).sum())
        if "gate_scores" in layers[0]:
            gates = np.stack([_gate_per_query(np.asarray(layer["gate_scores"], np.float64))
                              for layer in layers])  # [L, b, s]
            pool.add("gate_trigger", np.einsum("lbs,bs->l", gates, copy), copy.sum())
            pool.add("gate_other", np.einsum("lbs,bs->l", gates, other), other.sum())
        resid = np.stack([np.asarray(layer["resid_after_ffn"], np.float64)
                          for layer in layers])  # [L, b, s, D]
        norms = np.linalg.norm(resid, axis=-1)  # [L, b, s]
        pool.add("bos_norm", norms[:, :, 0].sum(axis=1), inputs.shape[0])
        pool.add("other_norm", norms[:, :, 1:].sum(axis=(1, 2)), norms[0, :, 1:].size)
        peaks = _merge_peaks(peaks, _peaks(np.abs(resid), inputs, chain))
        n_batches += 1
    if not n_batches:
        raise ValueError("task_statistics got no batches")

    f_other = np.asarray(pool.mean("f_attn_other"))
    out: dict[str, Any] = {
        "batches": n_batches,
        "trigger_accuracy": pool.mean("trigger_accuracy"),
        "copy_loss": pool.mean("copy_loss"),
        "bigram_loss": pool.mean("bigram_loss"),
        "bigram_excess_loss": pool.mean("bigram_excess_loss"),
        "f_attn_trigger_per_head": pool.mean("f_attn_trigger"),
        "f_attn_other_per_head": f_other.tolist(),
        "f_attn_per_head": pool.mean("f_attn_all"),
        "sink_threshold": sink_threshold,
        "sink_head_share": float(np.mean(f_other > sink_threshold)),
    }
    for kind in ("trigger", "other", "all"):
        per_head = np.asarray(pool.mean(f"f_attn_{kind}"))
        out[f"f_attn_{kind}_per_layer"] = per_head.mean(axis=1).tolist()
        out[f"f_attn_{kind}"] = float(per_head.mean())
    out["gate_trigger_per_layer"] = pool.mean("gate_trigger")
    out["gate_other_per_layer"] = pool.mean("gate_other")
    for kind in ("trigger", "other"):
        values = out[f"gate_{kind}_per_layer"]
        out[f"gate_{kind}"] = None if values is None else float(np.mean(values))
    ratio = np.asarray(pool.mean("bos_norm")) / np.asarray(pool.mean("other_norm"))
    out["bos_residual_ratio_per_layer"] = ratio.tolist()
    out["bos_residual_ratio"] = float(ratio[-1])  # the last layer's output
    out["activation_peaks"] = peaks
    return out


def _peaks(abs_resid: np.ndarray, inputs: np.ndarray, chain: Chain) -> list[dict[str, Any]]:
    """Per layer: the largest |output| overall (where it is) and at BOS / elsewhere."""
    out = []
    for layer in abs_resid:  # [b, s, D]
        b, s, d = np.unravel_index(int(np.argmax(layer)), layer.shape)
        token = int(inputs[b, s])
        kind = "bos" if s == 0 else ("trigger" if chain.is_trigger[token] else "other")
        out.append({"max": float(layer[b, s, d]), "kind": kind, "token": chain.label(token),
                    "position": int(s), "dim": int(d), "bos_max": float(layer[:, 0].max()),
                    "other_max": float(layer[:, 1:].max()) if layer.shape[1] > 1 else 0.0})
    return out


def _merge_peaks(acc: list[dict[str, Any]] | None, new: list[dict[str, Any]]
                 ) -> list[dict[str, Any]]:
    if acc is None:
        return new
    merged = []
    for a, n in zip(acc, new, strict=True):
        best = dict(n if n["max"] > a["max"] else a)
        best["bos_max"] = max(a["bos_max"], n["bos_max"])
        best["other_max"] = max(a["other_max"], n["other_max"])
        merged.append(best)
    return merged


def example_sequence(chain: Chain, length: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    """One held-out-like sequence that holds copies, and its token labels (for attention maps).

    Draws a few candidates and keeps the one with the most copy positions.
    """
    from gated_attention.data.synthetic.bigram_backcopy import sample_sequences

    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5EE]))
    candidates = sample_sequences(chain, 16, length, rng)
    best = candidates[int(np.argmax(copy_positions(chain, candidates).sum(axis=1)))]
    assert best[0] == BOS_ID
    return best, [chain.label(int(t)) for t in best]
