"""`ops.attention`: validate once, resolve "auto" for the compile target, call one kernel.

impl: "xla" (reference.py: every feature, any platform), "cudnn" (jax.nn.dot_product_attention
on GPU: plain softmax, no segment ids), "cudnn_packed" (cuDNN over packed sequences through
jax's private entry point: plain softmax, 16-bit), "pallas_gpu" (Triton), "pallas_tpu" (Mosaic),
"splash" (jax's splash attention on TPU: every normaliser but softpick), "chunked"
(chunked.py: the XLA reference's features blockwise, never holding S x S), or "auto": the
fastest that serves every requested feature, from the table in ops/choices.py; a feature is
never silently dropped.

The choices that depend on the platform (what `auto` takes, whether a kernel interprets,
its tile sizes) follow the platform the program is lowered for: the call is traced once per
platform and joined by `jax.lax.platform_dependent` (ops.target.per_platform), so a plain
`jax.jit(...).lower(...)` over compile-only TPU or GPU devices, or `jax.export` for a
platform, carries that platform's kernel. `ops.compiling_for(platform)` overrides it (one
trace). A call with nothing platform-dependent (an explicit impl, interpret given) is traced
once.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from gated_attention.core.checks import choice
from gated_attention.core.errors import UserError
from gated_attention.ops import choices
from gated_attention.ops.arguments import check_arguments
from gated_attention.ops.sharded import Axes, per_device
from gated_attention.ops.target import PLATFORMS, per_platform, target_platform

# impl -> "module.function" under gated_attention.ops that serves it. A kernel whose public
# `attention` repeats this door's checks (ops/arguments.py) is called through its
# `trusted_attention`, which checks only what that kernel alone refuses.
MODULES = {"xla": "reference.attention", "cudnn": "cudnn.attention",
           "cudnn_packed": "cudnn_packed.attention",
           "pallas_gpu": "pallas_gpu.trusted_attention",
           "pallas_tpu": "pallas_tpu.trusted_attention", "splash": "splash.trusted_attention",
           "chunked": "chunked.trusted_attention"}
# Kernels XLA cannot partition: run per device under shard_map; they take interpret and
# block_sizes.
PER_DEVICE = ("pallas_gpu", "pallas_tpu", "splash")
# Where each per-device kernel can be lowered: its platform, and a CPU (interpreted).
KERNEL_PLATFORMS = {"pallas_gpu": ("cpu", "gpu"), "pallas_tpu": ("cpu", "tpu"),
                    "splash": ("cpu", "tpu")}
IMPLS = (*MODULES, "auto")


def validate_attention_args(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    gate: jax.Array | None,
    gate_activation: str,
    segment_ids: jax.Array | None,
    normalizer: str,
    sink_logits: jax.Array | None,
    impl: str,
    window: int = 0,
    splash_fused_backward: bool = False,
) -> None:
    """Raise a UserError naming the argument and its allowed values, before any tracing."""
    choice("impl", impl, IMPLS, UserError)
    if not isinstance(splash_fused_backward, bool):
        raise UserError(f"splash_fused_backward must be True or False, not "
                        f"{splash_fused_backward!r}")
    check_arguments(q, k, v, gate=gate, gate_activation=gate_activation,
                    segment_ids=segment_ids, normalizer=normalizer, sink_logits=sink_logits,
                    window=window)
    if window and impl not in (*choices.WINDOW_IMPLS, "auto"):
        raise UserError(f"impl={impl!r} has no sliding window (window={window}); "
                        f"choose one of {', '.join(choices.WINDOW_IMPLS)} or auto")


def resolve_impl(impl: str, *, segment_ids: jax.Array | None, normalizer: str,
                 platform: str | None = None, dtype: jnp.dtype | None = None,
                 same_length: bool = True, window: int = 0) -> str:
    """Map "auto" to the fastest implementation that supports every requested feature.

    The platform is the compile target (ops.target), not the host; the order per platform
    and what each implementation serves are data in ops/choices.py.
    """
    if impl != "auto":
        return impl
    return choices.choose(platform or target_platform(), normalizer=normalizer,
                          segments=segment_ids is not None,
                          dtype=None if dtype is None else jnp.dtype(dtype).name,
                          same_length=same_length, x64=bool(jax.config.jax_enable_x64),
                          window=bool(window))


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
    impl: str = "xla",
    interpret: bool | None = None,
    block_sizes: dict[str, int] | None = None,
    mesh_axes: Mapping[str, Axes] | None = None,
    window: int = 0,
    splash_fused_backward: bool = False,
) -> jax.Array:
    """softmax-family attention with an optional fused output gate `out * act(gate)`.

    q [b, s, h, d]; k, v [b, t, kv_heads, d]; gate [b, s, h, d] or [b, s, h];
    segment_ids [b, s] (packed sequences never attend across segments);
    sink_logits [h] for normalizer="learned_sink".
    interpret: Pallas kernels in interpret mode: None (default) exactly when compiling for a
    CPU; True always; False never (on a CPU the kernel then fails to lower).
    window > 0: sliding-window attention (a query sees its last `window` keys, itself
    included); served by choices.WINDOW_IMPLS.
    mesh_axes: {"batch": mesh axes, "heads": mesh axes} that split q/k/v under a mesh, for
    the kernels that run per device (default: the batch over the whole mesh).
    splash_fused_backward: where splash runs, dq, dk and dv in one backward kernel (default:
    dq in a kernel of its own; ops/splash.py says why).
    """
    validate_attention_args(
        q, k, v, gate=gate, gate_activation=gate_activation, segment_ids=segment_ids,
        normalizer=normalizer, sink_logits=sink_logits, impl=impl, window=window,
        splash_fused_backward=splash_fused_backward,
    )
    options = dict(gate_activation=gate_activation, causal=causal, normalizer=normalizer,
                   impl=impl, interpret=interpret, block_sizes=block_sizes,
                   mesh_axes=mesh_axes, window=window,
                   splash_fused_backward=splash_fused_backward)
    arrays = dict(gate=gate, segment_ids=segment_ids, sink_logits=sink_logits)
    if impl != "auto" and (impl not in PER_DEVICE or interpret is not None):
        return _attention_on_target(q, k, v, arrays, **options)
    return per_platform(lambda q, k, v, arrays: _attention_on_target(q, k, v, arrays, **options),
                        q, k, v, arrays, platforms=KERNEL_PLATFORMS.get(impl, PLATFORMS))


def _attention_on_target(q: jax.Array, k: jax.Array, v: jax.Array,
                         arrays: Mapping[str, jax.Array | None], *, gate_activation: str,
                         causal: bool, normalizer: str, impl: str, interpret: bool | None,
                         block_sizes: dict[str, int] | None,
                         mesh_axes: Mapping[str, Axes] | None, window: int,
                         splash_fused_backward: bool) -> jax.Array:
    """One kernel call for the target platform (ops.target)."""
    gate, segment_ids, sink_logits = (arrays["gate"], arrays["segment_ids"],
                                      arrays["sink_logits"])
    impl = resolve_impl(impl, segment_ids=segment_ids, normalizer=normalizer, dtype=q.dtype,
                        same_length=k.shape[1] == q.shape[1], window=window)
    module_name, function = MODULES[impl].split(".")
    kernel_attention = getattr(importlib.import_module(f"gated_attention.ops.{module_name}"),
                               function)
    kwargs = dict(gate_activation=gate_activation, causal=causal, normalizer=normalizer)
    optional = dict(gate=gate, segment_ids=segment_ids, sink_logits=sink_logits)
    if window:
        kwargs["window"] = window
    if impl == "splash":
        kwargs["fused_backward"] = splash_fused_backward
    if impl == "chunked":  # blockwise XLA (long contexts): the config's block_q / block_kv
        blocks = {name: size for name, size in (block_sizes or {}).items()
                  if name in ("block_q", "block_kv")}
        return kernel_attention(q, k, v, **kwargs, **optional, **blocks)
    if impl not in PER_DEVICE:
        return kernel_attention(q, k, v, **kwargs, **optional)

    def kernel(q, k, v, **optional):
        return kernel_attention(q, k, v, interpret=interpret, block_sizes=block_sizes,
                                **kwargs, **optional)

    return per_device(kernel, q, k, v, optional, mesh_axes)
