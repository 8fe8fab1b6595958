"""Hugging Face Qwen3 / Qwen3-MoE tensors <-> this project's parameters (numpy, both ways).

Hugging Face linears store `weight` as [out, in]; this project stores [in, out] with the head
axes split out (q_proj [D, heads, d], o_proj [heads, d, D]). The gated release packs the G1
gate into q_proj: its output is viewed as [kv_heads, G*d + G*w] (G = heads / kv_heads query
heads per kv head, w = d elementwise or 1 headwise), and each kv group holds the queries of
its G heads first, then their gate rows. Splitting the rows contiguously ([all queries | all
gates]) runs without error but mixes heads and gates up whenever kv_heads > 1.

The Qwen3-Next family (hf/layouts.py) packs per *query head* instead: q_proj's output is viewed
as [heads, 2, d], head h's d query rows then its d gate rows; the gate is always elementwise, so
a headwise gate is written with its row repeated d times (the same function). Their MoE layers
add `mlp.shared_expert.*` and `mlp.shared_expert_gate` ([1, D]).

Every function here moves or casts values only, so export(import(x)) == x bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gated_attention.config.run_config import ConfigError
from gated_attention.hf.layouts import LAYOUTS, Layout
from gated_attention.model import model_config
from gated_attention.model.model_config import ModelConfig

Tensors = dict[str, np.ndarray]
Params = dict[str, np.ndarray]  # dotted project paths, e.g. "layers.0.attention.q_proj"
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints carry
# The model dtypes (model_config.DTYPES) as numpy dtypes, for the arrays of a checkpoint file.
DTYPES = {name: np.dtype(dtype) for name, dtype in model_config.DTYPES.items()}


OFFICIAL = LAYOUTS["official"]
SHARED = ("gate_proj", "up_proj", "down_proj")


def gate_width(cfg: ModelConfig, layout: Layout = OFFICIAL) -> int:
    """Gate rows per head packed into q_proj: d (elementwise, or any gate per head), 1
    (headwise, official) or 0."""
    if cfg.variant.name == "g1_sdpa_elementwise" or (layout.next_family and cfg.variant.gated):
        return cfg.head_dim
    return 1 if cfg.variant.name == "g1_sdpa_headwise" else 0


def fused_experts(tensors: Tensors) -> bool:
    """transformers 5 may store a layer's experts as two 3-D tensors: `experts.gate_up_proj`
    [E, 2F, D] (gate rows, then up rows) and `experts.down_proj` [E, D, F]."""
    return "model.layers.0.mlp.experts.gate_up_proj" in tensors


def expected_shapes(cfg: ModelConfig, fused: bool = False, layout: Layout = OFFICIAL
                    ) -> dict[str, tuple[int, ...]]:
    """Every Hugging Face tensor the config implies, with its shape (per-expert MoE tensors
    as on the Hub, or `fused` as transformers 5 may save them)."""
    heads, kv_heads = cfg.heads
    D, d, V = cfg.d_model, cfg.head_dim, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (V, D),
                                          "model.norm.weight": (D,)}
    if not cfg.tied_embeddings:
        shapes["lm_head.weight"] = (V, D)
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": (D,), p + "post_attention_layernorm.weight": (D,),
            p + "self_attn.q_proj.weight": (heads * (d + gate_width(cfg, layout)), D),
            p + "self_attn.k_proj.weight": (kv_heads * d, D),
            p + "self_attn.v_proj.weight": (kv_heads * d, D),
            p + "self_attn.o_proj.weight": (D, heads * d),
        })
        if cfg.qk_norm:
            shapes[p + "self_attn.q_norm.weight"] = (d,)
            shapes[p + "self_attn.k_norm.weight"] = (d,)
        if cfg.qkv_bias:
            shapes[p + "self_attn.q_proj.bias"] = (heads * d,)
            shapes[p + "self_attn.k_proj.bias"] = (kv_heads * d,)
            shapes[p + "self_attn.v_proj.bias"] = (kv_heads * d,)
        if cfg.o_proj_bias:
            shapes[p + "self_attn.o_proj.bias"] = (D,)
        if cfg.shared_expert_mlp_dim:
            S = cfg.shared_expert_mlp_dim
            shapes.update({p + "mlp.shared_expert.gate_proj.weight": (S, D),
                           p + "mlp.shared_expert.up_proj.weight": (S, D),
                           p + "mlp.shared_expert.down_proj.weight": (D, S),
                           p + "mlp.shared_expert_gate.weight": (1, D)})
        if cfg.is_moe:
            experts, _ = cfg.experts
            F = cfg.expert_mlp_dim
            shapes[p + "mlp.gate.weight"] = (experts, D)
            if fused:
                shapes[p + "mlp.experts.gate_up_proj"] = (experts, 2 * F, D)
                shapes[p + "mlp.experts.down_proj"] = (experts, D, F)
                continue
            for e in range(experts):
                q = f"{p}mlp.experts.{e}."
                shapes.update({q + "gate_proj.weight": (F, D), q + "up_proj.weight": (F, D),
                               q + "down_proj.weight": (D, F)})
        else:
            F = cfg.mlp_dim
            shapes.update({p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                           p + "mlp.down_proj.weight": (D, F)})
    return shapes


def check_tensors(tensors: Tensors, cfg: ModelConfig, where: str,
                  layout: Layout = OFFICIAL) -> None:
    """One-line errors for a missing, unexpected or wrongly shaped tensor."""
    shapes = expected_shapes(cfg, fused_experts(tensors), layout)
    for name, shape in shapes.items():
        if name not in tensors:
            raise ConfigError(f"{where}: tensor {name} is missing (config.json implies it, "
                              f"shape {shape})")
        if tuple(tensors[name].shape) != shape:
            raise ConfigError(f"{where}: tensor {name} has shape {tuple(tensors[name].shape)}, "
                              f"but config.json implies {shape}")
    for name in tensors:
        if name in shapes or name.endswith(IGNORED_SUFFIXES):
            continue
        if name == "lm_head.weight" and cfg.tied_embeddings:
            if not np.array_equal(tensors[name], tensors["model.embed_tokens.weight"]):
                raise ConfigError(f"{where}: lm_head.weight differs from the embeddings but "
                                  "config.json has tie_word_embeddings=true")
            continue
        if name.startswith("mtp."):
            raise ConfigError(f"{where}: tensor {name} is a multi-token-prediction head, which "
                              "this model does not have (config.json: mtp_num_hidden_layers)")
        raise ConfigError(f"{where}: tensor {name} is not part of the model config.json "
                          "describes (check the architecture and gate flags)")


# --- layout helpers: [out, in] Hugging Face matrices <-> this project's head-split arrays ---

def _heads_in(w: np.ndarray, heads: int, d: int) -> np.ndarray:
    """[heads*d, D] -> [D, heads, d]."""
    return w.reshape(heads, d, w.shape[-1]).transpose(2, 0, 1)


def _heads_out(p: np.ndarray) -> np.ndarray:
    """[D, heads, d] -> [heads*d, D]."""
    D, heads, d = p.shape
    return p.transpose(1, 2, 0).reshape(heads * d, D)


def split_q_proj(w: np.ndarray, cfg: ModelConfig, layout: Layout = OFFICIAL
                 ) -> tuple[np.ndarray, np.ndarray | None]:
    """Packed q_proj [heads*(d+w), D] -> (queries [D, heads, d], gate kernel or None).

    The gate kernel is [D, heads, d] (elementwise) or [D, heads] (headwise).
    """
    if layout.next_family:
        return split_q_proj_per_head(w, cfg)
    heads, kv_heads = cfg.heads
    d, width, D = cfg.head_dim, gate_width(cfg), cfg.d_model
    group = heads // kv_heads
    grouped = w.reshape(kv_heads, group * (d + width), D)
    queries = grouped[:, : group * d].reshape(heads, d, D).transpose(2, 0, 1)
    if not width:
        return queries, None
    gates = grouped[:, group * d:].reshape(heads, width, D).transpose(2, 0, 1)
    return queries, (gates if width > 1 else gates[:, :, 0])


def split_q_proj_per_head(w: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-Next q_proj [heads*2*d, D], rows [head, (query | gate), d] -> (queries, gate),
    both [D, heads, d]."""
    heads, _ = cfg.heads
    d, D = cfg.head_dim, cfg.d_model
    rows = w.reshape(heads, 2, d, D)
    return rows[:, 0].transpose(2, 0, 1), rows[:, 1].transpose(2, 0, 1)


