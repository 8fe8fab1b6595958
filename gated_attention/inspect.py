"""Parameter and FLOP accounting for any config, without allocating weights.

    python -m gated_attention.inspect \
        --config=configs/ablation.py:arch=dense_1p7b_28l,variant=g1_sdpa_elementwise [--json]

Prints total parameters, parameters added versus the same arch's baseline, per-module counts
(layers folded together), training FLOPs per token (6 x matmul parameters active per token
+ causal attention) and per-device memory on a mesh (`--mesh=data=1,fsdp=8,tensor=1`, or
config.mesh with `--num_devices=8`; formula in gated_attention/memory.py). The model is
built with `nnx.eval_shape`, so 15B-parameter configs work on a laptop.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections import defaultdict
from typing import Any

import jax
from flax import nnx

from gated_attention.layers.params import logical_axes
from gated_attention.model_config import ModelConfig
from gated_attention.variants import VARIANTS


@functools.lru_cache(maxsize=64)
def _param_leaves(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], tuple[str, ...]]]:
    from gated_attention.model import abstract_model

    model = abstract_model(cfg.replace(scan_layers=False))  # per-layer names; same counts
    leaves = []
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name = ".".join(str(p) for p in path)
        names = logical_axes(var)
        leaves.append((name, tuple(var.get_value().shape), names))
    return leaves


def module_counts(cfg: ModelConfig) -> dict[str, int]:
    """Parameter count per module kind, summed over layers (`layers.*.attention.q_proj`)."""
    counts: dict[str, int] = defaultdict(int)
    for name, shape, _ in _param_leaves(cfg):
        counts[re.sub(r"layers\.\d+\.", "layers.*.", name)] += math.prod(shape)
    return dict(counts)


def count_params(cfg: ModelConfig) -> int:
    return sum(math.prod(shape) for _, shape, _ in _param_leaves(cfg))


def active_params(cfg: ModelConfig) -> int:
    """Parameters used per token: routed-expert weights count top_k / num_experts of themselves."""
    total = 0.0
    experts, top_k = cfg.experts if cfg.is_moe else (1, 1)
    for _, shape, names in _param_leaves(cfg):
        fraction = top_k / experts if "expert" in names else 1.0
        total += math.prod(shape) * fraction
    return round(total)


def matmul_params(cfg: ModelConfig) -> int:
    """Active parameters that take part in a matmul (no norms, no embedding lookup)."""
    experts, top_k = cfg.experts if cfg.is_moe else (1, 1)
    total = 0.0
    for name, shape, names in _param_leaves(cfg):
        if name.endswith("scale") or name.endswith("theta") or name.endswith("sink_logits"):
            continue
        if name == "embed" and not cfg.tied_embeddings:
            continue  # a lookup; the untied lm_head is the matmul
        total += math.prod(shape) * (top_k / experts if "expert" in names else 1.0)
    return round(total)


def train_flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """6 N (forward + backward matmuls) + causal attention (QK^T and PV, 3x the forward)."""
    heads, _ = cfg.heads
    attention = 6.0 * cfg.num_layers * heads * cfg.head_dim * seq_len  # 3 x 2 S H d (causal)
    return 6.0 * matmul_params(cfg) + attention


def report(cfg: ModelConfig, seq_len: int) -> dict[str, Any]:
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


def format_table(info: dict[str, Any]) -> str:
    rows = [
        ("variant", info["variant"]),
        ("total params", f"{info['total_params']:,}"),
        ("active params / token", f"{info['active_params']:,}"),
        ("added vs baseline", f"{info['params_added_vs_baseline']:+,}"),
        (f"train FLOPs / token (S={info['seq_len']})", f"{info['train_flops_per_token']:.4g}"),
    ]
    rows += [(f"  {name}", f"{count:,}") for name, count in sorted(info["modules"].items())]
    if "memory" in info:
        from gated_attention.memory import format_rows

        rows += format_rows(info["memory"])
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{k:<{width}}  {v:>18}" for k, v in rows)


def main(argv: list[str]) -> None:
    del argv
    from absl import flags

    from gated_attention.config_lib import model_config

    config = flags.FLAGS.config
    info = report(model_config(config), config.data.seq_len)
    extra = _extra_reports(config)
    info.update(extra)
    print(json.dumps(info, indent=2) if flags.FLAGS.json else format_table(info))


def _extra_reports(config: Any) -> dict[str, Any]:
    """Hook for sections other modules add (e.g. per-device memory on a mesh)."""
    from absl import flags

    from gated_attention import memory

    mesh = flags.FLAGS["mesh"].value if "mesh" in flags.FLAGS else ""
    devices = flags.FLAGS["num_devices"].value if "num_devices" in flags.FLAGS else None
    accelerator = flags.FLAGS["accelerator"].value if "accelerator" in flags.FLAGS else ""
    try:
        return {"memory": memory.report(config, mesh or "", devices, accelerator or "")}
    except ValueError as err:  # a bad --mesh / --num_devices / config.mesh: say which
        from absl import app

        raise app.UsageError(str(err)) from None


if __name__ == "__main__":
    from absl import app, flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
    flags.DEFINE_string("mesh", "", "Mesh to plan memory for, e.g. data=1,fsdp=8,tensor=1 "
                        "(default: config.mesh).")
    flags.DEFINE_integer("num_devices", None, "Devices to plan for (default: the --mesh "
                         "product, else the devices of this machine).")
    flags.DEFINE_string("accelerator", "", "Also compile the train step for this Cloud TPU "
                        "slice (v5p-64, v5litepod-16, ...; needs libtpu) and show the compiler's "
                        "per-device memory (see gated_attention/preflight.py).")
    flags.mark_flags_as_required(["config"])
    jax.config.update("jax_platforms", "cpu")
    app.run(main)
