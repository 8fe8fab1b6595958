"""Language-model loss: token cross-entropy, optional z-loss, MoE auxiliary losses."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def cross_entropy(logits: jax.Array, targets: jax.Array, mask: jax.Array,
                  z_loss: float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean next-token cross-entropy over positions where mask is true (float32).

    z_loss adds `z_loss * mean(logsumexp(logits)^2)`, which keeps the softmax normaliser near 1
    (as in PaLM); it is reported separately either way.
    """
    logits = logits.astype(jnp.float32)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    weights = mask.astype(jnp.float32)
    denom = jnp.maximum(jnp.sum(weights), 1.0)
    nll = jnp.sum((lse - target_logit) * weights) / denom
    z = jnp.sum(jnp.square(lse) * weights) / denom
    loss = nll + z_loss * z
    return loss, {"nll": nll, "z_loss": z, "tokens": jnp.sum(weights)}
