"""Initial weights keyed by parameter name, so variants of one seed share what they can.

`Transformer(cfg, rngs=nnx.Rngs(params=seed))` draws its weights from one key stream in
construction order: a variant with a gate draws the gate's weights in the middle of that
stream, and every weight built after it (the MLP, the next layers) then differs from the
baseline's of the same seed. With `train.init_by_name=True` each randomly initialised weight
is drawn again from `fold_in(PRNGKey(seed), crc32(name))` with the init's own normal(0, 0.02):
two variants of one seed then start from the same embedding, projections and MLP wherever a
weight has the same name and shape. Weights initialised to a constant (norm scales, biases,
zero-initialised gates) keep their value. The grids turn this on (experiments/grid_lib.py).
"""

from __future__ import annotations

import zlib
from typing import Any

import jax
import jax.numpy as jnp

from gated_attention.model.layers.params import INIT_STD


def leaf_name(path: tuple[Any, ...]) -> str:
    """Dotted name of a parameter leaf ("layers.0.attention.q_proj"), as step.parameter_names."""
    parts = [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]
    return ".".join(parts).removesuffix(".value")


def name_key(seed: int, name: str) -> jax.Array:
    return jax.random.fold_in(jax.random.PRNGKey(seed), zlib.crc32(name.encode()) & 0x7FFFFFFF)


def redraw(params: Any, seed: int, std: float = INIT_STD) -> Any:
    """Every non-constant leaf drawn again from its name's key (traceable: runs under jit)."""

    def one(path: tuple[Any, ...], value: jax.Array) -> jax.Array:
        if not jnp.issubdtype(value.dtype, jnp.floating) or value.size < 2:
            return value
        fresh = std * jax.random.normal(name_key(seed, leaf_name(path)), value.shape,
                                        value.dtype)
        constant = jnp.all(value == value.reshape(-1)[0])
        return jnp.where(constant, value, fresh)

    return jax.tree_util.tree_map_with_path(one, params)
