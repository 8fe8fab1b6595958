"""Table 4 at CPU scale: the attention sink on the synthetic Bigram-Backcopy task.

Every Table 4 row (baseline, G1 elementwise / headwise / head-shared, G2 value, G1
input-independent, G1 NS-sigmoid), the other gate positions G3/G4/G5, the additive and SiLU
gates, and three other cures for sinks (off-by-one softmax, learned sink, Softpick), on
`sink_tiny` under the recipe of configs/sinks.py with two heads per layer (so head-shared
differs from head-specific). One run is one to three minutes on one core:

    python -m experiments.run_grid experiments/grids/sinks_cpu.py --root runs/sinks_cpu \
        --seeds 0,1,2
    python -m experiments.summarize runs/sinks_cpu

The recipe's overrides cover every setting a `--scale` would change, so the scale is ignored.
"""

import dataclasses

from experiments.grid_lib import Run

TABLE4 = "table4_sink_and_activation"
TABLE4_ROWS = ("baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise", "g1_sdpa_head_shared",
               "g2_value_elementwise", "g1_input_independent", "g1_ns_sigmoid")
OTHER_GATES = ("g3_key_elementwise", "g4_query_elementwise", "g5_dense_output",
               "g1_sdpa_additive_silu", "g1_sdpa_elementwise_silu")
SINK_CURES = ("softmax_off_by_one", "learned_sink", "softpick")
VARIANTS = TABLE4_ROWS + OTHER_GATES + SINK_CURES
# configs/sinks.py's recipe (the data source is sink_tiny's default), two heads per layer.
RECIPE = (("model.num_heads", 2), ("model.num_kv_heads", 2), ("optimizer.peak_lr", 1e-2),
          ("train.steps", 1000), ("train.batch_size", 64), ("optimizer.warmup_steps", 100),
          ("optimizer.final_lr", 1e-4), ("train.eval_every", 500), ("train.eval_batches", 2),
          ("train.log_every", 50), ("train.checkpoint_every", 1000))


@dataclasses.dataclass(frozen=True)
class SinkRun(Run):
    """A run under the one shared recipe: its directory name leaves the recipe out."""

    @property
    def name(self) -> str:
        lr = "" if self.lr_multiplier is None else f"-lrx{self.lr_multiplier:g}"
        return (f"{self.arch}-h{dict(self.overrides)['model.num_heads']}-{self.variant}{lr}"
                f"-s{self.seed}")


def runs(scale="tiny", seeds=(0,)):
    del scale  # the recipe fixes the run length and batch
    return [SinkRun(arch="sink_tiny", variant=v, seed=s, overrides=RECIPE,
                table=TABLE4 if v in TABLE4_ROWS else "")
            for v in VARIANTS for s in seeds]
