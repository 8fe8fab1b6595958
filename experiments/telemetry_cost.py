"""What telemetry costs: compiled FLOPs and bytes for a TPU target, and CPU time per call.

    python -m experiments.telemetry_cost --config=configs/ablation.py:arch=small \
        --topology=v5e:2x2 [--set train.batch_size=8 ...] [--cpu_steps 20]

Compiles the train step and the telemetry function (gated_attention/telemetry.py) of the same
config for a deviceless TPU topology (libtpu, as the pre-flight does) and prints each one's
FLOPs and bytes accessed per device and the telemetry's share of the step at
train.telemetry_every. XLA's cost analysis counts a loop body once, so both are compiled with
model.scan_layers=False and the first-token pass as one block (no loop): every layer and every
key block is counted. With --cpu_steps N it also times N train steps on this CPU with and
without telemetry at every step (a worst case), and the share at the config's interval.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax


def _config(text: str, settings: dict[str, Any]) -> Any:
    from ml_collections import config_flags  # noqa: F401 - the same loader as main

    from experiments.run_grid import parse_settings
    from gated_attention import config_lib

    path, _, arg = text.partition(":")
    module = {}
    exec(compile(open(path).read(), path, "exec"), module)  # noqa: S102 - a config file
    config = module["get_config"](arg or None)
    config.update_from_flattened_dict(parse_settings([f"{k}={v}" for k, v in settings.items()]))
    config_lib.validate_run_config(config)
    return config


def _cost(compiled: Any) -> dict[str, float]:
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    return {"flops": float(cost.get("flops", 0.0)),
            "bytes": float(cost.get("bytes accessed", 0.0))}


def tpu_cost(config: Any, topology: str) -> dict[str, Any]:
    from gated_attention import sharding, telemetry, train
    from gated_attention.target_compile import abstract_batch, compiling_for, tpu_mesh

    config.model.scan_layers = False
    mesh = tpu_mesh(topology, config.mesh)
    rules = sharding.rules_from_config(config.get("mesh"))
    telemetry.BLOCK = config.data.seq_len  # one block: no loop for the cost analysis to skip
    with compiling_for("tpu"):
        spec = train.train_state_spec(config, mesh)
        batch = abstract_batch(config, mesh, rules)
        step = train.jit_train_step(train.make_train_step(spec.graphdef, config), mesh,
                                    spec.shardings, rules).lower(spec.abstract, batch).compile()
        fn = jax.jit(telemetry.make_telemetry_fn(spec.graphdef, config),
                     in_shardings=(spec.shardings["params"], sharding.batch_sharding(mesh, rules)))
        with jax.set_mesh(mesh), sharding.logical_rules(rules):
            tele = fn.lower(spec.abstract["params"], batch).compile()
    every = config.train.telemetry_every
    out = {"topology": topology, "step": _cost(step), "telemetry": _cost(tele),
           "telemetry_every": every}
    for key in ("flops", "bytes"):
        out[f"{key}_share_at_interval"] = (out["telemetry"][key]
                                           / (every * out["step"][key]) if every else 0.0)
    return out


def cpu_cost(config: Any, steps: int) -> dict[str, Any]:
    import numpy as np

    from gated_attention import data, sharding, telemetry, train

    mesh = sharding.create_mesh(config.mesh, jax.devices()[:1])
    graphdef, state, shardings = train.create_train_state(config, mesh)
    step = train.jit_train_step(train.make_train_step(graphdef, config), mesh, shardings)
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, help="config file[:arg], as for main")
    parser.add_argument("--topology", default="", help="TPU topology, e.g. v5e:2x2")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--cpu_steps", type=int, default=0)
    args = parser.parse_args(argv)
    settings = dict(item.split("=", 1) for item in args.set)
    result: dict[str, Any] = {"config": args.config, "settings": settings}
    if args.topology:
        result["tpu"] = tpu_cost(_config(args.config, settings), args.topology)
    if args.cpu_steps:
        result["cpu"] = cpu_cost(_config(args.config, settings), args.cpu_steps)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
