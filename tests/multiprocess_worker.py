"""Sharded training of a tiny model with step.py's step, runnable as one of several processes.

    python tests/multiprocess_worker.py --process_id=0 --num_processes=2 --port=12345 \
        --local_devices=4 --mesh=fsdp=2,tensor=2,dcn_data=2 --steps=3

prints one JSON line {"process": i, "losses": [...]}. Each process builds only its own rows of
every global batch and assembles global arrays with distributed.global_batch, as on a pod.
The tests import the same helpers to train in-process on one or many devices.

    python tests/multiprocess_worker.py ... --config_json=run.json --workdir=DIR

then also runs the whole `loop.run` (its data pipeline, metrics and checkpoints) in DIR, on
the config's own mesh (one process start serves both checks).
"""

from __future__ import annotations

import json
import os
import sys
import types
import zlib
from collections.abc import Callable
from pathlib import Path

from absl import flags


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The worker's flags, on `flag_values` (importing the module, as the tests do, defines
    none)."""
    flags.DEFINE_integer("process_id", 0, "This process's index.", flag_values=flag_values)
    flags.DEFINE_integer("num_processes", 1, "Processes of the job.", flag_values=flag_values)
    flags.DEFINE_integer("port", 0, "The coordinator's port on localhost.",
                         flag_values=flag_values)
    flags.DEFINE_integer("local_devices", 4, "CPU devices of this process.",
                         flag_values=flag_values)
    flags.DEFINE_string("mesh", "data=-1", "Mesh axes, e.g. fsdp=2,tensor=2,dcn_data=2.",
                        flag_values=flag_values)
    flags.DEFINE_integer("steps", 3, "Train steps.", flag_values=flag_values)
    flags.DEFINE_string("config_json", "", "A config saved as JSON (loop.run).",
                        flag_values=flag_values)
    flags.DEFINE_string("workdir", "", "loop.run's workdir.", flag_values=flag_values)
    return flag_values


if __name__ == "__main__":  # devices and platform must be fixed before jax is imported
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from gated_attention.cli import flags as cli_flags
    from gated_attention.ops import cpu_compile

    ARGS = cli_flags.Command("tests/multiprocess_worker.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    # cheap compiles, as the test process has them (tests/conftest.py)
    os.environ["XLA_FLAGS"] = cpu_compile.xla_flags(host_devices=ARGS.local_devices)
    os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402

from gated_attention.config import run_config  # noqa: E402
from gated_attention.ops import cpu_compile  # noqa: E402
from gated_attention.parallel import distributed, sharding  # noqa: E402
from gated_attention.training import checkpoint, loop  # noqa: E402
from gated_attention.training import step as step_lib  # noqa: E402

GLOBAL_BATCH, SEQ_LEN, VOCAB = 8, 16, 256
# Tests compile many small programs on a shared CPU (gated_attention/ops/cpu_compile.py).
FAST_COMPILE = cpu_compile.options()


def tiny_config(mesh: dict | None = None) -> ml_collections.ConfigDict:
    """One layer, 8 query heads (split by tensor=2, 4 or 8), 4 kv heads (kept whole at 8)."""
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(dict(num_layers=1, d_model=64, num_heads=8, num_kv_heads=4, head_dim=8,
                             mlp_dim=128, vocab_size=VOCAB, dtype="float32",
                             attention_impl="xla"))
    config.data.seq_len = SEQ_LEN
    config.train.update(dict(batch_size=GLOBAL_BATCH, steps=20))
    config.optimizer.update(dict(peak_lr=1e-2, warmup_steps=2))
    for axis, size in (mesh or {}).items():
        config.mesh[axis] = size
    return config


def synthetic_batch(step: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
    """Rows `rows` of a deterministic global batch for `step`: two packed documents per row."""
    tokens = np.random.default_rng(1000 + step).integers(0, VOCAB, (GLOBAL_BATCH, SEQ_LEN + 1))
    half = SEQ_LEN // 2
    segments = np.repeat(np.array([[1, 2]], np.int32), half, axis=1)
    positions = np.tile(np.arange(half, dtype=np.int32), 2)[None]
    batch = {"inputs": tokens[:, :-1].astype(np.int32), "targets": tokens[:, 1:].astype(np.int32),
             "mask": np.ones((GLOBAL_BATCH, SEQ_LEN), bool),
             "segment_ids": np.broadcast_to(segments, (GLOBAL_BATCH, SEQ_LEN)),
             "positions": np.broadcast_to(positions, (GLOBAL_BATCH, SEQ_LEN))}
    return {k: np.ascontiguousarray(v[rows]) for k, v in batch.items()}


def host_init(spec: step_lib.TrainStateSpec):
    """The sharded train state built from numpy on each host (no compile, same on every mesh).

    Norm scales are 1, other parameters normal(0, 0.02) seeded by their path, optimizer
    moments and the step 0: the initial state any mesh and any process count agree on.
    """
    targets = checkpoint.abstract_with_shardings(spec.abstract, spec.shardings)

    def make(path, target):
        name = jax.tree_util.keystr(path)
        if name.startswith("['params']"):
            rng = np.random.default_rng(zlib.crc32(name.encode()))
            value = (np.ones(target.shape) if "scale" in name
                     else 0.02 * rng.standard_normal(target.shape))
        else:
            value = np.zeros(target.shape)
        value = value.astype(target.dtype)
        return jax.make_array_from_callback(target.shape, target.sharding, lambda i: value[i])

    return jax.tree_util.tree_map_with_path(make, targets)


_STEPS: dict[tuple, Callable] = {}


def jit_step(config, spec: step_lib.TrainStateSpec, mesh) -> Callable:
    """step.make_train_step jitted as step.jit_train_step does (shardings, donation).

    Cached per mesh, so a test that trains on the same mesh twice compiles once.
    """
    key = (config.to_json_best_effort(sort_keys=True), tuple(mesh.shape.items()),
           tuple(d.id for d in mesh.devices.flat))
    if key in _STEPS:
        return _STEPS[key]
    rules = sharding.rules_from_config(config.mesh)
    jitted = jax.jit(step_lib.make_train_step(spec.graphdef, config),
                     in_shardings=(spec.shardings, sharding.batch_sharding(mesh, rules)),
                     out_shardings=(spec.shardings, None), donate_argnums=(0,),
                     compiler_options=FAST_COMPILE)

    def call(state, batch):
        with jax.set_mesh(mesh), sharding.logical_rules(rules):
            return jitted(state, batch)

    _STEPS[key] = call
    return call


def train_steps(config, steps: int, *, state=None, first_step: int = 0, devices=None):
    """Train `steps` steps on config.mesh; returns (losses, final state, spec, mesh).

    Also records in `train_steps.rows` the global batch rows this process loaded.
    """
    mesh = sharding.create_mesh(config.mesh, devices)
    spec = step_lib.train_state_spec(config, mesh)
    if state is None:
        state = host_init(spec)
    step_fn = jit_step(config, spec, mesh)
    batch_sh = sharding.batch_sharding(mesh, sharding.rules_from_config(config.mesh))
    rows = distributed.local_batch_rows(batch_sh, GLOBAL_BATCH)
    train_steps.rows = (rows.start, rows.stop)
    train_steps.shard = distributed.data_shard(batch_sh, GLOBAL_BATCH)
    losses = []
    for step in range(first_step, first_step + steps):
        batch = distributed.global_batch(synthetic_batch(step, rows), batch_sh, GLOBAL_BATCH)
        state, metrics = step_fn(state, batch)
        losses.append(float(jax.device_get(metrics["loss"])))
    return losses, state, spec, mesh


def parse_mesh(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (part.split("=") for part in text.split(",") if part)}


def main(args: types.SimpleNamespace) -> None:
    if args.num_processes > 1:
        distributed.initialize(True, coordinator_address=f"localhost:{args.port}",
                               num_processes=args.num_processes, process_id=args.process_id)
    losses, _, _, mesh = train_steps(tiny_config(parse_mesh(args.mesh)), args.steps)
    result = {"process": jax.process_index(), "processes": jax.process_count(),
              "devices": jax.device_count(), "mesh": dict(mesh.shape),
              "rows": train_steps.rows, "shard": train_steps.shard, "losses": losses}
    if args.workdir:
        config = ml_collections.ConfigDict(json.loads(Path(args.config_json).read_text()))
        result["summary"] = loop.run(config, args.workdir, progress=False)
    print(json.dumps(result), flush=True)
    if args.num_processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main(ARGS)
