"""Does sharing one gate across heads cost more with more heads? The sink task at 4 and 8 heads.

At two heads per layer (experiments/grids/sinks_cpu.py) the head-shared G1 gate removes the
first-token sink as fully as the head-specific one, where the paper's keeps F-Attn 0.301.
The guess "two heads leave little to share" predicts that with more heads per layer the
shared gate leaves more sink than the head-specific one. This grid tests it: the baseline,
G1 elementwise (head-specific) and G1 head-shared under the sinks grid's recipe with 4 (and
8) heads per layer, the attention width kept at d_model (head_dim 16 at 4 heads, 8 at 8):

    python -m experiments.run_grid experiments/grids/sinks_heads_cpu.py \
        --root runs/sinks_heads_cpu --seeds 0,1,2
    python -m experiments.summarize runs/sinks_heads_cpu

`make tables --only sinks_heads4_cpu` (and `sinks_heads8_cpu`) runs it at 4 (8) heads, seeds
0-4, and writes the table into docs/sinks.md.
"""

from experiments.grid_lib import Run
from experiments.grids.sinks_cpu import RECIPE, TABLE4, SinkRun

VARIANTS = ("baseline", "g1_sdpa_elementwise", "g1_sdpa_head_shared")
HEADS = (4, 8)


def _recipe(heads: int) -> tuple[tuple[str, object], ...]:
    """The sinks grid's recipe at `heads` heads per layer of width 64 / heads."""
    widths = {"model.num_heads": heads, "model.num_kv_heads": heads}
    return tuple((k, widths.get(k, v)) for k, v in RECIPE) + (("model.head_dim", 64 // heads),)


def runs(scale: str = "tiny", seeds: tuple[int, ...] = (0,)) -> list[Run]:
    del scale  # the recipe fixes the run length and batch
    return [SinkRun(arch="sink_tiny", variant=v, seed=s, overrides=_recipe(h), table=TABLE4)
            for h in HEADS for v in VARIANTS for s in seeds]
