"""cuDNN flash attention through jax.nn.dot_product_attention (GPU only).

It takes no segment ids (packed batches: cudnn_packed.py) and knows only plain softmax, so
those requests are refused here rather than silently dropped; the gate is applied right
after, where XLA fuses it.

jax decides at trace time whether cuDNN can serve a call, from the *host's* GPU and cuDNN
library. A program traced for a GPU it does not run on (a deviceless compile, the GPU branch
of a platform choice on a CPU or TPU host) gets those checks answered for the target instead
(`target_checks`): the compute capability of the GPU named by `compiling_for(...,
device_kind=...)` (Hopper when none is named) and cuDNN 9.8, the CUDA 12 wheels'. XLA builds
the cuDNN graph only when it compiles on a GPU, so cuDNN's own shape support is checked there.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

import jax

from gated_attention.core.errors import UserError
from gated_attention.ops.gating import apply_output_gate
from gated_attention.ops.target import target_device_kind, target_override, target_platform

# Compute capability by device kind (NVIDIA's CUDA GPU list); the first match names the GPU.
CAPABILITIES = {"a100": (8, 0), "gh200": (9, 0), "h100": (9, 0), "h200": (9, 0),
                "b200": (10, 0)}
ASSUMED_CAPABILITY = (9, 0)  # a target GPU known only as "a GPU": Hopper
ASSUMED_CUDNN = 90800        # cuDNN 9.8, as jax's version check spells it


def target_capability() -> tuple[int, int] | None:
    """The target GPU's compute capability; None when the host's own GPU is the target."""
    kind = (target_device_kind() or "").lower()
    for key, capability in CAPABILITIES.items():
        if key in kind:
            return capability
    return None if jax.default_backend() == "gpu" else ASSUMED_CAPABILITY


@contextlib.contextmanager
def target_checks() -> Iterator[None]:
    """jax's cuDNN trace-time checks answered for the target GPU, not the host."""
    capability = target_capability()
    if capability is None:  # tracing on the target GPU itself: jax's own checks
        yield
        return
    from jax._src.cudnn import fused_attention_stablehlo as fused

    def at_least(version: str) -> bool:
        return capability >= tuple(int(x) for x in version.split("."))

    def equal(version: str) -> bool:
        return capability == tuple(int(x) for x in version.split("."))

    with mock.patch.object(fused, "check_compute_capability", at_least), \
            mock.patch.object(fused, "is_cuda_compute_capability_equal", equal), \
            mock.patch.object(fused, "check_cudnn_version", lambda: ASSUMED_CUDNN):
        yield


def check_target(impl: str, q: jax.Array) -> None:
    """Refuse a target known not to be a GPU: the one `compiling_for` names, or the host when
    the call runs eagerly there. A traced call may be lowered for any platform: a GPU target
    keeps it, another platform's compiler refuses the cuDNN call."""
    eager_off_gpu = not isinstance(q, jax.core.Tracer) and jax.default_backend() != "gpu"
    if (target_override() or "gpu") != "gpu" or (target_override() is None and eager_off_gpu):
        raise UserError(f"impl={impl!r} needs a GPU; the target is {target_platform()!r}. "
                        "Use impl='xla' or 'auto'")


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    gate: jax.Array | None = None,
    gate_activation: str = "sigmoid",
    segment_ids: jax.Array | None = None,
    causal: bool = True,
    normalizer: str = "softmax",
    sink_logits: jax.Array | None = None,
) -> jax.Array:
    if segment_ids is not None:
        raise UserError("impl='cudnn' does not support segment_ids; use impl='cudnn_packed', "
                        "'pallas_gpu', 'xla' or 'auto'")
    if normalizer != "softmax":
        raise UserError(f"impl='cudnn' supports normalizer='softmax' only, not {normalizer!r}; "
                        "use impl='pallas_gpu', 'xla' or 'auto'")
    check_target("cudnn", q)
    with target_checks():
        out = jax.nn.dot_product_attention(q, k, v, is_causal=causal, implementation="cudnn")
    return apply_output_gate(out, gate, gate_activation)
