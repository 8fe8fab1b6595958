"""RoPE fields of a Hugging Face config.json (`rope_theta`, `rope_scaling`, transformers 5's
`rope_parameters`) <-> config.model.rope_base and config.model.rope_scaling, shared by every
layout (hf/config_map.py, hf/next_config.py)."""

from __future__ import annotations

from typing import Any

from gated_attention.config.run_config import ConfigError

ROPE_TYPES = ("default", "linear", "yarn")
YARN_KEYS = {"rope_type", "type", "factor", "original_max_position_embeddings", "beta_fast",
             "beta_slow", "attention_factor", "rope_theta", "truncate", "partial_rotary_factor",
             "mrope_section", "mrope_interleaved"}


def _fail(where: str, message: str) -> None:
    raise ConfigError(f"{where}: {message}")


def rope_fields(hf: dict[str, Any], where: str = "config.json"
                ) -> tuple[float, dict[str, Any]]:
    """(rope_base, config.model.rope_scaling fields) from `rope_theta` and `rope_scaling`
    (or transformers 5's `rope_parameters`, which holds both)."""
    parameters = hf.get("rope_parameters") or {}
    theta = float(hf.get("rope_theta", parameters.get("rope_theta", 10_000.0)))
    field = "rope_scaling" if hf.get("rope_scaling") is not None else "rope_parameters"
    spec = hf.get(field) or {}
    kind = spec.get("rope_type", spec.get("type", "default"))
    none = dict(type="none", factor=1.0, original_max_position=0, beta_fast=32.0,
                beta_slow=1.0, attention_factor=0.0)
    if kind == "default":
        return theta, none
    if kind not in ROPE_TYPES:
        _fail(where, f"{field}.rope_type={kind!r} is not supported; choose one of "
              f"{', '.join(ROPE_TYPES)}")
    factor = float(spec.get("factor", 1.0))
    if kind == "linear":
        return theta, {**none, "type": "linear", "factor": factor}
    unknown = sorted(set(spec) - YARN_KEYS)
    if unknown:
        _fail(where, f"{field}.{unknown[0]} is not supported for yarn; supported: "
              f"{', '.join(sorted(YARN_KEYS))}")
    if spec.get("truncate", True) is not True:
        _fail(where, f"{field}.truncate=False is not supported; only the default True")
    original = spec.get("original_max_position_embeddings") or hf.get("max_position_embeddings")
    return theta, {**none, "type": "yarn", "factor": factor,
                   "original_max_position": int(original or 0),
                   "beta_fast": float(spec.get("beta_fast") or 32.0),
                   "beta_slow": float(spec.get("beta_slow") or 1.0),
                   "attention_factor": float(spec.get("attention_factor") or 0.0)}


def hf_rope_scaling(fields: dict[str, Any]) -> dict[str, Any] | None:
    """The Hugging Face `rope_scaling` dict for config.model.rope_scaling fields."""
    kind = fields.get("type", "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(fields["factor"])}
    if kind == "yarn":
        out = {"rope_type": "yarn", "factor": float(fields["factor"]),
               "original_max_position_embeddings": int(fields["original_max_position"]),
               "beta_fast": float(fields["beta_fast"]), "beta_slow": float(fields["beta_slow"])}
        if fields.get("attention_factor"):
            out["attention_factor"] = float(fields["attention_factor"])
        return out
    raise ConfigError(f"model.rope_scaling.type={kind!r} has no Hugging Face form; choose one of "
                      "none, linear, yarn")
