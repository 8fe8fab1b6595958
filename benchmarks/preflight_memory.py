"""Pre-flight against measured: one GPU's memory for a train step, three ways.

    python benchmarks/preflight_memory.py [--small]

1. the GPU pre-flight, deviceless (a CPU-only subprocess compiles for this GPU's target
   config, gated_attention/compile/gpu_targets.py): what a user reads before renting the GPU;
2. the same step compiled on this GPU (XLA's memory_analysis with the real device);
3. measured: the allocator's peak bytes in use after running the step here.
On a machine without a GPU, (1) runs for an H200 and (2), (3) say "n/a". --small: the tiny
arch (a CPU rehearsal); otherwise the 1.7B-28L arch at 4 x 4096 in bfloat16, as train_step.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from absl import flags as absl_flags

from gated_attention.cli import flags as cli_flags

ROOT = Path(__file__).resolve().parents[1]
SMALL = ["arch=tiny", "--config.train.batch_size=8", "--config.model.num_layers=2"]
FULL = ["arch=dense_1p7b_28l", "--config.train.batch_size=4", "--config.data.seq_len=4096",
        "--config.model.dtype=bfloat16",
        "--config.model.remat=dots_with_no_batch_dims_saveable"]


def overrides(small: bool) -> tuple[str, list[str]]:
    arch, *flags = SMALL if small else FULL
    return (f"configs/ablation.py:{arch},variant=g1_sdpa_elementwise",
            [*flags, "--config.train.eval_every=0"])


def gpu_name() -> str | None:
    """The gpu_targets node name of this machine's GPU, or None without one."""
    import jax

    from gated_attention.compile import gpu_targets

    if jax.default_backend() != "gpu":
        return None
    kind = jax.devices()[0].device_kind.lower()
    for key in gpu_targets.GPUS:
        if key.split("-")[0] in kind:
            return f"{key}-1"
    return None


def preflight_total(config: str, flags: list[str], accelerator: str) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "gated_attention.preflight", f"--config={config}", *flags,
         f"--accelerator={accelerator}", "--steps=train", "--json"],
        capture_output=True, text=True, cwd=ROOT, env=env, timeout=1200)
    if result.returncode not in (0, 1):  # 1: does not fit, still a report
        raise RuntimeError(result.stderr.strip().splitlines()[-1])
    return json.loads(result.stdout)["steps"]["train"]


def measured_on_this_gpu(config_spec: str, flags: list[str]) -> tuple[int, int]:
    """(compiled total, peak bytes in use after two steps) on this machine's first GPU."""
    import jax
    import numpy as np
    from ml_collections import config_flags

    from gated_attention.compile import target as target_compile
    from gated_attention.config import run_config
    from gated_attention.parallel import distributed, sharding
    from gated_attention.training import step as step_lib

    parsed = absl_flags.FlagValues()  # main's loader and overrides, on flags of our own
    config_flags.DEFINE_config_file("config", None, "", flag_values=parsed)
    parsed([sys.argv[0], f"--config={config_spec}", *flags])
    config = parsed.config
    config.mesh.data = 1
    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    compiled = target_compile.compile_step(config, mesh, "train", platform="gpu")
    graphdef, state, shardings = step_lib.create_train_state(config, mesh)
    step = step_lib.jit_train_step(step_lib.make_train_step(graphdef, config), mesh, shardings)
    cfg = run_config.model_config(config)
    shape = (config.train.batch_size, config.data.seq_len)
    rng = np.random.default_rng(0)
    batch = {"inputs": rng.integers(3, cfg.vocab_size, shape, dtype=np.int32),
             "targets": rng.integers(3, cfg.vocab_size, shape, dtype=np.int32),
             "mask": np.ones(shape, np.int32), "segment_ids": np.ones(shape, np.int32),
             "positions": np.broadcast_to(np.arange(shape[1], dtype=np.int32), shape)}
    batch = distributed.global_batch(batch, sharding.batch_sharding(mesh), shape[0])
    for _ in range(2):
        state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    stats = jax.devices()[0].memory_stats() or {}
    return compiled.memory["total"], int(stats.get("peak_bytes_in_use", 0))


def define_flags(flag_values: absl_flags.FlagValues) -> absl_flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    absl_flags.DEFINE_bool("small", False, "The tiny arch (CPU rehearsal).",
                           flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/preflight_memory.py", __doc__).parse(
        define_flags(absl_flags.FlagValues()))
    config, flags = overrides(args.small)
    here = gpu_name()
    accelerator = here or "h200-1"
    pre = preflight_total(config, flags, accelerator)
    gib = 2**30
    print(f"# train step memory per GPU, {config} {' '.join(flags)}")
    print("| accelerator | pre-flight total (deviceless) | compiled here | measured peak "
          "in use | measured / pre-flight |\n|---|---|---|---|---|")
    if here is None:
        print(f"| {accelerator} | {pre['memory']['total'] / gib:.3f} GiB | n/a (no GPU) | "
              "n/a (no GPU) | n/a |")
        return
    compiled, peak = measured_on_this_gpu(config, flags)
    ratio = peak / pre["memory"]["total"] if pre["memory"]["total"] else float("nan")
    print(f"| {accelerator} | {pre['memory']['total'] / gib:.3f} GiB | {compiled / gib:.3f} GiB "
          f"| {peak / gib:.3f} GiB | {ratio:.3f} |")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
