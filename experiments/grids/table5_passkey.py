"""Table 5 on marked pass keys: the long-context protocol on a task a tiny model can learn.

The text grid (table5.py) finds no retrieval at CPU scale: a tiny model trained on general
text does not learn the RULER-like tasks at all. Here both runs train on marked pass keys
(`arch=passkey_tiny`, data.source=passkey, 4-digit keys): at 256 tokens with RoPE base 10k,
then continued at 1024 with base 1M from that checkpoint; each continued run is scored on
held-out keys from 256 to 4096 tokens (4x its length) with plain RoPE and with YaRN. The
question is the paper's: does the gated model keep retrieving beyond the training length
better than the baseline? (docs/long_context.md has what it gave.)

    python -m experiments.run_grid experiments/grids/table5_passkey.py --root runs/table5_pk \
        --seeds 0,1 --analyze_command "$(python -m experiments.grids.table5_passkey)"
    python -m experiments.summarize runs/table5_pk
"""

from __future__ import annotations

from experiments.grids import table5

ARCH = "passkey_tiny"
SETTINGS = dict(
    short=(256, 600), long=(1024, 150, 4), lengths=(256, 512, 1024, 2048, 4096),
    yarn_factor=4.0, examples=32,
    model=(("data.passkey.digits", 4), ("optimizer.peak_lr", 1e-2),
           ("optimizer.final_lr", 1e-2)),
    # pass keys only: a passkey run has no held-out text to take a perplexity on
    eval_flags="--tasks=marked_passkey --ppl_rows=0",
)


def runs(scale: str = "tiny", seeds=(0,)) -> list:
    """The same CPU-sized runs at every scale (a task sized for passkey_tiny, not a paper
    architecture scaled down)."""
    return [run for variant in table5.VARIANTS for seed in seeds
            for run in (table5.short_run(ARCH, variant, seed, scale, SETTINGS),
                        table5.continued_run(ARCH, variant, seed, scale, SETTINGS))]


if __name__ == "__main__":
    print(table5.eval_command("tiny", SETTINGS))
