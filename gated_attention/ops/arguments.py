"""The checks every attention kernel's arguments pass, written once.

`ops.attention` runs them at its door (with the choice of implementation, dispatch.py) and
then calls a kernel's `trusted_attention`, which checks only what that kernel alone refuses; a
kernel's public `attention`, called directly, runs them itself. Every refusal is a
`UserError` that names the argument and what is allowed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax

from gated_attention.core.checks import choice
from gated_attention.core.errors import UserError
from gated_attention.ops.gating import GATE_ACTIVATIONS
from gated_attention.ops.reference import NORMALIZERS


def check_arguments(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    gate: jax.Array | None,
    gate_activation: str,
    segment_ids: jax.Array | None,
    normalizer: str,
    sink_logits: jax.Array | None,
    window: int = 0,
) -> None:
    """Raise a UserError unless the arrays' shapes agree and every option is allowed."""
    if window < 0:
        raise UserError(f"window={window} must be >= 0 (0 = no window)")
    choice("normalizer", normalizer, NORMALIZERS, UserError)
    choice("gate_activation", gate_activation, GATE_ACTIVATIONS, UserError)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise UserError("q, k, v must be [batch, seq, heads, head_dim]; got shapes "
                        f"{q.shape}, {k.shape}, {v.shape}")
    if k.shape != v.shape:
        raise UserError(f"k and v must have the same shape; got {k.shape} and {v.shape}")
    b, s, h, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise UserError(f"k/v batch and head_dim must match q; got q {q.shape}, k {k.shape}")
    if h % k.shape[2]:
        raise UserError(f"query heads ({h}) must be a multiple of kv heads ({k.shape[2]})")
    if gate is not None and gate.shape not in ((b, s, h, d), (b, s, h)):
        raise UserError(
            f"gate must be [b, s, h, d]={(b, s, h, d)} (elementwise) or [b, s, h]={(b, s, h)} "
            f"(headwise); got {gate.shape}"
        )
    if segment_ids is not None and segment_ids.shape != (b, s):
        raise UserError(f"segment_ids must be [batch, seq]={(b, s)}; got {segment_ids.shape}")
    if normalizer == "learned_sink":
        if sink_logits is None or sink_logits.shape != (h,):
            got = None if sink_logits is None else sink_logits.shape
            raise UserError(f"normalizer='learned_sink' needs sink_logits of shape ({h},); "
                            f"got {got}")
    elif sink_logits is not None:
        raise UserError(f"sink_logits is only used with normalizer='learned_sink', "
                        f"not {normalizer!r}")


def checked(trusted_attention: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """A kernel's public `attention`: `check_arguments`, then its `trusted_attention` (the
    function `ops.attention` calls once its door has checked the same arguments)."""

    def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, gate: jax.Array | None = None,
                  gate_activation: str = "sigmoid", segment_ids: jax.Array | None = None,
                  normalizer: str = "softmax", sink_logits: jax.Array | None = None,
                  window: int = 0, **options) -> jax.Array:
        check_arguments(q, k, v, gate=gate, gate_activation=gate_activation,
                        segment_ids=segment_ids, normalizer=normalizer,
                        sink_logits=sink_logits, window=window)
        return trusted_attention(q, k, v, gate=gate, gate_activation=gate_activation,
                                 segment_ids=segment_ids, normalizer=normalizer,
                                 sink_logits=sink_logits, window=window, **options)

    # its docstring, module and (through __wrapped__) signature: the arguments are the same
    return functools.update_wrapper(attention, trusted_attention,
                                    assigned=("__module__", "__doc__"))
