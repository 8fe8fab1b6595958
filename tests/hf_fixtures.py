"""Tiny random Hugging Face Qwen3 folders, and a float64 numpy forward pass read from them.

The forward is written from the official modeling code's description (the paper's release:
q_proj output viewed as [kv_heads, -1], per kv group the G heads' queries then their gates;
RMSNorm over the head dim for q/k; RoPE with rotate_half; GQA; causal softmax; the output
multiplied by sigmoid(gate); o_proj), shares no code with the package, and reads only the
HF tensors, never the project's parameters.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

import numpy as np
from safetensors.numpy import save_file

VARIANT_FLAGS = {
    "baseline": {},
    "g1_sdpa_headwise": {"headwise_attn_output_gate": True},
    "g1_sdpa_elementwise": {"elementwise_attn_output_gate": True},
}


def tiny_hf_config(variant: str = "baseline", *, tied: bool = False, moe: bool = False,
                   bias: bool = False, **overrides: Any) -> dict[str, Any]:
    hf: dict[str, Any] = {
        "architectures": ["Qwen3MoeForCausalLM" if moe else "Qwen3ForCausalLM"],
        "model_type": "qwen3_moe" if moe else "qwen3",
        "vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "intermediate_size": 40, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "rope_scaling": None, "max_position_embeddings": 128,
        "tie_word_embeddings": tied, "attention_bias": bias, "use_sliding_window": False,
        "headwise_attn_output_gate": False, "elementwise_attn_output_gate": False,
        "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": 60,
    }
    if moe:
        hf.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                  norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[])
    hf.update(VARIANT_FLAGS[variant])
    hf.update(overrides)
    return hf


def random_tensors(hf: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Tensors in the HF layout, drawn from the config alone (scaled to keep logits O(1))."""
    rng = np.random.default_rng(seed)
    D, H, kv, d = (hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"],
                   hf["head_dim"])
    width = d if hf.get("elementwise_attn_output_gate") else (
        1 if hf.get("headwise_attn_output_gate") else 0)

    def w(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(hf["vocab_size"], D, scale=1.0),
         "model.norm.weight": norm(D)}
    if not hf["tie_word_embeddings"]:
        t["lm_head.weight"] = w(hf["vocab_size"], D)
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": norm(D), p + "post_attention_layernorm.weight": norm(D),
            p + "self_attn.q_proj.weight": w(H * d + H * width, D),
            p + "self_attn.k_proj.weight": w(kv * d, D),
            p + "self_attn.v_proj.weight": w(kv * d, D),
            p + "self_attn.o_proj.weight": w(D, H * d),
            p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d),
        })
        if hf.get("attention_bias"):
            t.update({p + "self_attn.q_proj.bias": w(H * d), p + "self_attn.k_proj.bias": w(kv * d),
                      p + "self_attn.v_proj.bias": w(kv * d), p + "self_attn.o_proj.bias": w(D)})
        if hf["model_type"] == "qwen3_moe":
            F = hf["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = w(hf["num_experts"], D, scale=1.0)
            for e in range(hf["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                t.update({q + "gate_proj.weight": w(F, D), q + "up_proj.weight": w(F, D),
                          q + "down_proj.weight": w(D, F)})
        else:
            F = hf["intermediate_size"]
            t.update({p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                      p + "mlp.down_proj.weight": w(D, F)})
    return t


def write_hf_folder(folder: pathlib.Path, hf: dict[str, Any], tensors: dict[str, np.ndarray]
                    ) -> pathlib.Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(hf, indent=2))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


# ----------------------------- float64 numpy forward -----------------------------

def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rotate_half(x: np.ndarray) -> np.ndarray:
    half = x.shape[-1] // 2
    return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _silu(x: np.ndarray) -> np.ndarray:
    return x * _sigmoid(x)


