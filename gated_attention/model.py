"""Decoder-only language model built from layers/: embed, N decoder blocks, norm, logits."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.capture import validate_capture
from gated_attention.layers.block import DecoderBlock
from gated_attention.layers.kv_cache import KVCache
from gated_attention.layers.norms import RMSNorm
from gated_attention.layers.params import cast, param
from gated_attention.model_config import REMAT_POLICIES, ModelConfig
from gated_attention.sharding import constrain


class Transformer(nnx.Module):
    """Pre-norm decoder LM. `__call__` returns (logits [b, s, vocab] float32, aux losses)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.embed = param(rngs, (cfg.vocab_size, cfg.d_model), ("vocab", "embed"))
        self.layers = nnx.List([DecoderBlock(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
        self.final_norm = RMSNorm(cfg.d_model, rngs=rngs, eps=cfg.norm_eps,
                                  zero_centred=cfg.zero_centred_norm)
        if not cfg.tied_embeddings:
            self.lm_head = param(rngs, (cfg.d_model, cfg.vocab_size), ("embed", "vocab"))

    def __call__(self, tokens: jax.Array, *, positions: jax.Array | None = None,
                 segment_ids: jax.Array | None = None,
                 capture: frozenset[str] | tuple[str, ...] = frozenset(),
                 kv_caches: list[KVCache] | None = None,
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """kv_caches: one per layer when decoding (gated_attention/generate.py)."""
        cfg = self.cfg
        capture = validate_capture(capture)
        if capture and kv_caches is not None:
            raise ValueError("capture needs the whole sequence; run the model over the finished "
                             "text instead of capturing while decoding with kv_caches")
        if positions is None:
            positions = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        # FSDP: gather the table's embed dimension before the lookup (as for every weight), so
        # the looked-up rows come out split by batch, not by embed.
        table = constrain(self.embed[...], ("vocab", None))
        x = jnp.take(table, tokens, axis=0).astype(cfg.compute_dtype)
        x = constrain(x, ("batch", "length", "embed"))
        aux_total: dict[str, jax.Array] = {}
        for i, block in enumerate(self.layers):
            if kv_caches is not None:
                x, aux = block(x, positions, segment_ids, capture, kv_caches[i])
            elif cfg.remat != "none" and not capture:
                policy = REMAT_POLICIES[cfg.remat]
                run = nnx.remat(lambda blk, *a: blk(*a), policy=policy)
                x, aux = run(block, x, positions, segment_ids)
            else:
                x, aux = block(x, positions, segment_ids, capture)
            x = constrain(x, ("batch", "length", "embed"))
            for name, value in aux.items():
                aux_total[name] = aux_total.get(name, 0.0) + value
        x = self.final_norm(x)
        head = (cast(self.embed, cfg.compute_dtype).T if cfg.tied_embeddings
                else cast(self.lm_head, cfg.compute_dtype))
        logits = jnp.einsum("bsD,DV->bsV", x, head, preferred_element_type=jnp.float32)
        logits = constrain(logits, ("batch", "length", "vocab"))
        return logits, aux_total


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    return Transformer(cfg, rngs=nnx.Rngs(params=seed))


def abstract_model(cfg: ModelConfig) -> Transformer:
    """The model with ShapeDtypeStructs for weights: parameter counts of 15B models on a laptop."""
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
