"""Gate activations shared by the model's gate module and the attention kernels.

Kept here (not in layers/) so kernels can fuse the exact same function without importing Flax.
"""

from collections.abc import Callable

import jax
import jax.numpy as jnp

GATE_ACTIVATIONS = ("sigmoid", "silu", "identity", "ns_sigmoid")


def ns_sigmoid(x: jax.Array) -> jax.Array:
    """The paper's non-sparse sigmoid: scores in [0.5, 1]."""
    return 0.5 + 0.5 * jax.nn.sigmoid(x)


_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "sigmoid": jax.nn.sigmoid,
    "silu": jax.nn.silu,
    "identity": lambda x: x,
    "ns_sigmoid": ns_sigmoid,
}


def gate_activation(name: str) -> Callable[[jax.Array], jax.Array]:
    """The activation function called `name` (one of GATE_ACTIVATIONS)."""
    if name not in _ACTIVATIONS:
        raise ValueError(
            f"gate_activation={name!r} is not allowed; choose one of {', '.join(GATE_ACTIVATIONS)}"
        )
    return _ACTIVATIONS[name]


def apply_output_gate(out: jax.Array, gate: jax.Array | None, activation: str) -> jax.Array:
    """`out * act(gate)`; `gate` is [b, s, h, d] (elementwise) or [b, s, h] (headwise)."""
    if gate is None:
        return out
    dtype = jnp.promote_types(out.dtype, jnp.float32)
    scores = gate_activation(activation)(gate.astype(dtype))
    if scores.ndim == out.ndim - 1:
        scores = scores[..., None]
    return (out.astype(dtype) * scores).astype(out.dtype)
