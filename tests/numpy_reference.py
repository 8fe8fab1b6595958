"""An independent float64 numpy implementation of the paper's attention layer, for tests.

Written from the formulas of docs/method.md, sharing no code with the package: projections,
the gates at G1-G5, QK-norm, RoPE, the four normalisers, GQA, causal and segment masks, o_proj.
"""

from __future__ import annotations

import numpy as np


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


ACT = {
    "sigmoid": sigmoid,
    "silu": lambda x: x * sigmoid(x),
    "identity": lambda x: x,
    "ns_sigmoid": lambda x: 0.5 + 0.5 * sigmoid(x),
}


def rms(x, eps=1e-6):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rope(x, positions, base=10_000.0):
    """x [b, s, h, d]; rotate pairs (i, i + d/2) by position * base^(-2i/d)."""
    d = x.shape[-1]
    out = np.empty_like(x)
    for i in range(d // 2):
        theta = positions * base ** (-2.0 * i / d)  # [b, s]
        c, s = np.cos(theta)[:, :, None], np.sin(theta)[:, :, None]
        a, b = x[..., i], x[..., i + d // 2]
        out[..., i] = a * c - b * s
        out[..., i + d // 2] = b * c + a * s
    return out


def attention_probs(q, k, *, causal=True, segment_ids=None, normalizer="softmax", sink=None):
    """Probabilities [b, h, s, t], looping over query heads (GQA by integer division)."""
    b, s, h, d = q.shape
    t, kv = k.shape[1], k.shape[2]
    probs = np.zeros((b, h, s, t))
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // kv)
            for i in range(s):
                visible = [j for j in range(t)
                           if (not causal or j <= i)
                           and (segment_ids is None or segment_ids[bi, j] == segment_ids[bi, i])]
                x = np.array([q[bi, i, hi] @ k[bi, j, kh] / np.sqrt(d) for j in visible])
                if normalizer == "softmax":
                    w = np.exp(x) / np.exp(x).sum()
                elif normalizer == "softmax_off_by_one":
                    w = np.exp(x) / (1.0 + np.exp(x).sum())
                elif normalizer == "learned_sink":
                    w = np.exp(x) / (np.exp(sink[hi]) + np.exp(x).sum())
                elif normalizer == "softpick":
                    w = np.maximum(np.exp(x) - 1.0, 0.0) / (np.abs(np.exp(x) - 1.0).sum() + 1e-6)
                else:
                    raise ValueError(normalizer)
                probs[bi, hi, i, visible] = w
    return probs


def sdpa(q, k, v, **kwargs):
    probs = attention_probs(q, k, **kwargs)
    kv = k.shape[2]
    h = q.shape[2]
    v_rep = np.repeat(v, h // kv, axis=2)  # [b, t, h, d]
    return np.einsum("bhst,bthd->bshd", probs, v_rep)


def gate_scores(x, w, variant):
    """act(X W) for hidden gates; w is [D, heads, d], [D, heads] or [D, D]; theta if constant."""
    if variant["gate_input"] == "constant":
        logits = np.broadcast_to(w, x.shape[:2] + w.shape)
    elif w.ndim == 3:
        logits = np.einsum("bsD,Dhd->bshd", x, w)
        if variant["sharing"] == "head_shared":
            logits = np.broadcast_to(logits.mean(axis=2, keepdims=True), logits.shape)
    else:
        logits = np.einsum("bsD,DE->bsE", x, w)
    return ACT[variant["activation"]](logits)


def apply_gate(y, x, w, variant):
    scores = gate_scores(x, w, variant)
    if scores.ndim == y.ndim - 1:
        scores = scores[..., None]
    return y * scores if variant["combine"] == "multiply" else y + scores


def attention_layer(x, params, variant, *, positions, segment_ids=None, qk_norm=True):
    """x [b, s, D] (already normalised) -> attention branch output [b, s, D]."""
    pos = variant["gate_position"]
    q = np.einsum("bsD,Dhd->bshd", x, params["q_proj"])
    k = np.einsum("bsD,Dhd->bshd", x, params["k_proj"])
    v = np.einsum("bsD,Dhd->bshd", x, params["v_proj"])
    if pos == "query":
        q = apply_gate(q, x, params["gate"], variant)
    if pos == "key":
        k = apply_gate(k, x, params["gate"], variant)
    if pos == "value":
        v = apply_gate(v, x, params["gate"], variant)
    if qk_norm:
        q, k = rms(q) * params["q_norm"], rms(k) * params["k_norm"]
    q, k = rope(q, positions), rope(k, positions)
    out = sdpa(q, k, v, causal=True, segment_ids=segment_ids, normalizer=variant["normalizer"],
               sink=params.get("sink_logits"))
    if variant["sdpa_transform"] == "silu":
        out = ACT["silu"](out)
    elif variant["sdpa_transform"] == "rmsnorm":
        out = rms(out)
    if pos == "sdpa":
        out = apply_gate(out, x, params["gate"], variant)
    out = np.einsum("bshd,hdD->bsD", out, params["o_proj"])
    if pos == "dense_output":
        out = apply_gate(out, x, params["gate"], variant)
    return out


# ---- Beyond the paper (docs/beyond.md): gate input width and rank, 2·sigmoid and biased
# gates, several gated positions, exclusive self-attention, sliding windows. ----

def window_mask(s, t, window, causal=True):
    """[s, t] booleans by loops: query i (the last s of t positions) sees key j when j <= i
    and i - j < window (window 0: no limit)."""
    mask = np.zeros((s, t), bool)
    for i in range(s):
        qi = i + t - s
        for j in range(t):
            mask[i, j] = (not causal or j <= qi) and (not window or qi - j < window)
    return mask


def attention_probs_window(q, k, *, window=0, segment_ids=None, normalizer="softmax",
                           sink=None):
    """attention_probs with a sliding window (softmax family), by loops."""
    b, s, h, d = q.shape
    t, kv = k.shape[1], k.shape[2]
    allowed = window_mask(s, t, window)
    probs = np.zeros((b, h, s, t))
    for bi in range(b):
        for hi in range(h):
            kh = hi // (h // kv)
            for i in range(s):
                visible = [j for j in range(t) if allowed[i, j]
                           and (segment_ids is None or segment_ids[bi, j] == segment_ids[bi, i])]
                x = np.array([q[bi, i, hi] @ k[bi, j, kh] / np.sqrt(d) for j in visible])
                extra = {"softmax": 0.0, "softmax_off_by_one": 1.0}.get(normalizer)
                if normalizer == "learned_sink":
                    extra = np.exp(sink[hi])
                probs[bi, hi, i, visible] = np.exp(x) / (extra + np.exp(x).sum())
    return probs


def xsa(y, v):
    """Exclusive self-attention: z_i = y_i - (y_i . v_i) v_i / |v_i|^2 per head (GQA: query
    head n reads kv head n // group), by loops."""
    b, s, h, d = y.shape
    group = h // v.shape[2]
    z = np.empty_like(y)
    for bi in range(b):
        for si in range(s):
            for hi in range(h):
                vi = v[bi, si, hi // group]
                z[bi, si, hi] = y[bi, si, hi] - (y[bi, si, hi] @ vi) / (vi @ vi) * vi
    return z


def gate_scores_beyond(x, gate, variant):
    """scale * act(X[:, :, :k] W + bias), W full [k, out...] or A [k, r] @ B [r, out...]."""
    xk = x[..., : gate["width"]]
    if "a" in gate:
        w = np.tensordot(gate["a"], gate["b"], axes=(1, 0))
    else:
        w = gate["kernel"]
    logits = np.tensordot(xk, w, axes=(2, 0))
    if "bias" in gate:
        logits = logits + gate["bias"]
    if variant.get("sharing") == "head_shared" and logits.ndim == 4:
        logits = np.broadcast_to(logits.mean(axis=2, keepdims=True), logits.shape)
    return variant.get("gate_scale", 1.0) * ACT[variant["activation"]](logits)


def apply_gate_beyond(y, x, gate, variant):
    scores = gate_scores_beyond(x, gate, variant)
    if scores.ndim == y.ndim - 1:
        scores = scores[..., None]
    return y * scores


def attention_layer_beyond(x, params, variant, *, positions, segment_ids=None, qk_norm=True,
                           head_mask=None):
    """attention_layer with params["gates"] = {position: gate} (each gated position), XSA
    (variant["xsa"]) and a sliding window (variant["window"]); head_mask [h] zeroes heads'
    outputs before o_proj."""
    gates = params.get("gates", {})
    q = np.einsum("bsD,Dhd->bshd", x, params["q_proj"])
    k = np.einsum("bsD,Dhd->bshd", x, params["k_proj"])
    v = np.einsum("bsD,Dhd->bshd", x, params["v_proj"])
    if "query" in gates:
        q = apply_gate_beyond(q, x, gates["query"], variant)
    if "key" in gates:
        k = apply_gate_beyond(k, x, gates["key"], variant)
    if "value" in gates:
        v = apply_gate_beyond(v, x, gates["value"], variant)
    if qk_norm:
        q, k = rms(q) * params["q_norm"], rms(k) * params["k_norm"]
    q, k = rope(q, positions), rope(k, positions)
    probs = attention_probs_window(q, k, window=variant.get("window", 0),
                                   segment_ids=segment_ids,
                                   normalizer=variant.get("normalizer", "softmax"),
                                   sink=params.get("sink_logits"))
    h = q.shape[2]
    out = np.einsum("bhst,bthd->bshd", probs, np.repeat(v, h // k.shape[2], axis=2))
    if variant.get("xsa"):
        out = xsa(out, v)
    if "sdpa" in gates:
        out = apply_gate_beyond(out, x, gates["sdpa"], variant)
    if head_mask is not None:
        out = out * np.asarray(head_mask)[None, None, :, None]
    out = np.einsum("bshd,hdD->bsD", out, params["o_proj"])
    if "dense_output" in gates:
        out = apply_gate_beyond(out, x, gates["dense_output"], variant)
    return out


# ------------- Switch-Head projections and the decoder block (Tables 2 and 6) -------------


def silu(x):
    return x * sigmoid(x)


def switch_projection(x, experts, router, top_k):
    """Switch-Head (Csordas et al. 2023) for one of k/v: x [b, s, D], experts [E, D, kv, d],
    router [D, kv, E]. Per token and kv head, sigmoid(x R) scores the E experts, all but the
    top_k largest are dropped, and the output is the score-weighted sum of x W_e."""
    num_experts = experts.shape[0]
    scores = sigmoid(np.einsum("bsD,DkE->bskE", x, router))
    if top_k < num_experts:
        kth_largest = np.sort(scores, axis=-1)[..., num_experts - top_k]
        scores = np.where(scores >= kth_largest[..., None], scores, 0.0)
    out = np.zeros(x.shape[:2] + experts.shape[2:])
    for e in range(num_experts):
        out += scores[..., e, None] * np.einsum("bsD,Dkd->bskd", x, experts[e])
    return out


def switch_attention_layer(x, params, *, top_k, switch_target, positions, segment_ids=None):
    """Softmax attention without gates whose v (switch_target "v") or k and v ("kv") are
    Switch-Head projections: params["k_proj"] / params["v_proj"] are then dicts holding
    "experts" and "router"."""
    def project(name):
        p = params[name]
        if isinstance(p, dict):
            return switch_projection(x, p["experts"], p["router"], top_k)
        return np.einsum("bsD,Dhd->bshd", x, p)

    assert isinstance(params["v_proj"], dict) and (
        isinstance(params["k_proj"], dict) == (switch_target == "kv"))
    q, k, v = project("q_proj"), project("k_proj"), project("v_proj")
    q, k = rms(q) * params["q_norm"], rms(k) * params["k_norm"]
    q, k = rope(q, positions), rope(k, positions)
    out = sdpa(q, k, v, causal=True, segment_ids=segment_ids)
    return np.einsum("bshd,hdD->bsD", out, params["o_proj"])


def swiglu(x, gate_proj, up_proj, down_proj):
    return (silu(x @ gate_proj) * (x @ up_proj)) @ down_proj


def decoder_block(x, params, variant, *, positions, segment_ids=None, sandwich_norm=False):
    """Pre-norm block x + attn(norm(x)), then x + ffn(norm(x)); with sandwich norm each
    branch's output is RMS-normalised (its own scale) before it joins the residual stream."""
    attn = attention_layer(rms(x) * params["attn_norm"], params["attention"], variant,
                           positions=positions, segment_ids=segment_ids)
    if sandwich_norm:
        attn = rms(attn) * params["post_attn_norm"]
    x = x + attn
    ffn = swiglu(rms(x) * params["ffn_norm"], *params["ffn"])
    if sandwich_norm:
        ffn = rms(ffn) * params["post_ffn_norm"]
    return x + ffn


def numerical_gradient(f, x, eps=1e-6):
    """Central differences of the scalar f at x (float64), one coordinate at a time."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        grad[i] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad
