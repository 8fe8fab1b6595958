"""What `impl="auto"` takes, as data: per platform, the implementations in order of speed.

`auto` walks the platform's list and takes the first implementation whose capabilities cover
the request (normaliser, segment ids, dtype, equal lengths); nothing is ever silently dropped,
and XLA (every feature, any platform) ends every list. The order is a prediction, not a
measurement: no GPU or TPU has timed these implementations against each other yet. Its basis
is given per platform in PREFERENCE's comment (cuDNN's expected throughput on an H200, the
Triton and Mosaic kernels' predicted fraction of it, XLA's lack of fusion). Change it when a
benchmark on that platform says otherwise (benchmarks/attention.py prints the rows that decide
it; docs/kernels_speed.md records which measurement each order rests on).
"""

from __future__ import annotations

import dataclasses

from gated_attention.core.checks import choice
from gated_attention.core.errors import UserError
from gated_attention.ops.reference import NORMALIZERS

ALL_NORMALIZERS = frozenset(NORMALIZERS)
HALF = frozenset({"bfloat16", "float16"})
ANY_DTYPE = frozenset({"float32", "bfloat16", "float16", "float64"})


@dataclasses.dataclass(frozen=True)
class Capability:
    """What one implementation can serve."""

    normalizers: frozenset[str] = ALL_NORMALIZERS
    segments: bool = True
    dtypes: frozenset[str] = ANY_DTYPE
    cross_lengths: bool = False  # query and key lengths may differ
    platforms: frozenset[str] = frozenset({"cpu", "gpu", "tpu"})
    x64: bool = True  # traces with jax_enable_x64 on
    windows: bool = False  # sliding-window masks (AttentionVariant.window)

    def serves(self, *, normalizer: str, segments: bool, dtype: str | None, same_length: bool,
               platform: str, x64: bool = False, window: bool = False) -> bool:
        return (platform in self.platforms and normalizer in self.normalizers
                and (self.x64 or not x64) and (self.windows or not window)
                and (self.segments or not segments)
                and (dtype or "float32") in self.dtypes  # unknown dtype: taken as float32
                and (self.cross_lengths or same_length))


CAPABILITIES: dict[str, Capability] = {
    "xla": Capability(cross_lengths=True, windows=True),
    # jax.nn.dot_product_attention(implementation="cudnn"): plain softmax, 16-bit, no packing.
    "cudnn": Capability(normalizers=frozenset({"softmax"}), segments=False, dtypes=HALF,
                        cross_lengths=True, platforms=frozenset({"gpu"})),
    # jax's private cuDNN entry point with segment lengths / offsets (cudnn_packed.py).
    "cudnn_packed": Capability(normalizers=frozenset({"softmax"}), dtypes=HALF,
                               platforms=frozenset({"gpu"})),
    "pallas_gpu": Capability(dtypes=ANY_DTYPE - {"float64"}, platforms=frozenset({"gpu"}),
                             windows=True),
    "pallas_tpu": Capability(dtypes=ANY_DTYPE - {"float64"}, platforms=frozenset({"tpu"}),
                             windows=True),
    # jax's splash attention: sinks cover off-by-one (a zero sink) and learned sinks.
    "splash": Capability(normalizers=ALL_NORMALIZERS - {"softpick"},
                         dtypes=frozenset({"float32", "bfloat16"}),
                         platforms=frozenset({"tpu"}), x64=False, windows=True),
}
# Outside `auto`'s lists: chunked XLA (chosen by name, for long contexts) serves windows too.
WINDOW_IMPLS = ("xla", "chunked", *(name for name, c in CAPABILITIES.items()
                                    if c.windows and name != "xla"))

# Fastest first. GPU: cuDNN (about 410-470 TFLOP/s fwd+bwd on an H200 at B4 S4096 H16 D128)
# ahead of the Triton kernel (predicted 0.4-0.55x of it); packed batches stay on the Triton
# kernel until a GPU measurement puts packed cuDNN ahead (benchmarks/device_benchmark.sh
# measures both); TPU: splash, predicted 1.3-2x the project's Mosaic kernel, until a TPU
# measurement says otherwise; CPU: XLA.
PREFERENCE: dict[str, tuple[str, ...]] = {
    "gpu": ("cudnn", "pallas_gpu", "cudnn_packed", "xla"),
    "tpu": ("splash", "pallas_tpu", "xla"),
    "cpu": ("xla",),
}


def choose(platform: str, *, normalizer: str, segments: bool, dtype: str | None,
           same_length: bool, x64: bool = False, window: bool = False) -> str:
    """The first implementation in PREFERENCE[platform] that serves every requested feature."""
    choice("platform", platform, PREFERENCE, UserError)
    for impl in PREFERENCE[platform]:
        if CAPABILITIES[impl].serves(normalizer=normalizer, segments=segments, dtype=dtype,
                                     same_length=same_length, platform=platform, x64=x64,
                                     window=window):
            return impl
    return "xla"
