"""What telemetry costs: compiled FLOPs and bytes for a TPU target, and CPU time per call.

    python -m experiments.telemetry_cost --config=configs/ablation.py:arch=small \
        --topology=v5e:2x2 [--set train.batch_size=8 ...] [--cpu_steps 20]
    python -m experiments.telemetry_cost \
        --config=configs/ablation.py:arch=dense_1p7b_28l,variant=g1_sdpa_elementwise \
        --topology=v5p:2x2x1 --extrapolate_layers --set mesh.fsdp=4 --set mesh.data=1 \
        --set train.batch_size=16 --set model.remat=full --set model.attention_impl=splash

Compiles the train step and the telemetry function (training/telemetry.py) of the same
config for a deviceless TPU topology (libtpu, as the pre-flight does) and prints each one's
FLOPs and bytes accessed per device and the telemetry's share of the step at
train.telemetry_every. XLA's cost analysis counts a loop body once, whatever its trip count,
so nothing costed here runs in a loop:

- the layers: by default the config is compiled whole with model.scan_layers=False. With
  --extrapolate_layers (for a model too large to compile unrolled) both programs are compiled
  with 1 and with 2 unrolled layers (U1, U2) and extrapolated to the config's depth L,
  full = U1 + (L - 1) x (U2 - U1), as benchmarks/compiled_step.py does for the train step
  (its `measure`, which also unrolls the chunked loss's vocabulary tiles, is used here);
- the first-token pass: traced as one block (telemetry.BLOCK = seq_len), so its query-block
  and key-block loops have one trip and vanish. It computes every (query block, key block)
  pair without skipping any, so its FLOPs are those of the blockwise pass the training loop
  runs (up to the running max's rescaling, b x heads x S per key block); its bytes are the
  compiler's estimate for the one-block program. --block N traces the training's blocks
  instead (N = telemetry.BLOCK = 256): the loops stay, are counted once, and their trip counts
  (read from the optimized HLO) are listed under "loops_counted_once", so that run's
  telemetry figures undercount.

A Pallas kernel's work (splash attention) is a custom call the cost analysis does not count,
in the train step as in the telemetry's forward. With --cpu_steps N it also times N train
steps on this CPU with and without telemetry at every step (a worst case), and the share at
the config's interval.
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import jax
from absl import flags

from gated_attention.cli import flags as cli_flags

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import compiled_step  # noqa: E402 - the U1/U2 extrapolation and loop counts


def _config(text: str, settings: dict[str, Any]) -> Any:
    from ml_collections import config_flags  # noqa: F401 - the same loader as main

    from experiments.run_grid import parse_settings
    from gated_attention.config import run_config

    path, _, arg = text.partition(":")
    module = {}
    exec(compile(open(path).read(), path, "exec"), module)  # noqa: S102 - a config file
    config = module["get_config"](arg or None)
    config.update_from_flattened_dict(parse_settings([f"{k}={v}" for k, v in settings.items()]))
    run_config.validate_run_config(config)
    return config


def _cost(compiled: Any) -> dict[str, float]:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return {"flops": float(cost.get("flops", 0.0)),
            "bytes": float(cost.get("bytes accessed", 0.0))}


@contextlib.contextmanager
def first_token_block(block: int) -> Iterator[None]:
    """Trace the telemetry's first-token pass with `block` queries x `block` keys per block."""
    from gated_attention.training import telemetry

    original = telemetry.BLOCK
    telemetry.BLOCK = block
    try:
        yield
    finally:
        telemetry.BLOCK = original


def compile_telemetry(config: Any, mesh: Any, block: int = 0) -> dict[str, Any]:
    """FLOPs and bytes per device of one telemetry call of `config` compiled for `mesh`'s TPU
    devices, with the while loops its optimized HLO keeps (trip counts other than 1); block 0:
    the first-token pass as one block."""
    from gated_attention.compile.target import abstract_batch, compiling_for
    from gated_attention.parallel import sharding
    from gated_attention.training import step as step_lib
    from gated_attention.training import telemetry

    rules = sharding.rules_from_config(config.get("mesh"))
    start = time.perf_counter()
    with compiling_for("tpu", device_kind=mesh.devices.flat[0].device_kind), \
            first_token_block(block or config.data.seq_len):
        spec = step_lib.train_state_spec(config, mesh)
        batch = abstract_batch(config, mesh, rules)
        fn = step_lib.jit_on_params_and_batch(telemetry.make_telemetry_fn(spec.graphdef, config),
                                              mesh, spec.shardings["params"], rules)
        compiled = fn.lower(spec.abstract["params"], batch).compile()
    return {**_cost(compiled), "compile_s": round(time.perf_counter() - start, 1),
            "loops_counted_once": [n for n in compiled_step.loops(compiled.as_text()) if n != 1]}


def compile_step(config: Any, mesh: Any) -> dict[str, Any]:
    """FLOPs and bytes per device of the train step compiled whole (unscanned, the chunked
    loss's tiles unrolled, as compiled_step costs them)."""
    from gated_attention.compile.target import compile_step as compile_target
    from gated_attention.training import losses

    with losses.unrolled_tiles():
        step = compile_target(compiled_step.unrolled(config, config.model.num_layers), mesh)
    return {**_cost(step.compiled), "compile_s": round(step.compile_seconds, 1),
            "loops_counted_once": [n for n in compiled_step.loops(step.hlo_text) if n != 1]}


