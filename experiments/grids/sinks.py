"""Gating against the other cures for attention sinks: off-by-one softmax, a learned sink
logit and Softpick (not in the paper's tables). Windows start with a BOS token, which is
where a sink forms first at small scale (docs/sinks.md)."""

from experiments.grid_lib import Run, scaled_arch

VARIANTS = ("baseline", "g1_sdpa_elementwise", "softmax_off_by_one", "learned_sink", "softpick")


def runs(scale="tiny", seeds=(0,)):
    arch = scaled_arch("dense_1p7b_28l", scale)
    return [Run(arch=arch, variant=v, seed=s, overrides=(("data.add_bos", True),))
            for v in VARIANTS for s in seeds]
