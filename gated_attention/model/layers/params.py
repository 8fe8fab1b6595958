"""Parameter creation with logical axis names, so sharding.py can place every weight."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from gated_attention.parallel.sharding import logical_axes  # noqa: F401 - its former home

INIT_STD = 0.02


def param(
    rngs: nnx.Rngs,
    shape: Sequence[int],
    names: Sequence[str | None],
    *,
    init: str = "normal",
    std: float = INIT_STD,
    dtype: jnp.dtype = jnp.float32,
) -> nnx.Param:
    """A parameter initialised as normal(0, std), zeros or ones, tagged with logical axes.

    The paper initialises every linear, gates included, as normal(0, 0.02).
    """
    if len(shape) != len(names):
        raise ValueError(f"shape {tuple(shape)} and axis names {tuple(names)} differ in rank")
    if init == "normal":
        value = std * jax.random.normal(rngs.params(), tuple(shape), dtype)
    elif init == "zeros":
        value = jnp.zeros(tuple(shape), dtype)
    elif init == "ones":
        value = jnp.ones(tuple(shape), dtype)
    else:
        raise ValueError(f"init={init!r} is not allowed; choose one of normal, zeros, ones")
    return nnx.Param(value, out_sharding=tuple(names), eager_sharding=False)


def cast(p: nnx.Param, dtype: jnp.dtype) -> jax.Array:
    """The parameter's value in the compute dtype (weights stay float32 in memory)."""
    return p[...].astype(dtype)
