"""G1 against a text sink at two heads per layer: the text recipe's one lever that gathered
first-token weight (docs/sinks.md, "Two levers that did not bring the sink sooner").

At four heads per layer the text recipe (experiments/grids/text_sink_cpu.py) formed a sink in
one of three full-length baselines. With two heads per layer of width 64 (the projections
keep their size) one seed-0 run put 9x the uniform weight on the first token in its last
layer by step 1,500. This grid trains baseline and G1 elementwise at that shape for the
recipe's first 1,500 steps (the learning-rate schedule stays the recipe's 3,000 steps, so
each step sees the rate the full run gives it), at as many seeds as asked:

    python -m experiments.run_grid experiments/grids/text_sink_heads2_cpu.py \
        --root runs/text_sink_heads2 --seeds 0,1,2,3,4 --no_analyze
    python -m experiments.summarize runs/text_sink_heads2

`make tables --only text_sink_heads2_cpu` runs it at seeds 0-4 (ten runs of about half an
hour of one core) and writes the table into docs/sinks.md.
"""

from experiments.grid_lib import Run
from experiments.grids import text_sink_cpu

VARIANTS = text_sink_cpu.VARIANTS
STEPS = 1500
TWO_HEADS = (("model.num_heads", 2), ("model.num_kv_heads", 1), ("model.head_dim", 64))
RECIPE = tuple((k, STEPS if k == "train.steps" else v)
               for k, v in text_sink_cpu.TEXT_SINK_RECIPE) + TWO_HEADS


def runs(scale: str = "tiny", seeds: tuple[int, ...] = (0,)) -> list[Run]:
    return text_sink_cpu.runs(scale, seeds, recipe=RECIPE, tag="h2")