def rope_frequencies(hf: dict[str, Any]) -> tuple[np.ndarray, float]:
    """(inv_freq, cos/sin multiplier) for default, linear and YaRN `rope_scaling`, following
    the definitions of transformers' rope utilities and the YaRN paper (arXiv 2309.00071)."""
    d, base = hf["head_dim"], hf["rope_theta"]
    inv_freq = 1.0 / base ** (np.arange(0, d, 2) / d)
    spec = hf.get("rope_scaling") or {}
    kind, factor = spec.get("rope_type", "default"), spec.get("factor", 1.0)
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind != "yarn":
        return inv_freq, 1.0
    length = spec.get("original_max_position_embeddings") or hf["max_position_embeddings"]

    def pair(rotations: float) -> float:  # the pair that turns `rotations` times over length
        return d * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair(spec.get("beta_fast", 32.0))), 0)
    high = min(math.ceil(pair(spec.get("beta_slow", 1.0))), d - 1)
    high = high + 0.001 if high == low else high
    ramp = np.clip((np.arange(d // 2) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # 1: extrapolate (unchanged), 0: interpolate (divided by factor)
    scale = spec.get("attention_factor") or 0.1 * math.log(factor) + 1.0
    return inv_freq / factor * (1.0 - keep) + inv_freq * keep, scale


def numpy_forward(hf: dict[str, Any], tensors: dict[str, np.ndarray], ids: np.ndarray,
                  *, naive_gate_split: bool = False, per_head_split: bool = False) -> np.ndarray:
    """Logits [b, s, vocab] in float64. naive_gate_split: take q_proj's first H*d rows as the
    queries and the rest as the gates (the wrong, contiguous reading); per_head_split: read
    q_proj per query head as Qwen3-Next does (wrong for this layout too)."""
    t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    H, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    G, eps = H // kv, hf["rms_norm_eps"]
    headwise, elementwise = (hf.get("headwise_attn_output_gate"),
                             hf.get("elementwise_attn_output_gate"))
    width = d if elementwise else (1 if headwise else 0)
    b, s = ids.shape
    inv_freq, scale = rope_frequencies(hf)
    freqs = np.arange(s)[:, None] * inv_freq[None]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [s, d]
    cos, sin = scale * np.cos(emb)[None, :, None], scale * np.sin(emb)[None, :, None]
    causal = np.tril(np.ones((s, s), bool))
    x = t["model.embed_tokens.weight"][ids]
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."

        def linear(h: np.ndarray, name: str, p: str = p) -> np.ndarray:
            y = h @ t[p + name + ".weight"].T
            return y + t[p + name + ".bias"] if p + name + ".bias" in t else y

        h = _rms(x, t[p + "input_layernorm.weight"], eps)
        q_all = linear(h, "self_attn.q_proj")
        gate = None
        if width and per_head_split:
            both = q_all.reshape(b, s, H, d + width)
            q, gate = both[..., :d], both[..., d:]
        elif width and naive_gate_split:
            q, gate = q_all[..., : H * d], q_all[..., H * d:]
            q, gate = q.reshape(b, s, H, d), gate.reshape(b, s, H, width)
        elif width:
            grouped = q_all.reshape(b, s, kv, G * d + G * width)
            q = grouped[..., : G * d].reshape(b, s, H, d)
            gate = grouped[..., G * d:].reshape(b, s, H, width)
        else:
            q = q_all.reshape(b, s, H, d)
        k = linear(h, "self_attn.k_proj").reshape(b, s, kv, d)
        v = linear(h, "self_attn.v_proj").reshape(b, s, kv, d)
        if hf.get("use_qk_norm", True):
            q = _rms(q, t[p + "self_attn.q_norm.weight"], eps)
            k = _rms(k, t[p + "self_attn.k_norm.weight"], eps)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)  # head h uses kv head h // G
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        scores = np.where(causal, scores, -np.inf)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = np.einsum("bhqk,bkhd->bqhd", probs, v)
        if gate is not None:
            attn = attn * _sigmoid(gate)
        x = x + linear(attn.reshape(b, s, H * d), "self_attn.o_proj")
        h = _rms(x, t[p + "post_attention_layernorm.weight"], eps)
        if hf["model_type"] == "qwen3_moe":
            router = _softmax(h @ t[p + "mlp.gate.weight"].T)  # [b, s, E]
            top = np.argsort(-router, axis=-1)[..., : hf["num_experts_per_tok"]]
            weights = np.take_along_axis(router, top, axis=-1)
            if hf.get("norm_topk_prob"):
                weights = weights / weights.sum(-1, keepdims=True)
            out = np.zeros_like(x)
            for e in range(hf["num_experts"]):
                q_ = f"{p}mlp.experts.{e}."
                y = (_silu(h @ t[q_ + "gate_proj.weight"].T) * (h @ t[q_ + "up_proj.weight"].T)
                     ) @ t[q_ + "down_proj.weight"].T
                share = np.where(top == e, weights, 0.0).sum(-1, keepdims=True)
                out += share * y
            x = x + out
        else:
            x = x + (_silu(h @ t[p + "mlp.gate_proj.weight"].T)
                     * (h @ t[p + "mlp.up_proj.weight"].T)) @ t[p + "mlp.down_proj.weight"].T
    x = _rms(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if hf["tie_word_embeddings"] else t["lm_head.weight"]
    return x @ head.T


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ------------- the Qwen3-Next family (qwen3_next, qwen3_5_text, qwen3_5_moe_text) -------------
# Written from transformers' modeling_qwen3_next / modeling_qwen3_5(_moe): q_proj's output viewed
# as [.., heads, 2 * head_dim] and chunked into (query, gate) per head; the gate flattened to
# [.., heads * head_dim] multiplies the attention output through a sigmoid before o_proj; every
# RMSNorm is x / rms(x) * (1 + w); q/k norms per head before RoPE; RoPE (rotate_half) on the
# first int(head_dim * partial_rotary_factor) channels with frequencies of that dimension; MoE:
# softmax router, top-k, renormalised (norm_topk_prob; always in Qwen3.5-MoE), plus a shared
# SwiGLU expert times sigmoid(shared_expert_gate(x)).

NEXT_TYPES = {"qwen3_next": ("Qwen3NextForCausalLM", "qwen3_next"),
              "qwen3_5": ("Qwen3_5ForCausalLM", "qwen3_5_text"),
              "qwen3_5_moe": ("Qwen3_5MoeForCausalLM", "qwen3_5_moe_text")}
MULTIMODAL_TYPES = {"qwen3_5": ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
                    "qwen3_5_moe": ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")}


def tiny_next_config(layout: str = "qwen3_next", *, moe: bool | None = None, tied: bool = False,
                     **overrides: Any) -> dict[str, Any]:
    """A tiny all-full-attention config.json of `layout` (MoE for qwen3_5_moe, and for qwen3_next
    unless moe=False); partial rotary 0.5 of head_dim 8 (4 channels rotate)."""
    architecture, model_type = NEXT_TYPES[layout]
    moe = layout == "qwen3_5_moe" or (layout == "qwen3_next" and moe is not False)
    hf: dict[str, Any] = {
        "architectures": [architecture], "model_type": model_type,
        "vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
        "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 128,
        "tie_word_embeddings": tied, "attention_bias": False, "torch_dtype": "float32",
        "layer_types": ["full_attention", "full_attention"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                            "partial_rotary_factor": 0.5},
        "eos_token_id": 60,
    }
    if layout != "qwen3_5_moe":
        hf["intermediate_size"] = 40
    if layout == "qwen3_5" or layout == "qwen3_5_moe":
        hf["rope_parameters"].update(mrope_section=[1, 1, 0], mrope_interleaved=True)
        hf["mtp_num_hidden_layers"] = 0
    if layout == "qwen3_next":
        hf.update(decoder_sparse_step=1, mlp_only_layers=[], num_experts=4 if moe else 0,
                  norm_topk_prob=True)
    if moe:
        hf.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                  shared_expert_intermediate_size=20)
    hf.update(overrides)
    return hf


def multimodal_config(text: dict[str, Any], layout: str = "qwen3_5") -> dict[str, Any]:
    """The multimodal wrapper of a text config (the vision fields only as placeholders)."""
    architecture, model_type = MULTIMODAL_TYPES[layout]
    inner = {k: v for k, v in text.items() if k not in ("architectures", "tie_word_embeddings")}
    return {"architectures": [architecture], "model_type": model_type, "text_config": inner,
            "vision_config": {"depth": 1, "hidden_size": 8}, "image_token_id": 59,
            "tie_word_embeddings": text["tie_word_embeddings"]}


def _is_moe(hf: dict[str, Any]) -> bool:
    return hf["model_type"] == "qwen3_5_moe_text" or (
        hf["model_type"] == "qwen3_next" and hf.get("num_experts", 0) > 0)


def random_next_tensors(hf: dict[str, Any], seed: int = 0) -> dict[str, np.ndarray]:
    """Tensors as save_pretrained writes them (experts one by one), drawn from the config."""
    rng = np.random.default_rng(seed)
    D, H, kv, d = (hf["hidden_size"], hf["num_attention_heads"], hf["num_key_value_heads"],
                   hf["head_dim"])

    def w(*shape: int, scale: float = 0.3) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    def norm(n: int) -> np.ndarray:  # zero-centred: the weight is around 0
        return (0.2 * rng.standard_normal(n)).astype(np.float32)

    t = {"model.embed_tokens.weight": w(hf["vocab_size"], D, scale=1.0),
         "model.norm.weight": norm(D)}
    if not hf["tie_word_embeddings"]:
        t["lm_head.weight"] = w(hf["vocab_size"], D)
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": norm(D), p + "post_attention_layernorm.weight": norm(D),
            p + "self_attn.q_proj.weight": w(H * 2 * d, D),
            p + "self_attn.k_proj.weight": w(kv * d, D),
            p + "self_attn.v_proj.weight": w(kv * d, D),
            p + "self_attn.o_proj.weight": w(D, H * d),
            p + "self_attn.q_norm.weight": norm(d), p + "self_attn.k_norm.weight": norm(d),
        })
        if _is_moe(hf):
            F, S = hf["moe_intermediate_size"], hf["shared_expert_intermediate_size"]
            t[p + "mlp.gate.weight"] = w(hf["num_experts"], D, scale=1.0)
            for e in range(hf["num_experts"]):
                q = f"{p}mlp.experts.{e}."
                t.update({q + "gate_proj.weight": w(F, D), q + "up_proj.weight": w(F, D),
                          q + "down_proj.weight": w(D, F)})
            t.update({p + "mlp.shared_expert.gate_proj.weight": w(S, D),
                      p + "mlp.shared_expert.up_proj.weight": w(S, D),
                      p + "mlp.shared_expert.down_proj.weight": w(D, S),
                      p + "mlp.shared_expert_gate.weight": w(1, D, scale=1.0)})
        else:
            F = hf["intermediate_size"]
            t.update({p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                      p + "mlp.down_proj.weight": w(D, F)})
    return t


def multimodal_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The text tensors under `model.language_model.`, plus a vision tensor."""
    out = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
           for k, v in tensors.items()}
    out["model.visual.patch_embed.proj.weight"] = np.ones((8, 3, 2, 2, 2), np.float32)
    return out


def _rms_zero_centred(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def numpy_next_forward(hf: dict[str, Any], tensors: dict[str, np.ndarray], ids: np.ndarray,
                       *, split: str = "per_head") -> np.ndarray:
    """Logits [b, s, vocab] in float64. split="kv_group" reads q_proj as the official release
    does (per kv group: the G queries, then the G gates): the wrong reading for this layout."""
    t = {k: np.asarray(v, np.float64) for k, v in tensors.items()}
    H, kv, d = hf["num_attention_heads"], hf["num_key_value_heads"], hf["head_dim"]
    G, eps = H // kv, hf["rms_norm_eps"]
    rope = hf.get("rope_parameters") or {}
    factor = hf.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25))
    theta = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    rot = int(d * factor)
    b, s = ids.shape
    inv_freq = 1.0 / theta ** (np.arange(0, rot, 2) / rot)
    freqs = np.arange(s)[:, None] * inv_freq[None]
    emb = np.concatenate([freqs, freqs], axis=-1)  # [s, rot]
    cos, sin = np.cos(emb)[None, :, None], np.sin(emb)[None, :, None]

    def rotary(x: np.ndarray) -> np.ndarray:
        x_rot, x_pass = x[..., :rot], x[..., rot:]
        return np.concatenate([x_rot * cos + _rotate_half(x_rot) * sin, x_pass], axis=-1)

    causal = np.tril(np.ones((s, s), bool))
    x = t["model.embed_tokens.weight"][ids]
    for i in range(hf["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms_zero_centred(x, t[p + "input_layernorm.weight"], eps)
        q_all = h @ t[p + "self_attn.q_proj.weight"].T  # [b, s, H * 2d]
        if split == "per_head":
            both = q_all.reshape(b, s, H, 2 * d)
            q, gate = both[..., :d], both[..., d:].reshape(b, s, H * d)
        else:
            grouped = q_all.reshape(b, s, kv, 2 * G * d)
            q = grouped[..., : G * d].reshape(b, s, H, d)
            gate = grouped[..., G * d:].reshape(b, s, H * d)
        q = _rms_zero_centred(q, t[p + "self_attn.q_norm.weight"], eps)
        k = (h @ t[p + "self_attn.k_proj.weight"].T).reshape(b, s, kv, d)
        k = _rms_zero_centred(k, t[p + "self_attn.k_norm.weight"], eps)
        v = (h @ t[p + "self_attn.v_proj.weight"].T).reshape(b, s, kv, d)
        q, k = rotary(q), rotary(k)
        k, v = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(d)
        scores = np.where(causal, scores, -np.inf)
        probs = _softmax(scores)
        attn = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, H * d)
        attn = attn * _sigmoid(gate)
        x = x + attn @ t[p + "self_attn.o_proj.weight"].T
        h = _rms_zero_centred(x, t[p + "post_attention_layernorm.weight"], eps)

        def mlp(h: np.ndarray, q_: str) -> np.ndarray:
            return (_silu(h @ t[q_ + "gate_proj.weight"].T) * (h @ t[q_ + "up_proj.weight"].T)
                    ) @ t[q_ + "down_proj.weight"].T

        if _is_moe(hf):
            router = _softmax(h @ t[p + "mlp.gate.weight"].T)
            top = np.argsort(-router, axis=-1)[..., : hf["num_experts_per_tok"]]
            weights = np.take_along_axis(router, top, axis=-1)
            if hf["model_type"] == "qwen3_5_moe_text" or hf.get("norm_topk_prob", True):
                weights = weights / weights.sum(-1, keepdims=True)
            out = np.zeros_like(x)
            for e in range(hf["num_experts"]):
                share = np.where(top == e, weights, 0.0).sum(-1, keepdims=True)
                out += share * mlp(h, f"{p}mlp.experts.{e}.")
            shared_gate = _sigmoid(h @ t[p + "mlp.shared_expert_gate.weight"].T)  # [b, s, 1]
            x = x + out + shared_gate * mlp(h, p + "mlp.shared_expert.")
        else:
            x = x + mlp(h, p + "mlp.")
    x = _rms_zero_centred(x, t["model.norm.weight"], eps)
    head = t["model.embed_tokens.weight"] if hf["tie_word_embeddings"] else t["lm_head.weight"]
    return x @ head.T
