"""What fault tolerance costs: the non-finite guard in the train step, and the fingerprint
that verifies a checkpoint, in one run.

    python benchmarks/fault_overhead.py                  # CPU: tiny, seq 256, batch 8
    python benchmarks/fault_overhead.py --arch=small --seq_len=1024 --batch=8   # a GPU

Prints the median step time with the guard (isfinite over the loss and every gradient,
the optimizer update under lax.cond) and without it (step.make_train_step's
guard_nonfinite=False), interleaved so that both see the same machine load; then the time
of checkpoint.fingerprint over the whole train state (params and optimizer moments) and
its throughput. Batches are random tokens: speed does not depend on the data.
"""

from __future__ import annotations

import statistics
import time

import jax
import numpy as np
from absl import flags

from gated_attention.cli import flags as cli_flags
from gated_attention.config import run_config
from gated_attention.parallel import sharding
from gated_attention.training import checkpoint
from gated_attention.training import step as step_lib


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("arch", "tiny", "The architecture.", flag_values=flag_values)
    flags.DEFINE_string("variant", "g1_sdpa_elementwise", "The attention variant.",
                        flag_values=flag_values)
    flags.DEFINE_integer("seq_len", 256, "Tokens per row.", flag_values=flag_values)
    flags.DEFINE_integer("batch", 8, "Rows per step.", flag_values=flag_values)
    flags.DEFINE_integer("steps", 20, "Timed steps per variant.", flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/fault_overhead.py", __doc__).parse(
        define_flags(flags.FlagValues()))

    config = run_config.base_config(args.arch, args.variant)
    config.data.seq_len, config.train.batch_size = args.seq_len, args.batch
    cfg = run_config.model_config(config)
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    graphdef, state, shardings = step_lib.create_train_state(config, mesh)
    steps = {name: step_lib.jit_train_step(
        step_lib.make_train_step(graphdef, config, guard_nonfinite=guarded), mesh, shardings)
        for name, guarded in (("guarded", True), ("unguarded", False))}
    rng = np.random.default_rng(0)
    shape = (args.batch, args.seq_len)
    batch = {"inputs": rng.integers(3, cfg.vocab_size, shape, dtype=np.int32),
             "targets": rng.integers(3, cfg.vocab_size, shape, dtype=np.int32),
             "mask": np.ones(shape, np.int32)}
    times: dict[str, list[float]] = {name: [] for name in steps}
    for step in steps.values():  # compile and warm up
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    for _ in range(args.steps):
        for name, step in steps.items():
            start = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready((state, metrics))
            times[name].append(time.perf_counter() - start)
    guarded, unguarded = (statistics.median(times[n]) for n in ("guarded", "unguarded"))
    print(f"{args.arch}/{args.variant}, batch {args.batch} x {args.seq_len}, "
          f"{jax.devices()[0].device_kind}")
    print(f"step, guarded:   {guarded * 1e3:9.2f} ms (median of {args.steps})")
    print(f"step, unguarded: {unguarded * 1e3:9.2f} ms")
    print(f"guard overhead:  {100 * (guarded / unguarded - 1):+9.1f} %")
    # The compiler's own count, which machine load does not blur.
    costs = {}
    for name, guarded_step in (("guarded", True), ("unguarded", False)):
        step_fn = step_lib.make_train_step(graphdef, config, guard_nonfinite=guarded_step)
        with jax.set_mesh(mesh), sharding.logical_rules(sharding.rules_from_config(config.mesh)):
            compiled = jax.jit(step_fn, donate_argnums=(0,)).lower(state, batch).compile()
        analysis = compiled.cost_analysis()
        analysis = analysis[0] if isinstance(analysis, list) else analysis
        costs[name] = (analysis.get("bytes accessed", float("nan")),
                       analysis.get("flops", float("nan")))
    (bytes_g, flops_g), (bytes_u, flops_u) = costs["guarded"], costs["unguarded"]
    print(f"bytes accessed (compiler): guarded {bytes_g:.4g}, unguarded {bytes_u:.4g} "
          f"({100 * (bytes_g / bytes_u - 1):+.2f} %); flops {100 * (flops_g / flops_u - 1):+.2f} %")

    checkpoint.fingerprint(state)  # compile
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        checkpoint.fingerprint(state)
        runs.append(time.perf_counter() - start)
    size = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state))
    seconds = statistics.median(runs)
    print(f"fingerprint of the train state ({size / 2**20:.1f} MiB): {seconds * 1e3:.2f} ms "
          f"({size / seconds / 2**30:.2f} GiB/s)")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