def pack_q_proj_per_head(queries: np.ndarray, gate: np.ndarray) -> np.ndarray:
    """The inverse of split_q_proj_per_head; a headwise gate [D, heads] is repeated over d."""
    D, heads, d = queries.shape
    if gate.ndim == 2:
        gate = np.repeat(gate[:, :, None], d, axis=2)
    both = np.stack([queries, gate], axis=0)  # [2, D, heads, d]
    return both.transpose(2, 0, 3, 1).reshape(heads * 2 * d, D)


def pack_q_proj(queries: np.ndarray, gate: np.ndarray | None, cfg: ModelConfig,
                layout: Layout = OFFICIAL) -> np.ndarray:
    """The inverse of split_q_proj."""
    if layout.next_family:
        if gate is None:
            raise ConfigError(f"{layout.name}'s q_proj always holds a gate; this model has none")
        return pack_q_proj_per_head(queries, gate)
    heads, kv_heads = cfg.heads
    d, D = cfg.head_dim, cfg.d_model
    group = heads // kv_heads
    rows = [queries.transpose(1, 2, 0).reshape(kv_heads, group * d, D)]
    if gate is not None:
        g = gate if gate.ndim == 3 else gate[:, :, None]
        rows.append(g.transpose(1, 2, 0).reshape(kv_heads, group * g.shape[-1], D))
    return np.concatenate(rows, axis=1).reshape(-1, D)


