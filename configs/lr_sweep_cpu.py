"""A learning-rate stability recipe that trains on a CPU: a deep, narrow `tiny`.

    python -m experiments.run_grid experiments/grids/lr_cpu.py --root runs/lr_cpu \
        --seeds 0,1 --lr_multipliers 1,2,4,8,16,32 --no_analyze
    python -m experiments.summarize runs/lr_cpu

    --config=configs/lr_sweep_cpu.py:variant=g1_sdpa_elementwise   (one run of it)

The paper's Table 2 stability claim is about depth (48 layers) at a high learning rate: the
baseline degrades or diverges where G1 still trains. LR_RECIPE is the deepest `tiny` one CPU
core trains in minutes (12 layers of width 64, 300 steps of 16 x 128 tokens), with a base
peak learning rate of 3e-2 that the grid's multipliers take up to about 1.
"""

from gated_attention.config.config_files import family_config

LR_RECIPE = {
    "model.num_layers": 12, "model.d_model": 64, "model.num_heads": 4, "model.num_kv_heads": 2,
    "model.head_dim": 16, "model.mlp_dim": 192, "data.seq_len": 128,
    "train.steps": 300, "train.batch_size": 16, "train.eval_every": 300,
    "train.eval_batches": 4, "train.log_every": 10, "train.checkpoint_every": 300,
    "train.on_nonfinite": "skip", "optimizer.peak_lr": 3e-2, "optimizer.final_lr": 3e-4,
    "optimizer.warmup_steps": 30,
    # One compiled block for the 12 layers: unrolled, the step took over ten minutes of a
    # shared CPU to compile; scanned, the same model (tests/test_scan_layers.py) compiles once.
    "model.scan_layers": True,
}
OWN_FIELDS = tuple(LR_RECIPE)  # the recipe is what this file exists to change


def get_config(arg: str | None = None):
    config = family_config(arg, ("tiny",))  # the recipe is a deep, narrow tiny: no other arch
    for key, value in LR_RECIPE.items():
        section, field = key.split(".")
        config[section][field] = value
    return config
