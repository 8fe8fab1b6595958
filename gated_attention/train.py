"""The training loop: data -> jitted step -> metrics -> evals -> checkpoints.

The hot step is one `jax.jit` over pure pytrees: the model is split once into a graphdef and
an nnx.State of its Params (float32), and `make_train_step` merges them inside the traced
function (nnx.jit would walk the object graph in Python on every call). Parameters,
optimizer state and batches are placed by gated_attention.sharding from their logical axis
names; the state is donated, so it is updated in place.

    graphdef, state, shardings = create_train_state(config, mesh)
    step = jit_train_step(make_train_step(graphdef, config), mesh, shardings)
    state, metrics = step(state, batch)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gated_attention import checkpoint as checkpoint_lib
from gated_attention import config_lib, distributed, losses, optim, paths, sharding
from gated_attention import metrics_writer as metrics_lib
from gated_attention import workdir as workdir_lib
from gated_attention.model import Transformer

State = dict[str, Any]
MOE_LOSSES = (("moe_load_balance_loss", "moe_aux_weight"), ("moe_z_loss", "moe_z_loss_weight"))


@dataclasses.dataclass
class TrainStateSpec:
    graphdef: nnx.GraphDef
    abstract: State           # ShapeDtypeStructs of {"params", "opt_state", "step"}
    shardings: State          # NamedShardings (a prefix tree of the state)
    init: Callable[[], State]  # jitted: builds the sharded state on the devices


def _rules(config: Any) -> sharding.Rules:
    return sharding.rules_from_config(config.get("mesh"))


def train_state_spec(config: Any, mesh: Mesh,
                     tx: optax.GradientTransformation | None = None) -> TrainStateSpec:
    """Shapes and shardings of the train state, and a jitted initialiser (no memory used)."""
    cfg = config_lib.model_config(config)
    tx = tx or optim.make_optimizer(config.optimizer, config.train.steps)

    def init() -> State:
        model = Transformer(cfg, rngs=nnx.Rngs(params=config.seed))
        _, params, rest = nnx.split(model, nnx.Param, ...)
        if jax.tree.leaves(rest):
            raise ValueError("the model holds non-Param state, which training does not carry")
        return {"params": params, "opt_state": tx.init(params),
                "step": jnp.zeros((), jnp.int32)}

    abstract_model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
    graphdef = nnx.split(abstract_model, nnx.Param, ...)[0]
    abstract = jax.eval_shape(init)
    shardings = sharding.state_shardings(abstract, mesh, _rules(config))
    return TrainStateSpec(graphdef, abstract, shardings,
                          jax.jit(init, out_shardings=shardings))


def create_train_state(config: Any, mesh: Mesh, tx: optax.GradientTransformation | None = None
                       ) -> tuple[nnx.GraphDef, State, State]:
    """(graphdef, state placed on the mesh, state shardings) for `config`."""
    spec = train_state_spec(config, mesh, tx)
    with jax.set_mesh(mesh):
        state = spec.init()
    return spec.graphdef, state, spec.shardings


def _loss_fn(graphdef: nnx.GraphDef, config: Any) -> Callable[..., Any]:
    train = config.train

    def loss_fn(params: nnx.State, batch: Mapping[str, jax.Array]):
        model = nnx.merge(graphdef, params)
        # Unpacked rows may leave out segment_ids / positions (then cuDNN attention applies).
        logits, aux = model(batch["inputs"], positions=batch.get("positions"),
                            segment_ids=batch.get("segment_ids"))
        loss, info = losses.cross_entropy(logits, batch["targets"], batch["mask"],
                                          z_loss=train.z_loss)
        for name, weight_field in MOE_LOSSES:
            if name in aux:
                loss = loss + train[weight_field] * aux[name]
                info[name] = aux[name]
        return loss, info

    return loss_fn


def make_train_step(graphdef: nnx.GraphDef, config: Any,
                    tx: optax.GradientTransformation | None = None
                    ) -> Callable[[State, Mapping[str, jax.Array]], tuple[State, dict]]:
    """A pure `step(state, batch) -> (state, metrics)`: one optimizer update.

    With train.grad_accum = k the batch is cut into k micro-batches (rows i, i+k, ...: each
    micro-batch stays spread over every data shard) whose gradients are averaged in a scan.
    """
    tx = tx or optim.make_optimizer(config.optimizer, config.train.steps)
    schedule = optim.learning_rate_schedule(config.optimizer, config.train.steps)
    grad_fn = jax.value_and_grad(_loss_fn(graphdef, config), has_aux=True)
    accum = config.train.grad_accum

    def gradients(params: nnx.State, batch: Mapping[str, jax.Array]):
        if accum == 1:
            return grad_fn(params, batch)
        micro = jax.tree.map(
            lambda x: x.reshape(x.shape[0] // accum, accum, *x.shape[1:]).swapaxes(0, 1), batch)
        first = jax.tree.map(lambda x: x[0], micro)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             jax.eval_shape(grad_fn, params, first))

        def body(total, one):
            return jax.tree.map(jnp.add, total, grad_fn(params, one)), None

        total, _ = jax.lax.scan(body, zeros, micro)
        (loss, info), grads = jax.tree.map(lambda x: x / accum, total)
        info["tokens"] = info["tokens"] * accum
        return (loss, info), grads

    def step(state: State, batch: Mapping[str, jax.Array]) -> tuple[State, dict]:
        params = state["params"]
        (loss, info), grads = gradients(params, batch)
        updates, opt_state = tx.update(grads, state["opt_state"], params)
        metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads),
                   "lr": schedule(state["step"]), **info}
        new_state = {"params": optax.apply_updates(params, updates), "opt_state": opt_state,
                     "step": state["step"] + 1}
        return new_state, metrics

    return step


def jit_train_step(step_fn: Callable, mesh: Mesh, shardings: State,
                   rules: sharding.Rules = sharding.LOGICAL_RULES) -> Callable:
    """jit with explicit shardings and the state donated; trace under the mesh and rules."""
    replicated = NamedSharding(mesh, PartitionSpec())
    jitted = jax.jit(step_fn, in_shardings=(shardings, sharding.batch_sharding(mesh, rules)),
                     out_shardings=(shardings, replicated), donate_argnums=(0,))

    def call(state: State, batch: Mapping[str, jax.Array]) -> tuple[State, dict]:
        with jax.set_mesh(mesh), sharding.logical_rules(rules):
            return jitted(state, batch)

    def lower(state: State, batch: Mapping[str, jax.Array]) -> jax.stages.Lowered:
        with jax.set_mesh(mesh), sharding.logical_rules(rules):  # same program (preflight)
            return jitted.lower(state, batch)

    call.lower = lower
    return call


def make_eval_step(graphdef: nnx.GraphDef) -> Callable[[nnx.State, Mapping[str, jax.Array]],
                                                       dict]:
    def eval_step(params: nnx.State, batch: Mapping[str, jax.Array]) -> dict:
        model = nnx.merge(graphdef, params)
        logits, _ = model(batch["inputs"], positions=batch["positions"],
                          segment_ids=batch["segment_ids"])
        _, info = losses.cross_entropy(logits, batch["targets"], batch["mask"])
        return {"nll_sum": info["nll"] * info["tokens"], "tokens": info["tokens"]}

    return eval_step


def evaluate(eval_fn: Callable, params: nnx.State, batches: list[dict[str, jax.Array]]
             ) -> dict[str, float]:
    """Held-out loss (mean over target tokens) and perplexity."""
    totals = [eval_fn(params, b) for b in batches]
    nll = float(sum(t["nll_sum"] for t in totals))
    tokens = float(sum(t["tokens"] for t in totals))
    loss = nll / max(tokens, 1.0)
    return {"loss": loss, "perplexity": math.exp(min(loss, 80.0)), "tokens": tokens}


def check_batch_layout(config: Any, mesh: Mesh, rules: sharding.Rules) -> None:
    """The micro-batch must split evenly over the mesh axes that shard the batch."""
    spec = sharding.logical_to_spec(("batch",), rules)
    shards = sharding.shard_factor(spec, dict(mesh.shape))
    micro = config.train.batch_size // config.train.grad_accum
    if micro % shards:
        raise config_lib.ConfigError(
            f"train.batch_size / train.grad_accum = {micro} sequences must be divisible by the "
            f"{shards} batch shards of the mesh {dict(mesh.shape)}; change train.batch_size, "
            "train.grad_accum or config.mesh")


def _replay_spikes(detector: metrics_lib.SpikeDetector, path: os.PathLike[str], upto: int) -> None:
    for record in metrics_lib.read_jsonl(path):
        if record.get("kind") == "train" and record["step"] <= upto:
            detector.update(record["step"], record["loss"])


def run(config: Any, workdir: str | os.PathLike[str], *, overwrite: bool = False,
        progress: bool = True, stop_after: int | None = None,
        devices: list[Any] | None = None) -> dict[str, Any]:
    """Train (or resume) the run in `workdir`; returns the last train and eval metrics.

    stop_after: leave the loop after that many steps, as if killed (tests use it).
    devices: the devices of the mesh (default: all).
    """
    from gated_attention import data as data_lib

    cfg = config_lib.validate_run_config(config)
    primary = jax.process_index() == 0
    workdir = paths.resolve(workdir)  # local, or a bucket (gs://...)
    workdir_lib.prepare(workdir, config, overwrite=overwrite, is_primary=primary,
                        barrier=distributed.barrier)
    mesh = sharding.create_mesh(config.mesh, devices)
    rules = _rules(config)
    check_batch_layout(config, mesh, rules)
    train_cfg = config.train
    data_sharding = sharding.batch_sharding(mesh, rules)
    # This host reads the rows of the global batch its devices hold; hosts holding the same
    # rows (the batch replicated over them, e.g. tensor parallelism across hosts) read the
    # same examples.
    shard_index, shard_count = distributed.data_shard(data_sharding, train_cfg.batch_size)

    inputs = data_lib.build_inputs(config, workdir, process_index=shard_index,
                                   process_count=shard_count)
    tx = optim.make_optimizer(config.optimizer, train_cfg.steps)
    spec = train_state_spec(config, mesh, tx)
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=train_cfg.keep_checkpoints,
                                       async_save=train_cfg.async_checkpoint)
    start = ckpt.latest_step() or 0
    if start:
        target = checkpoint_lib.abstract_with_shardings(spec.abstract, spec.shardings)
        state = ckpt.restore(start, target, inputs.train)
        print(f"Resumed {workdir} from its checkpoint at step {start}.")
    else:
        with jax.set_mesh(mesh):
            state = spec.init()

    step_fn = jit_train_step(make_train_step(spec.graphdef, config, tx), mesh, spec.shardings,
                             rules)
    eval_jit = jax.jit(make_eval_step(spec.graphdef),
                       in_shardings=(spec.shardings["params"], data_sharding))
    eval_batches = [distributed.global_batch(b, data_sharding, train_cfg.batch_size)
                    for b in inputs.eval_batches]

    def eval_fn(params, batch):
        with jax.set_mesh(mesh), sharding.logical_rules(rules):
            return eval_jit(params, batch)

    writer = metrics_lib.MetricsWriter(workdir, enabled=primary, resume_step=start)
    spikes = metrics_lib.SpikeDetector(train_cfg.spike_factor, train_cfg.spike_ema,
                                       config.optimizer.warmup_steps)
    _replay_spikes(spikes, writer.path, start)
    tokens_per_step = train_cfg.batch_size * config.data.seq_len
    last: dict[str, Any] = {"step": start}
    last_eval: dict[str, Any] | None = None

    bar = None
    if progress and primary and start < train_cfg.steps:
        from tqdm.auto import tqdm

        bar = tqdm(total=train_cfg.steps, initial=start, unit="step", dynamic_ncols=True,
                   desc=f"{config.arch}/{cfg.variant.name}")
    pending: list[tuple[int, dict]] = []
    # Without a bar (pods: output goes to a log file), a plain line every log_every steps.
    from gated_attention import progress_log

    plain = progress_log.ProgressLine(config, mesh.devices.flat) if bar is None and primary \
        else None
    timer_start, timed_steps = None, 0
    end = train_cfg.steps if stop_after is None else min(train_cfg.steps, start + stop_after)
    for step in range(start, end):
        batch = distributed.global_batch(next(inputs.train), data_sharding,
                                         train_cfg.batch_size)
        state, metrics = step_fn(state, batch)
        done = step + 1
        pending.append((done, metrics))
        if timer_start is None:  # the first step compiles: time from its end
            jax.block_until_ready(metrics)
            timer_start = time.perf_counter()
        else:
            timed_steps += 1
        if done % train_cfg.log_every == 0 or done == train_cfg.steps:
            fetched = jax.device_get([m for _, m in pending])
            elapsed = time.perf_counter() - timer_start
            rate = tokens_per_step * timed_steps / elapsed if timed_steps else float("nan")
            for (s, _), m in zip(pending, fetched):
                record = {k: float(v) for k, v in m.items()}
                record["loss_spike"] = spikes.update(s, record["loss"])
                record["tokens_per_sec"] = rate
                writer.write(s, record)
                last = {"step": s, **record}
            pending = []
            if bar is not None:
                bar.set_postfix(loss=f"{last['loss']:.3f}", tok_s=f"{rate:,.0f}")
            elif plain is not None:
                per_step = elapsed / timed_steps if timed_steps else float("nan")
                print(plain.line(done, last["loss"], rate, per_step), flush=True)
        if bar is not None:
            bar.update(1)
        if train_cfg.eval_every and eval_batches and (
                done % train_cfg.eval_every == 0 or done == train_cfg.steps):
            last_eval = {"step": done, **evaluate(eval_fn, state["params"], eval_batches)}
            writer.write(done, {k: v for k, v in last_eval.items() if k != "step"}, kind="eval")
            if bar is not None:
                bar.write(f"step {done}: held-out loss {last_eval['loss']:.4f}, "
                          f"perplexity {last_eval['perplexity']:.2f}")
        if done == train_cfg.steps or (train_cfg.checkpoint_every
                                       and done % train_cfg.checkpoint_every == 0):
            ckpt.save(done, state, inputs.train)
            writer.flush()  # a bucket's metrics.jsonl is rewritten here, not at every step
    if bar is not None:
        bar.close()
    ckpt.close()
    writer.close()
    records = metrics_lib.read_jsonl(writer.path) if "loss" not in last or last_eval is None \
        else []
    if "loss" not in last:  # nothing trained now (the run was finished): report the log's end
        trains = [r for r in records if r.get("kind") == "train"]
        last = trains[-1] if trains else last
    if last_eval is None:
        evals = [r for r in records if r.get("kind") == "eval"]
        last_eval = evals[-1] if evals else None
    summary = {"workdir": str(workdir), "steps": train_cfg.steps, "train": last,
               "eval": last_eval}
    if primary and end == train_cfg.steps:
        paths.write_atomic(workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def load_params(workdir: str | os.PathLike[str], config: Any | None = None,
                step: int | None = None) -> tuple[Transformer, Any]:
    """The trained model of a run (on the default device), and its config."""
    import ml_collections

    workdir = paths.resolve(workdir)
    if config is None:
        config = ml_collections.ConfigDict(
            json.loads((workdir / workdir_lib.CONFIG_FILE).read_text()))
    mesh = sharding.create_mesh({"data": 1}, devices=jax.devices()[:1])
    spec = train_state_spec(config, mesh)
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.train.keep_checkpoints,
                                       async_save=False)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{workdir} holds no checkpoint")
    target = checkpoint_lib.abstract_with_shardings(spec.abstract, spec.shardings)
    state = ckpt.restore(step, target, None)
    ckpt.close()
    return nnx.merge(spec.graphdef, state["params"]), config
