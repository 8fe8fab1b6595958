"""Training-step speed of the baseline and the G1 elementwise gate, side by side, in one run.

    python benchmarks/train_step.py                       # CPU: tiny, seq 256, float32
    python benchmarks/train_step.py --arch=dense_1p7b_28l --seq_len=4096 --batch=4 \
        --dtype=bfloat16 --remat=dots_with_no_batch_dims_saveable   # one H200

Prints one table: median step time, tokens/s and MFU for each variant, and the gate's
overhead as the ratio of step times. MFU = model FLOPs (inspect.train_flops_per_token: 6 x
matmul parameters + causal attention) x tokens/s / the device's peak (bf16 dense peak for
GPUs/TPUs from PEAK_FLOPS, or --peak_tflops; "n/a" on CPU unless given). Batches are random
tokens: speed does not depend on the data.
"""

from __future__ import annotations

import statistics
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from gated_attention import inspect
from gated_attention.cli import flags as cli_flags
from gated_attention.config import run_config
from gated_attention.parallel import distributed, sharding
from gated_attention.training import step as step_lib

# Dense bf16 peak per chip, TFLOP/s (vendor figures, without sparsity).
PEAK_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "TPU v4": 275.0,
               "TPU v5 lite": 197.0, "TPU v5e": 197.0, "TPU v5p": 459.0, "TPU v6": 918.0}


def device_peak_tflops(override: float | None) -> float | None:
    if override:
        return override
    kind = jax.devices()[0].device_kind
    for name, peak in PEAK_TFLOPS.items():
        if name.lower() in kind.lower():
            return peak * jax.device_count()
    return None


def benchmark(arch: str, variant: str, args: types.SimpleNamespace) -> dict[str, float]:
    config = run_config.base_config(arch, variant)
    config.data.seq_len = args.seq_len
    config.train.batch_size = args.batch
    config.train.steps = 1000
    config.model.dtype = args.dtype
    config.model.remat = args.remat
    config.model.attention_impl = args.attention_impl
    cfg = run_config.model_config(config)
    mesh = sharding.create_mesh(config.mesh)
    graphdef, state, shardings = step_lib.create_train_state(config, mesh)
    step = step_lib.jit_train_step(step_lib.make_train_step(graphdef, config), mesh, shardings)
    rng = np.random.default_rng(0)
    shape = (args.batch, args.seq_len)
    batch = {"inputs": rng.integers(3, cfg.vocab_size, shape, dtype=np.int32),
             "targets": rng.integers(3, cfg.vocab_size, shape, dtype=np.int32),
             "mask": np.ones(shape, np.int32)}
    if args.packed:  # segment ids rule out cuDNN attention on a GPU (no segment-ids argument)
        batch["segment_ids"] = np.ones(shape, np.int32)
        batch["positions"] = np.broadcast_to(np.arange(args.seq_len, dtype=np.int32), shape)
    batch = distributed.global_batch(batch, sharding.batch_sharding(mesh), args.batch)
    for _ in range(args.warmup):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - start)
    step_time = statistics.median(times)
    tokens_per_sec = args.batch * args.seq_len / step_time
    flops_per_token = inspect.train_flops_per_token(cfg, args.seq_len)
    return {"step_s": step_time, "tokens_per_sec": tokens_per_sec,
            "tflops": flops_per_token * tokens_per_sec / 1e12,
            "params": inspect.count_params(cfg)}


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("arch", "tiny", "The architecture.", flag_values=flag_values)
    flags.DEFINE_integer("seq_len", 256, "Tokens per row.", flag_values=flag_values)
    flags.DEFINE_integer("batch", 16, "Rows per step.", flag_values=flag_values)
    flags.DEFINE_string("dtype", "float32", "config.model.dtype.", flag_values=flag_values)
    flags.DEFINE_string("remat", "none", "config.model.remat.", flag_values=flag_values)
    flags.DEFINE_string("attention_impl", "auto", "config.model.attention_impl.",
                        flag_values=flag_values)
    flags.DEFINE_integer("steps", 10, "Timed steps (median reported).",
                         flag_values=flag_values)
    flags.DEFINE_integer("warmup", 2, "Warm-up steps.", flag_values=flag_values)
    flags.DEFINE_float("peak_tflops", None, "Device peak for MFU (default: from the device "
                       "kind).", flag_values=flag_values)
    flags.DEFINE_string("variants", "baseline,g1_sdpa_elementwise", "Comma-separated "
                        "variants.", flag_values=flag_values)
    flags.DEFINE_bool("packed", False, "Pass segment ids and positions, as packed training "
                      "batches do.", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/train_step.py", __doc__).parse(
        define_flags(flags.FlagValues()))

    peak = device_peak_tflops(args.peak_tflops)
    device = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
    print(f"device: {device}; arch={args.arch} seq_len={args.seq_len} batch={args.batch} "
          f"dtype={args.dtype} remat={args.remat} packed={args.packed}; "
          f"median of {args.steps} steps")
    rows = {v: benchmark(args.arch, v, args) for v in args.variants.split(",")}
    header = "| variant | params | step (ms) | tokens/s | model TFLOP/s | MFU |"
    print(header)
    print("|---|---|---|---|---|---|")
    for variant, r in rows.items():
        mfu = f"{100 * r['tflops'] / peak:.1f}%" if peak else "n/a"
        print(f"| {variant} | {r['params']:,} | {1e3 * r['step_s']:.1f} | "
              f"{r['tokens_per_sec']:,.0f} | {r['tflops']:.3g} | {mfu} |")
    names = list(rows)
    if len(names) >= 2:
        ratio = rows[names[1]]["step_s"] / rows[names[0]]["step_s"]
        print(f"gate overhead ({names[1]} / {names[0]} step time): {ratio:.3f}")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    jnp.zeros(())  # initialise the backend before timing
    main()