def extrapolated_telemetry(config: Any, mesh: Any, block: int = 0) -> dict[str, Any]:
    """One telemetry call at the config's depth from unrolled 1- and 2-layer compiles:
    full = U1 + (L - 1) x (U2 - U1), as compiled_step extrapolates the train step."""
    layers = config.model.num_layers
    one = compile_telemetry(compiled_step.unrolled(config, 1), mesh, block)
    print(f"compiled telemetry u1: {one}", file=sys.stderr, flush=True)
    two = compile_telemetry(compiled_step.unrolled(config, 2), mesh, block)
    print(f"compiled telemetry u2: {two}", file=sys.stderr, flush=True)
    extrapolated = compiled_step.extrapolate(one, two, layers)
    out: dict[str, Any] = {"u1": one, "u2": two, **extrapolated}
    for key in ("flops", "bytes"):  # the whole call, and per layer
        out[key], out[f"{key}_per_layer"] = (extrapolated[key]["full"],
                                             extrapolated[key]["per_layer"])
    return out


def tpu_cost(config: Any, topology: str, extrapolate_layers: bool = False,
             block: int = 0) -> dict[str, Any]:
    """The train step's and one telemetry call's FLOPs and bytes per device for `topology`,
    and the telemetry's share of the steps at train.telemetry_every."""
    from gated_attention.compile.target import tpu_mesh

    config = copy.deepcopy(config)
    mesh = tpu_mesh(topology, config.mesh)
    out: dict[str, Any] = {"topology": topology, "extrapolate_layers": extrapolate_layers,
                           "first_token_block": block or config.data.seq_len}
    if extrapolate_layers:
        step = compiled_step.measure(config, mesh, cost_only=True)
        out["step"] = {"flops": step["flops"]["full"], "bytes": step["bytes"]["full"],
                       "layers": step["layers"], "loops_counted_once": step["loops_counted_once"],
                       "compile_s": [step["u1"]["compile_s"], step["u2"]["compile_s"]]}
        out["telemetry"] = extrapolated_telemetry(config, mesh, block)
    else:
        out["step"] = compile_step(config, mesh)
        out["telemetry"] = compile_telemetry(
            compiled_step.unrolled(config, config.model.num_layers), mesh, block)
    every = config.train.telemetry_every
    out["telemetry_every"] = every
    for key in ("flops", "bytes"):
        out[f"{key}_share_at_interval"] = (out["telemetry"][key]
                                           / (every * out["step"][key]) if every else 0.0)
    return out


def cpu_cost(config: Any, steps: int) -> dict[str, Any]:
    import numpy as np

    from gated_attention import data
    from gated_attention.parallel import sharding
    from gated_attention.training import step as step_lib
    from gated_attention.training import telemetry

    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    graphdef, state, shardings = step_lib.create_train_state(config, mesh)
    step = step_lib.jit_train_step(step_lib.make_train_step(graphdef, config), mesh, shardings)
    tele = jax.jit(telemetry.make_telemetry_fn(graphdef, config))
    inputs = data.build_inputs(config, None)
    batch = {k: jax.numpy.asarray(v) for k, v in next(inputs.train).items()}
    jax.block_until_ready(tele(state["params"], batch))  # compile both first
    state, m = step(state, batch)
    jax.block_until_ready(m)
    step_times, tele_times = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        jax.block_until_ready(tele(state["params"], batch))
        t1 = time.perf_counter()
        state, m = step(state, batch)
        jax.block_until_ready(m)
        t2 = time.perf_counter()
        tele_times.append(t1 - t0)
        step_times.append(t2 - t1)
    every = config.train.telemetry_every
    step_s, tele_s = statistics.median(step_times), statistics.median(tele_times)
    return {"steps": steps, "step_s_median": step_s, "telemetry_s_median": tele_s,
            "step_s_iqr": float(np.subtract(*np.percentile(step_times, [75, 25]))),
            "telemetry_every": every,
            "time_share_at_interval": tele_s / (every * step_s) if every else 0.0}


def _versions() -> dict[str, str]:
    out = {"jax": jax.__version__}
    try:
        out["libtpu"] = version("libtpu")
    except PackageNotFoundError:
        out["libtpu"] = "absent"
    return out


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The command's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_string("config", None, "Config file[:arg], as for main.",
                        flag_values=flag_values)
    flags.DEFINE_string("topology", "", "TPU topology, e.g. v5e:2x2, v5p:2x2x1.",
                        flag_values=flag_values)
    flags.DEFINE_multi_string("set", [], "KEY=VALUE: a config override (repeatable).",
                              flag_values=flag_values)
    flags.DEFINE_integer("cpu_steps", 0, "Train steps to time on this CPU, with and without "
                         "telemetry.", flag_values=flag_values)
    flags.DEFINE_bool("extrapolate_layers", False, "Compile 1 and 2 unrolled layers and "
                      "extrapolate to the config's depth (for models too large to compile "
                      "unrolled).", flag_values=flag_values)
    flags.DEFINE_integer("block", 0, "First-token pass block (0: one block of seq_len, no "
                         "loop).", flag_values=flag_values)
    flags.mark_flag_as_required("config", flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    args = cli_flags.Command("experiments.telemetry_cost", __doc__).parse(
        define_flags(flags.FlagValues()), argv)
    settings = dict(item.split("=", 1) for item in args.set)
    if args.block < 0:
        from gated_attention.core.errors import UserError

        raise UserError(f"--block={args.block}: must be 0 (one block of seq_len) or a "
                        "positive block size such as 256")
    result: dict[str, Any] = {
        "config": args.config, "settings": settings, **_versions(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")}
    if args.topology:
        result["tpu"] = tpu_cost(_config(args.config, settings), args.topology,
                                 args.extrapolate_layers, args.block)
    if args.cpu_steps:
        result["cpu"] = cpu_cost(_config(args.config, settings), args.cpu_steps)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