def to_params(tensors: Tensors, cfg: ModelConfig, layout: Layout = OFFICIAL) -> Params:
    """Checked Hugging Face tensors -> project parameters, float32."""
    heads, kv_heads = cfg.heads
    d, D = cfg.head_dim, cfg.d_model
    f32: Callable[[np.ndarray], np.ndarray] = lambda a: np.asarray(a, np.float32)  # noqa: E731
    t = {name: f32(value) for name, value in tensors.items()}
    params: Params = {"embed": t["model.embed_tokens.weight"],
                      "final_norm.scale": t["model.norm.weight"]}
    if not cfg.tied_embeddings:
        params["lm_head"] = t["lm_head.weight"].T
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        a = q + "attention."
        queries, gate = split_q_proj(t[p + "self_attn.q_proj.weight"], cfg, layout)
        params.update({
            q + "attn_norm.scale": t[p + "input_layernorm.weight"],
            q + "ffn_norm.scale": t[p + "post_attention_layernorm.weight"],
            a + "q_proj": queries,
            a + "k_proj": _heads_in(t[p + "self_attn.k_proj.weight"], kv_heads, d),
            a + "v_proj": _heads_in(t[p + "self_attn.v_proj.weight"], kv_heads, d),
            a + "o_proj": t[p + "self_attn.o_proj.weight"].reshape(D, heads, d)
                                                          .transpose(1, 2, 0),
        })
        if gate is not None:
            params[a + "gate.kernel"] = gate
        if cfg.qk_norm:
            params[a + "q_norm.scale"] = t[p + "self_attn.q_norm.weight"]
            params[a + "k_norm.scale"] = t[p + "self_attn.k_norm.weight"]
        if cfg.qkv_bias:
            params[a + "q_bias"] = t[p + "self_attn.q_proj.bias"].reshape(heads, d)
            params[a + "k_bias"] = t[p + "self_attn.k_proj.bias"].reshape(kv_heads, d)
            params[a + "v_bias"] = t[p + "self_attn.v_proj.bias"].reshape(kv_heads, d)
        if cfg.o_proj_bias:
            params[a + "o_bias"] = t[p + "self_attn.o_proj.bias"]
        if cfg.shared_expert_mlp_dim:
            s_ = p + "mlp.shared_expert."
            params.update({q + f"shared_expert.ffn.{name}": t[s_ + f"{name}.weight"].T
                           for name in SHARED})
            params[q + "shared_expert.gate"] = t[p + "mlp.shared_expert_gate.weight"][0]
        if cfg.is_moe and fused_experts(tensors):
            F = cfg.expert_mlp_dim
            gate_up = t[p + "mlp.experts.gate_up_proj"]  # [E, 2F, D]
            params.update({
                q + "ffn.router": t[p + "mlp.gate.weight"].T,
                q + "ffn.gate_proj": gate_up[:, :F].transpose(0, 2, 1),
                q + "ffn.up_proj": gate_up[:, F:].transpose(0, 2, 1),
                q + "ffn.down_proj": t[p + "mlp.experts.down_proj"].transpose(0, 2, 1),
            })
        elif cfg.is_moe:
            experts = range(cfg.experts[0])
            e = p + "mlp.experts.{}."
            params.update({
                q + "ffn.router": t[p + "mlp.gate.weight"].T,
                q + "ffn.gate_proj": np.stack([t[e.format(j) + "gate_proj.weight"].T
                                               for j in experts]),
                q + "ffn.up_proj": np.stack([t[e.format(j) + "up_proj.weight"].T
                                             for j in experts]),
                q + "ffn.down_proj": np.stack([t[e.format(j) + "down_proj.weight"].T
                                               for j in experts]),
            })
        else:
            for name in ("gate_proj", "up_proj", "down_proj"):
                params[q + f"ffn.{name}"] = t[p + f"mlp.{name}.weight"].T
    return params


