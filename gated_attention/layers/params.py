"""Parameter creation with logical axis names, so sharding.py can place every weight."""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

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


def logical_axes(var: nnx.Variable) -> tuple[str | None, ...]:
    """The logical axis names a parameter was created with (flax renamed the metadata key)."""
    meta = var.get_metadata()
    names = meta.get("out_sharding") or meta.get("sharding_names") or meta.get("sharding")
    return tuple(names or ())
