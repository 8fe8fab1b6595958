"""Pre-norm decoder block: x + attn(norm(x)), then x + ffn(norm(x)); optional sandwich norm.

Sandwich norm (Table 2's `baseline_sandwich_norm`) also normalises each branch's output before
it is added to the residual stream.
"""

from __future__ import annotations

import jax
from flax import nnx

from gated_attention.model.layers.attention import Attention
from gated_attention.model.layers.kv_cache import KVCache
from gated_attention.model.layers.mlp import SwiGLU
from gated_attention.model.layers.norms import RMSNorm
from gated_attention.model.model_config import ModelConfig

Aux = dict[str, jax.Array]


class DecoderBlock(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        norm = lambda: RMSNorm(cfg.d_model, rngs=rngs, eps=cfg.norm_eps,  # noqa: E731
                               zero_centred=cfg.zero_centred_norm)
        self.attn_norm = norm()
        self.attention = Attention(cfg, rngs=rngs)
        self.ffn_norm = norm()
        if cfg.is_moe:
            from gated_attention.model.layers.moe import MoEFeedForward

            self.ffn = MoEFeedForward(cfg, rngs=rngs)
            if cfg.shared_expert_mlp_dim:  # Qwen3-Next / Qwen3.5-MoE imports
                from gated_attention.model.layers.shared_expert import SharedExpert

                self.shared_expert = SharedExpert(cfg.d_model, cfg.shared_expert_mlp_dim,
                                                  rngs=rngs, dtype=cfg.compute_dtype)
        else:
            self.ffn = SwiGLU(cfg.d_model, cfg.mlp_dim, rngs=rngs, dtype=cfg.compute_dtype)
        if cfg.variant.sandwich_norm:
            self.post_attn_norm = norm()
            self.post_ffn_norm = norm()

    def _sow(self, capture: frozenset[str], name: str, value: jax.Array) -> None:
        if name in capture:
            self.sow(nnx.Intermediate, name, value)

    def __call__(self, x: jax.Array, positions: jax.Array, segment_ids: jax.Array | None = None,
                 capture: frozenset[str] = frozenset(), kv_cache: KVCache | None = None,
                 ) -> tuple[jax.Array, Aux]:
        sandwich = self.cfg.variant.sandwich_norm
        attn = self.attention(self.attn_norm(x), positions, segment_ids, capture, kv_cache)
        if sandwich:
            attn = self.post_attn_norm(attn)
        self._sow(capture, "attn_output", attn)
        x = x + attn.astype(x.dtype)
        self._sow(capture, "resid_after_attn", x)
        aux: Aux = {}
        if self.cfg.is_moe:
            h = self.ffn_norm(x)
            ffn, aux = self.ffn(h)
            if self.cfg.shared_expert_mlp_dim:
                ffn = ffn + self.shared_expert(h).astype(ffn.dtype)
        else:
            ffn = self.ffn(self.ffn_norm(x))
        if sandwich:
            ffn = self.post_ffn_norm(ffn)
        self._sow(capture, "ffn_output", ffn)
        x = x + ffn.astype(x.dtype)
        self._sow(capture, "resid_after_ffn", x)
        return x, aux