def to_tensors(params: Params, cfg: ModelConfig, dtype: str = "float32",
               layout: Layout = OFFICIAL) -> Tensors:
    """Project parameters -> Hugging Face tensors in `dtype` (float32, bfloat16, float16)."""
    if dtype not in DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not allowed; choose one of {', '.join(DTYPES)}")
    heads, kv_heads = cfg.heads
    d, D = cfg.head_dim, cfg.d_model
    P = {k: np.asarray(v) for k, v in params.items()}
    out: Tensors = {"model.embed_tokens.weight": P["embed"], "model.norm.weight":
                    P["final_norm.scale"]}
    if not cfg.tied_embeddings:
        out["lm_head.weight"] = P["lm_head"].T
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        a = q + "attention."
        out.update({
            p + "input_layernorm.weight": P[q + "attn_norm.scale"],
            p + "post_attention_layernorm.weight": P[q + "ffn_norm.scale"],
            p + "self_attn.q_proj.weight": pack_q_proj(P[a + "q_proj"], P.get(a + "gate.kernel"),
                                                       cfg, layout),
            p + "self_attn.k_proj.weight": _heads_out(P[a + "k_proj"]),
            p + "self_attn.v_proj.weight": _heads_out(P[a + "v_proj"]),
            p + "self_attn.o_proj.weight": P[a + "o_proj"].transpose(2, 0, 1)
                                                          .reshape(D, heads * d),
        })
        if cfg.qk_norm:
            out[p + "self_attn.q_norm.weight"] = P[a + "q_norm.scale"]
            out[p + "self_attn.k_norm.weight"] = P[a + "k_norm.scale"]
        if cfg.qkv_bias:
            out[p + "self_attn.q_proj.bias"] = P[a + "q_bias"].reshape(heads * d)
            out[p + "self_attn.k_proj.bias"] = P[a + "k_bias"].reshape(kv_heads * d)
            out[p + "self_attn.v_proj.bias"] = P[a + "v_bias"].reshape(kv_heads * d)
        if cfg.o_proj_bias:
            out[p + "self_attn.o_proj.bias"] = P[a + "o_bias"]
        if cfg.shared_expert_mlp_dim:
            for name in SHARED:
                out[p + f"mlp.shared_expert.{name}.weight"] = P[q + f"shared_expert.ffn.{name}"].T
            out[p + "mlp.shared_expert_gate.weight"] = P[q + "shared_expert.gate"][None, :]
        if cfg.is_moe:
            out[p + "mlp.gate.weight"] = P[q + "ffn.router"].T
            for j in range(cfg.experts[0]):
                e = f"{p}mlp.experts.{j}."
                for name in ("gate_proj", "up_proj", "down_proj"):
                    out[e + f"{name}.weight"] = P[q + f"ffn.{name}"][j].T
        else:
            for name in ("gate_proj", "up_proj", "down_proj"):
                out[p + f"mlp.{name}.weight"] = P[q + f"ffn.{name}"].T
    target = DTYPES[dtype]
    return {k: np.ascontiguousarray(v.astype(target)) for k, v in out.items()}
