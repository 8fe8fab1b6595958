"""Parameter and FLOP accounting for a ModelConfig, without allocating weights.

The model is built with `nnx.eval_shape`, so 15B-parameter configs are counted on a laptop.
`python -m gated_attention.inspect` prints these numbers; `memory.py` plans per-device
bytes from `param_leaves`; `run_config` narrows the FFN of gated models with `count_params`.
"""

from __future__ import annotations

import functools
import math
import re
from collections import defaultdict
from typing import Any, NamedTuple

from flax import nnx

from gated_attention.model.model_config import ModelConfig
from gated_attention.model.transformer import abstract_model
from gated_attention.model.variants import VARIANTS
from gated_attention.parallel.sharding import logical_axes


class ParamLeaf(NamedTuple):
    """One parameter: dotted path (`layers.0.attention.q_proj`), shape, logical axis names."""

    name: str
    shape: tuple[int, ...]
    axes: tuple[str | None, ...]


@functools.lru_cache(maxsize=64)
def param_leaves(cfg: ModelConfig) -> tuple[ParamLeaf, ...]:
    """Every parameter of the model `cfg` describes (abstract: no weights are allocated).

    Named per layer (`layers.3.attention.q_proj`) even for a scanned model: same counts."""
    model = abstract_model(cfg.replace(scan_layers=False))
    return tuple(
        ParamLeaf(".".join(str(p) for p in path), tuple(var.get_value().shape),
                  logical_axes(var))
        for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)))


def module_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameter count per module kind, summed over layers (`layers.*.attention.q_proj`)."""
    counts: dict[str, int] = defaultdict(int)
    for leaf in param_leaves(cfg):
        counts[re.sub(r"layers\.\d+\.", "layers.*.", leaf.name)] += math.prod(leaf.shape)
    return dict(counts)


def count_params(cfg: ModelConfig) -> int:
    return sum(math.prod(leaf.shape) for leaf in param_leaves(cfg))


def _active_fraction(cfg: ModelConfig, leaf: ParamLeaf) -> float:
    """Routed-expert weights are used top_k / num_experts of the time; the rest always."""
    if not cfg.is_moe or "expert" not in leaf.axes:
        return 1.0
    experts, top_k = cfg.experts
    return top_k / experts


def active_params(cfg: ModelConfig) -> int:
    """Parameters used per token: routed-expert weights count top_k / num_experts of themselves."""
    return round(sum(math.prod(leaf.shape) * _active_fraction(cfg, leaf)
                     for leaf in param_leaves(cfg)))


def matmul_params(cfg: ModelConfig) -> int:
    """Active parameters that take part in a matmul (no norms, no embedding lookup)."""
    total = 0.0
    for leaf in param_leaves(cfg):
        if leaf.name.endswith(("scale", "theta", "sink_logits")) or re.search(
                r"\.gate(_\w+)?\.bias$", leaf.name):
            continue
        if leaf.name == "embed" and not cfg.tied_embeddings:
            continue  # a lookup; the untied lm_head is the matmul
        total += math.prod(leaf.shape) * _active_fraction(cfg, leaf)
    return round(total)


def gate_width(cfg: ModelConfig) -> int:
    """Gate outputs per token in one layer (0 for an ungated variant)."""
    for leaf in param_leaves(cfg):
        if leaf.name.startswith("layers.0.attention.gate.") and leaf.name.endswith(
                ("kernel", "kernel_b")):
            return math.prod(leaf.shape[1:])
    return 0


def gate_outputs(cfg: ModelConfig, position: str) -> int:
    """Scores per token of the gate at `position`: heads x d, kv_heads x d, heads, kv_heads
    (headwise) or D (G5), with heads after the variant's deltas."""
    variant = cfg.variant
    heads, kv_heads = cfg.heads
    if position == "dense_output":
        return cfg.d_model
    n = heads if position in ("sdpa", "query") else kv_heads
    return n if variant.granularity == "headwise" else n * cfg.head_dim


def gate_params_closed_form(cfg: ModelConfig) -> int:
    """Gate parameters of the whole model in closed form, per gated position and layer:
    constant theta: out; else k x out (full rank) or k r + r out (rank r), + out with a bias;
    k = the gate's input width. Tested against the built model's leaves."""
    variant = cfg.variant
    total = 0
    for position in variant.gate_positions:
        out = gate_outputs(cfg, position)
        if variant.gate_input == "constant":
            total += out
            continue
        k, r = variant.gate_input_width(cfg.d_model), variant.gate_rank
        total += (k * r + r * out) if r else k * out
        total += out if variant.gate_bias else 0
    return total * cfg.num_layers


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """6 N (forward + backward matmuls) + causal attention (QK^T and PV, 3x the forward)."""
    heads, _ = cfg.heads
    attention = 6.0 * cfg.num_layers * heads * cfg.head_dim * seq_len  # 3 x 2 S H d (causal)
    return 6.0 * matmul_params(cfg) + attention


def report(cfg: ModelConfig, seq_len: int) -> dict[str, Any]:
    """Totals, the parameters a variant adds over its arch's baseline, FLOPs, per-module counts."""
    baseline = cfg.replace(variant=VARIANTS["baseline"])
    total = count_params(cfg)
    return {
        "variant": cfg.variant.name,
        "total_params": total,
        "active_params": active_params(cfg),
        "params_added_vs_baseline": total - count_params(baseline),
        "train_flops_per_token": train_flops_per_token(cfg, seq_len),
        "seq_len": seq_len,
        "modules": module_counts(cfg),
    }
