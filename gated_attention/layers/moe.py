"""Mixture-of-experts FFN: built in the MoE issue. Until then, a clear "not yet" error."""

from __future__ import annotations

from flax import nnx

from gated_attention.model_config import ModelConfig


class MoEFeedForward(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        raise NotImplementedError(
            "MoE layers are not built yet: arch with num_experts > 0 can be inspected "
            "abstractly for attention shapes only"
        )
