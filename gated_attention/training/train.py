"""The training loop: data -> jitted step -> metrics -> evals -> checkpoints.

The hot step is one `jax.jit` over pure pytrees: the model is split once into a graphdef and
an nnx.State of its Params (float32), and `make_train_step` merges them inside the traced
function (nnx.jit would walk the object graph in Python on every call). Parameters,
optimizer state and batches are placed by gated_attention.parallel.sharding from their logical axis
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
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gated_attention.config import run_config
from gated_attention.core import paths
from gated_attention.model.transformer import Transformer
from gated_attention.parallel import distributed, sharding
from gated_attention.training import checkpoint as checkpoint_lib
from gated_attention.training import interrupts, losses, optim, progress_log
from gated_attention.training import metrics_writer as metrics_lib
from gated_attention.training import watchdog as watchdog_lib
from gated_attention.training import workdir as workdir_lib
from gated_attention.training.workdir_lock import WorkdirLock

State = dict[str, Any]
FINITE_GROUPS = "finite_groups"  # per-parameter gradient finiteness, read only after a bad step
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
    cfg = run_config.model_config(config)
    tx = tx or optim.make_optimizer(config.optimizer, config.train.steps)

    def init() -> State:
        model = Transformer(cfg, rngs=nnx.Rngs(params=config.seed))
        _, params, rest = nnx.split(model, nnx.Param, ...)
        if jax.tree.leaves(rest):
            raise ValueError("the model holds non-Param state, which training does not carry")
        if config.train.get("init_by_name", False):  # variants of one seed share weights
            from gated_attention.model import init_by_name

            params = init_by_name.redraw(params, config.seed)
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
        features = dict(positions=batch.get("positions"), segment_ids=batch.get("segment_ids"))
        stored = losses.stored_logits_dtype(train.get("logits_dtype", "float32"),
                                            model.cfg.compute_dtype)
        if train.get("loss_chunk_size", 0):  # the logits a tile at a time
            x, table, aux = model.features(batch["inputs"], **features)
            chunked = (losses.token_tiled_cross_entropy
                       if train.get("loss_tiles", "vocab") == "tokens"
                       else losses.chunked_cross_entropy)
            loss, info = chunked(x, table, batch["targets"], batch["mask"], train.z_loss,
                                 train.loss_chunk_size, stored)
        else:
            logits, aux = model(batch["inputs"], **features, logits_dtype=stored)
            loss, info = losses.cross_entropy(logits, batch["targets"], batch["mask"],
                                              z_loss=train.z_loss)
        for name, weight_field in MOE_LOSSES:
            if name in aux:
                loss = loss + train[weight_field] * aux[name]
                info[name] = aux[name]
        return loss, info

    return loss_fn


def make_train_step(graphdef: nnx.GraphDef, config: Any,
                    tx: optax.GradientTransformation | None = None, *,
                    guard_nonfinite: bool = True
                    ) -> Callable[[State, Mapping[str, jax.Array]], tuple[State, dict]]:
    """A pure `step(state, batch) -> (state, metrics)`: one optimizer update.

    A step whose loss or gradients are not all finite leaves params and optimizer state as
    they were (the step counter still advances); metrics["finite"] says so, and
    metrics["finite_groups"] holds one flag per parameter (in `parameter_names` order).
    guard_nonfinite=False applies every update unchecked (benchmarks/fault_overhead.py
    measures the guard's cost against it).

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
        micro = split_micro_batches(batch, accum)
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
        # Non-finite loss or gradients: the update is dropped here, on the device; the host
        # learns of it from `finite` when it next reads the metrics (no extra sync). A
        # gradient's sum of squares is non-finite iff the gradient is (or it overflows, a
        # norm above ~1e19: no step to apply either), and the norm needs those sums anyway.
        squares = [jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)]
        group_finite = jnp.isfinite(jnp.stack(squares))
        grad_norm = jnp.sqrt(sum(squares))
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)

        def update(params, opt_state):
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        new_params, opt_state = update(params, state["opt_state"])
        if guard_nonfinite:  # a select fused into the update's elementwise loops: no extra pass
            keep = lambda new, old: jnp.where(finite, new, old)  # noqa: E731
            new_params = jax.tree.map(keep, new_params, params)
            opt_state = jax.tree.map(keep, opt_state, state["opt_state"])
        metrics = {"loss": loss, "grad_norm": grad_norm,
                   "lr": schedule(state["step"]), **info,
                   "finite": finite, FINITE_GROUPS: group_finite}
        new_state = {"params": new_params, "opt_state": opt_state, "step": state["step"] + 1}
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


def split_micro_batches(batch: Mapping[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """[B, ...] -> [k, B/k, ...] with rows i, i+k, ... in micro-batch i (each stays spread
    over every data shard)."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1),
                        dict(batch))


def make_eval_step(graphdef: nnx.GraphDef, micro_batches: int = 1
                   ) -> Callable[[nnx.State, Mapping[str, jax.Array]], dict]:
    """Held-out nll sum and token count of a batch, in `micro_batches` sequential pieces (as
    the train step's grad_accum): a paper-size batch never needs its logits all at once."""

    def one(params: nnx.State, batch: Mapping[str, jax.Array]) -> dict:
        model = nnx.merge(graphdef, params)
        logits, _ = model(batch["inputs"], positions=batch["positions"],
                          segment_ids=batch["segment_ids"])
        _, info = losses.cross_entropy(logits, batch["targets"], batch["mask"])
        return {"nll_sum": info["nll"] * info["tokens"], "tokens": info["tokens"]}

    def eval_step(params: nnx.State, batch: Mapping[str, jax.Array]) -> dict:
        if micro_batches == 1:
            return one(params, batch)
        micro = split_micro_batches(batch, micro_batches)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                             jax.eval_shape(one, params, jax.tree.map(lambda x: x[0], micro)))

        def body(carry, piece):  # params ride in the carry: nnx modules (scanned layers)
            weights, total = carry  # must be built from the scan body's own tracers
            return (weights, jax.tree.map(jnp.add, total, one(weights, piece))), None

        return jax.lax.scan(body, (params, zeros), micro)[0][1]

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
    """The micro-batch (and the telemetry's rows) must split evenly over the mesh axes that
    shard the batch."""
    spec = sharding.logical_to_spec(("batch",), rules)
    shards = sharding.shard_factor(spec, dict(mesh.shape))
    micro = config.train.batch_size // config.train.grad_accum
    if micro % shards:
        raise run_config.ConfigError(
            f"train.batch_size / train.grad_accum = {micro} sequences must be divisible by the "
            f"{shards} batch shards of the mesh {dict(mesh.shape)}; change train.batch_size, "
            "train.grad_accum or config.mesh")
    if config.train.get("telemetry_every", 0):  # its rows split over the same shards
        from gated_attention.training.telemetry import telemetry_rows

        telemetry_rows(config, shards)


def parameter_names(params: Any) -> list[str]:
    """Dotted names of the parameter leaves ("layers.0.attention.q_proj.kernel"), leaf order."""

    def name(path: tuple[Any, ...]) -> str:
        parts = [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]
        return ".".join(parts).removesuffix(".value")

    return [name(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]


class NonFiniteError(RuntimeError):
    """Training met a non-finite loss or gradient and train.on_nonfinite says to stop."""


# ----------------------------------------------------------------------------- the run
# `run` is four steps: prepare (every check, then claim the workdir), restore_or_init,
# train_loop, finish. Each is a function of the PreparedRun the first one returns.


@dataclasses.dataclass
class PreparedRun:
    config: Any
    workdir: Any                  # epath.Path, local or in a bucket
    mode: str                     # "new", "resume" or "extend" (workdir.prepare)
    primary: bool
    mesh: Mesh
    rules: sharding.Rules
    data_sharding: NamedSharding
    inputs: Any                   # data.Inputs
    tx: optax.GradientTransformation
    spec: TrainStateSpec
    ckpt: checkpoint_lib.Checkpointer
    lock: WorkdirLock
    staging: tempfile.TemporaryDirectory | None = None

    def close(self) -> None:
        try:
            self.ckpt.close()
        finally:
            self.lock.release()
            if self.staging is not None:
                self.staging.cleanup()


def check_run(config: Any, devices: list[Any] | None = None
              ) -> tuple[Any, Mesh, sharding.Rules]:
    """Every check that needs neither data nor a compile: (ModelConfig, mesh, rules).

    The one place a run's config is validated; raises ConfigError naming the field.
    """
    cfg = run_config.validate_run_config(config)
    if config.train.get("init_from"):  # reads the source run: its parameters fit this model
        from gated_attention.training.init_from import check_source

        check_source(config, cfg)
    try:
        rules = _rules(config)
        mesh = sharding.create_mesh(config.mesh, devices)
    except ValueError as err:
        if isinstance(err, run_config.ConfigError):
            raise
        count = len(devices) if devices is not None else jax.device_count()
        raise run_config.ConfigError(f"config.mesh does not fit the {count} devices: "
                                     f"{_one_line(err)}") from None
    check_batch_layout(config, mesh, rules)
    return cfg, mesh, rules


def _load_inputs(config: Any, target: Any, shard_index: int, shard_count: int) -> Any:
    """The run's data. The sources raise ConfigError (one line at the entry point) for a
    mistake in the data settings or files; any other exception is a bug and keeps its
    traceback."""
    from gated_attention import data as data_lib

    inputs = data_lib.build_inputs(config, target, process_index=shard_index,
                                   process_count=shard_count)
    held_out = (inputs.summary or {}).get("held_out", {}).get("tokens")
    seq_len = config.data.seq_len
    if config.train.eval_batches and held_out is not None and held_out < seq_len + 1:
        raise run_config.ConfigError(
            f"data.seq_len={seq_len} is longer than the whole held-out split ({held_out} "
            "tokens): lower data.seq_len, raise data.eval_fraction, or set "
            "train.eval_batches=0")
    data_lib.check_epochs(config, inputs)  # before compiling: data.max_epochs
    return inputs


def _one_line(err: BaseException | str) -> str:
    text = str(err)
    if isinstance(err, KeyError) and err.args:
        text = str(err.args[0])
    return " ".join(text.split())


def prepare(config: Any, workdir: str | os.PathLike[str], *, overwrite: bool = False,
            devices: list[Any] | None = None) -> PreparedRun:
    """Check everything, then claim the workdir: nothing is written before every check passed.

    The data of a new run is built in a temporary folder first (a glob matching nothing or a
    held-out split too short fails there), then copied into the workdir once it is claimed.
    """
    _, mesh, rules = check_run(config, devices)
    primary = jax.process_index() == 0
    workdir = paths.resolve(workdir)  # local, or a bucket (gs://...)
    mode = workdir_lib.check(workdir, config, overwrite=overwrite)
    data_sharding = sharding.batch_sharding(mesh, rules)
    # This host reads the rows of the global batch its devices hold; hosts holding the same
    # rows (the batch replicated over them, e.g. tensor parallelism across hosts) read the
    # same examples.
    shard_index, shard_count = distributed.data_shard(data_sharding, config.train.batch_size)
    staging, inputs = None, None
    if mode == "new":
        staging = tempfile.TemporaryDirectory(prefix="gated_attention_data_")
        inputs = _load_inputs(config, staging.name, shard_index, shard_count)
    lock = WorkdirLock(workdir)
    try:
        mode = workdir_lib.prepare(workdir, config, overwrite=overwrite, is_primary=primary,
                                   barrier=distributed.barrier,
                                   lock=lock if primary else None)
        if inputs is None:  # a run of ours: its own tokenizer copy is the one to use
            inputs = _load_inputs(config, workdir, shard_index, shard_count)
        elif primary:
            for name in sorted(os.listdir(staging.name)):
                paths.write_atomic(workdir / name, (paths.resolve(staging.name) / name
                                                    ).read_bytes())
    except BaseException:
        lock.release()
        if staging is not None:
            staging.cleanup()
        raise
    tx = optim.make_optimizer(config.optimizer, config.train.steps)
    spec = train_state_spec(config, mesh, tx)
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.train.keep_checkpoints,
                                       async_save=config.train.async_checkpoint)
    return PreparedRun(config, workdir, mode, primary, mesh, rules, data_sharding, inputs, tx,
                       spec, ckpt, lock, staging)


def restore_or_init(run: PreparedRun, *, log: Callable[[str], None] = print
                    ) -> tuple[State, int]:
    """(state, step) to train from: the newest usable checkpoint of this run, else a new init.

    A damaged checkpoint is reported and moved aside by the checkpointer, which then falls
    back to the one before; with none left the run starts from step 0 (the data iterator is
    put back to its start, since a half-read checkpoint may have moved it).
    """
    steps = run.config.train.steps
    start_position = run.inputs.train.get_state()
    target = checkpoint_lib.abstract_with_shardings(run.spec.abstract, run.spec.shardings)
    had_checkpoints = bool(run.ckpt.all_steps())
    found = run.ckpt.restore_latest(target, run.inputs.train, log=log)
    if found is not None:
        step, state = found
        log(f"Resumed {run.workdir} from its checkpoint at step {step}.")
        if run.mode == "extend":
            log(f"train.steps grew to {steps}: continuing from step {step}, with the "
                f"learning-rate schedule of a {steps}-step run from here on.")
        return state, step
    run.inputs.train.set_state(start_position)
    if had_checkpoints:
        log(f"No usable checkpoint left in {run.workdir}: training again from step 0.")
    with jax.set_mesh(run.mesh):
        state = run.spec.init()
    from gated_attention.training.init_from import initial_state  # train.init_from, if set

    return initial_state(run.config, state, run.spec), 0


class _PendingMetrics:
    """Step metrics still on the device. They are read together at log, checkpoint and stop
    points (one host sync for many steps), checked for non-finite steps, then written."""

    def __init__(self, run: PreparedRun, writer: metrics_lib.MetricsWriter, start: int):
        train_cfg = run.config.train
        self.writer, self.train_cfg = writer, train_cfg
        self.names = parameter_names(run.spec.abstract["params"])
        self.tokens_per_step = train_cfg.batch_size * run.config.data.seq_len
        self.spikes = metrics_lib.SpikeDetector(train_cfg.spike_factor, train_cfg.spike_ema,
                                                run.config.optimizer.warmup_steps)
        self.skipped_in_row = 0
        for record in metrics_lib.read_jsonl(writer.path, torn_tail="drop"):
            if record.get("kind") == "train" and record["step"] <= start:
                self.spikes.update(record["step"], record["loss"])
                self.skipped_in_row = self.skipped_in_row + 1 if record.get("skipped") else 0
        self.pending: list[tuple[int, dict, jax.Array]] = []
        self.telemetry: list[tuple[int, dict]] = []  # telemetry.py points, still on device
        self.activation = run.config.attention.get("activation", "sigmoid")
        self.last: dict[str, Any] = {"step": start}
        self.timer_start: float | None = None
        self.timed_steps = 0

    def add(self, step: int, metrics: dict) -> None:
        groups = metrics.pop(FINITE_GROUPS)
        self.pending.append((step, metrics, groups))
        if self.timer_start is None:  # the first step compiles: time from its end
            jax.block_until_ready(metrics)
            self.timer_start = time.perf_counter()
        else:
            self.timed_steps += 1

    def rate(self) -> float:
        elapsed = time.perf_counter() - (self.timer_start or 0.0)
        return (self.tokens_per_step * self.timed_steps / elapsed if self.timed_steps
                else float("nan"))

    def write_telemetry(self) -> None:
        """Read and write the pending telemetry points (with the step metrics' sync)."""
        from gated_attention.training import telemetry as telemetry_lib

        points, self.telemetry = self.telemetry, []
        for step, values in zip([s for s, _ in points],
                                jax.device_get([v for _, v in points])):
            self.writer.write_telemetry(step, telemetry_lib.to_record(values, self.activation))

    def write(self) -> None:
        """Read and write every pending step; NonFiniteError when the run must stop."""
        self.write_telemetry()
        if not self.pending:
            return
        fetched = jax.device_get([m for _, m, _ in self.pending])
        rate = self.rate()
        pending, self.pending = self.pending, []
        for (step, _, groups), values in zip(pending, fetched):
            finite = bool(values.pop("finite"))
            record = {k: float(v) for k, v in values.items()}
            problem = None
            if finite:
                self.skipped_in_row = 0
            else:
                problem = self._describe(step, groups)
                record["skipped"] = 1
                self.skipped_in_row += 1
            record["loss_spike"] = self.spikes.update(step, record["loss"])
            record["tokens_per_sec"] = rate
            self.writer.write(step, record)
            self.last = {"step": step, **record}
            if problem is None:
                continue
            if self.train_cfg.on_nonfinite == "stop":
                raise NonFiniteError(f"{problem}; train.on_nonfinite='stop' ends the run (lower "
                                     "optimizer.peak_lr, or set train.on_nonfinite='skip')")
            if self.skipped_in_row >= self.train_cfg.max_skipped:
                raise NonFiniteError(f"{problem}; {self.skipped_in_row} steps in a row were "
                                     f"skipped (train.max_skipped={self.train_cfg.max_skipped})"
                                     ": the run stops (lower optimizer.peak_lr)")
            print(f"{problem}: update skipped ({self.skipped_in_row} in a row).",
                  file=sys.stderr)

    def _describe(self, step: int, groups: jax.Array) -> str:
        flags = jax.device_get(groups)  # read only now that the step is known to be bad
        bad = [name for name, ok in zip(self.names, flags) if not ok]
        where = f"first in the gradient of {bad[0]}" if bad else "in the loss"
        return f"step {step}: non-finite loss or gradients ({where})"


@dataclasses.dataclass
class LoopResult:
    state: State
    step: int                          # the last step trained
    train: dict[str, Any]              # the last train record
    eval: dict[str, Any] | None        # the last held-out evaluation of this call
    stopped_by: str | None = None      # the signal that ended the loop early
    wall_seconds: float | None = None  # wall time of this call's loop (record.json)
    code: dict[str, Any] | None = None  # the code version when the loop started (record.json)


def train_loop(run: PreparedRun, state: State, start: int, *, progress: bool = True,
               stop_after: int | None = None, stop: interrupts.StopRequest | None = None,
               watchdog: watchdog_lib.StepWatchdog | None = None) -> LoopResult:
    """Train from `start` to train.steps: steps, metrics, evals, checkpoints, signals.

    stop_after: leave the loop after that many steps, as if killed (tests use it).
    stop: the signal catcher (default: one installed for the loop alone).
    watchdog: re-armed before every step (default: the run's, `watchdog.for_run`); left armed
    when the loop fails, so that the caller's cleanup cannot wait on a dead peer for ever.
    """
    config, train_cfg = run.config, run.config.train
    step_fn = jit_train_step(make_train_step(run.spec.graphdef, config, run.tx), run.mesh,
                             run.spec.shardings, run.rules)
    eval_jit = jax.jit(make_eval_step(run.spec.graphdef, train_cfg.grad_accum),
                       in_shardings=(run.spec.shardings["params"], run.data_sharding))
    eval_batches = [distributed.global_batch(b, run.data_sharding, train_cfg.batch_size)
                    for b in run.inputs.eval_batches]

    def eval_fn(params, batch):
        with jax.set_mesh(run.mesh), sharding.logical_rules(run.rules):
            return eval_jit(params, batch)

    writer = metrics_lib.MetricsWriter(run.workdir, enabled=run.primary, resume_step=start)
    harness = None
    if train_cfg.get("harness_every", 0) and start < train_cfg.steps:
        from gated_attention.evaluation import hook as harness_hook

        harness = harness_hook.TrainingHarness(run)  # tasks resolved before the first step
    metrics = _PendingMetrics(run, writer, start)
    telemetry_every = train_cfg.get("telemetry_every", 0)
    telemetry_fn = _telemetry_fn(run) if telemetry_every else None
    last_eval: dict[str, Any] | None = None
    # The bar starts after the first step (the compile), so its rate and ETA are the steps'.
    wants_bar = progress and run.primary and start < train_cfg.steps
    bar = None
    # Without a bar (pods: output goes to a log file), a plain line every log_every steps.
    plain = (progress_log.ProgressLine(config, run.mesh.devices.flat)
             if not wants_bar and run.primary else None)
    end = train_cfg.steps if stop_after is None else min(train_cfg.steps, start + stop_after)
    done, stopped_by = start, None
    from gated_attention.training.run_record import code_version

    code = code_version()  # now: the checkout may move on while the run trains
    loop_start = time.perf_counter()
    own_stop = stop is None
    stop = interrupts.StopRequest().install() if own_stop else stop
    # Several hosts: a step that hangs on a dead peer ends this process with its stack.
    watchdog = watchdog or watchdog_lib.for_run(train_cfg, jax.process_count())
    watchdog.arm(start, first=True)
    failed = True
    try:
        for step in range(start, end):
            batch = distributed.global_batch(next(run.inputs.train), run.data_sharding,
                                             train_cfg.batch_size)
            if telemetry_fn is not None and step and step % telemetry_every == 0:
                # after every `telemetry_every` updates (not at step 0: a run shorter than
                # the interval never compiles it), with the weights this step starts from
                metrics.telemetry.append((step, telemetry_fn(state["params"], batch)))
            state, step_metrics = step_fn(state, batch)
            done = step + 1
            if telemetry_fn is not None and done == train_cfg.steps and (
                    done % telemetry_every == 0):  # the final weights too (no next step): on
                # the batch the last step trained on, so the curves reach the run's end
                metrics.telemetry.append((done, telemetry_fn(state["params"], batch)))
            metrics.add(done, step_metrics)
            at_log = done % train_cfg.log_every == 0 or done == train_cfg.steps
            at_checkpoint = done == train_cfg.steps or bool(
                train_cfg.checkpoint_every and done % train_cfg.checkpoint_every == 0)
            stopping = stop.should_stop(done, sync_point=at_log or at_checkpoint)
            if at_log or at_checkpoint or stopping:
                metrics.write()  # pending records go out with every checkpoint
                rate = metrics.last["tokens_per_sec"]
                if bar is not None:
                    bar.set_postfix(loss=f"{metrics.last['loss']:.3f}", tok_s=f"{rate:,.0f}")
                elif plain is not None and at_log:
                    print(plain.line(done, metrics.last["loss"], rate,
                                     metrics.tokens_per_step / rate), flush=True)
            if bar is not None:
                bar.update(1)
            elif wants_bar:
                bar = progress_log.progress_bar(train_cfg.steps, done,
                                                f"{config.arch}/{config.variant}")
            if train_cfg.eval_every and eval_batches and (  # due even when stopping
                    done % train_cfg.eval_every == 0 or done == train_cfg.steps):
                last_eval = {"step": done,
                             **evaluate(eval_fn, state["params"], eval_batches)}
                writer.write(done, {k: v for k, v in last_eval.items() if k != "step"},
                             kind="eval")
                if bar is not None:
                    bar.write(f"step {done}: held-out loss {last_eval['loss']:.4f}, "
                              f"perplexity {last_eval['perplexity']:.2f}")
            if harness is not None and harness_hook.due(train_cfg, done):
                writer.write(done, harness(state["params"]), kind="harness")
            if at_checkpoint or stopping:
                run.ckpt.save(done, state, run.inputs.train)
                writer.flush()  # a bucket's metrics.jsonl is rewritten here, not every step
            if stopping:
                stopped_by = stop.signal_name
                break
            watchdog.arm(done)
        failed = False
    finally:
        if failed:  # armed for what follows: the writer's close here, the checkpointer's
            watchdog.arm(done, during="the failed run's cleanup")  # (waits on every peer)
        else:
            watchdog.disarm()
        if own_stop:
            stop.uninstall()
        if bar is not None:
            bar.close()
        writer.close()
        wall_seconds = time.perf_counter() - loop_start
        if run.primary and train_cfg.steps > start:  # every call with steps to train, even
            from gated_attention.training import run_record  # a failed one: the record sums them

            run_record.add_call(run.workdir, start_step=start, end_step=done,
                                wall_seconds=wall_seconds)
    return LoopResult(state, done, metrics.last, last_eval, stopped_by, wall_seconds, code)


def _telemetry_fn(run: PreparedRun) -> Callable:
    """telemetry.py's statistics as one jitted call on (params, batch), under the mesh."""
    from gated_attention.training import telemetry as telemetry_lib

    jitted = jax.jit(telemetry_lib.make_telemetry_fn(run.spec.graphdef, run.config),
                     in_shardings=(run.spec.shardings["params"], run.data_sharding))

    def call(params: nnx.State, batch: Mapping[str, jax.Array]) -> dict:
        with jax.set_mesh(run.mesh), sharding.logical_rules(run.rules):
            return jitted(params, batch)

    return call


def finish(run: PreparedRun, result: LoopResult) -> dict[str, Any]:
    """The run's summary (also `summary.json` once train.steps are done)."""
    train_cfg = run.config.train
    last, last_eval = result.train, result.eval
    records = (metrics_lib.read_jsonl(run.workdir / "metrics.jsonl")
               if "loss" not in last or last_eval is None else [])
    if "loss" not in last:  # nothing trained now (the run was finished): report the log's end
        trains = [r for r in records if r.get("kind") == "train"]
        last = trains[-1] if trains else last
    if last_eval is None:
        evals = [r for r in records if r.get("kind") == "eval"]
        last_eval = evals[-1] if evals else None
    summary = {"workdir": str(run.workdir), "steps": train_cfg.steps, "train": last,
               "eval": last_eval}
    if run.primary and result.step == train_cfg.steps:
        paths.write_atomic(run.workdir / "summary.json", json.dumps(summary, indent=2) + "\n")
        trained_now = "loss" in result.train
        if trained_now or not (run.workdir / "record.json").exists():  # keep the one written
            write_record(run, result, last, last_eval)  # by the call that trained
    return summary


def write_record(run: PreparedRun, result: LoopResult, last: Mapping[str, Any],
                 last_eval: Mapping[str, Any] | None) -> None:
    """record.json (run_record.py): config, code version, hardware, tokens, FLOPs, metrics."""
    from gated_attention.model import accounting
    from gated_attention.training import run_record

    records = metrics_lib.read_jsonl(run.workdir / "metrics.jsonl", torn_tail="drop")
    telemetry = next((r for r in reversed(records) if r.get("kind") == "telemetry"), None)
    try:
        flops = accounting.train_flops_per_token(run_config.model_config(run.config),
                                                 run.config.data.seq_len)
    except Exception:  # noqa: BLE001 - a record without FLOPs beats no record
        flops = None
    record = run_record.build(run.config, mesh=run.mesh, steps=result.step, train=last,
                              eval_metrics=last_eval, telemetry=telemetry,
                              wall_seconds=result.wall_seconds, flops_per_token=flops,
                              code=result.code, calls=run_record.read_calls(run.workdir))
    harness = next((r for r in reversed(records) if r.get("kind") == "harness"), None)
    if harness is not None:  # train.harness_tasks' last scores (evaluation/hook.py)
        record["final"]["harness"] = harness
    paths.write_atomic(run.workdir / run_record.RECORD_FILE,
                       json.dumps(record, indent=2, default=str) + "\n")


def run(config: Any, workdir: str | os.PathLike[str], *, overwrite: bool = False,
        progress: bool = True, stop_after: int | None = None,
        devices: list[Any] | None = None) -> dict[str, Any]:
    """Train (or resume, or extend) the run in `workdir`; returns the last train and eval metrics.

    stop_after: leave the loop after that many steps, as if killed (tests use it).
    devices: the devices of the mesh (default: all).
    Raises ConfigError / WorkdirError before anything is written; NonFiniteError when the
    loss diverges (train.on_nonfinite); interrupts.Interrupted after SIGINT / SIGTERM, once
    the checkpoint of the step reached is saved.
    """
    prepared = prepare(config, workdir, overwrite=overwrite, devices=devices)
    # Several processes: one whose peer died fails in a collective, and the checkpointer's
    # close can then wait on that peer (an asynchronous save in flight commits at a barrier of
    # every process); the loop leaves the watchdog armed on failure, so the close is bounded
    # like a step.
    with watchdog_lib.for_run(config.train, jax.process_count()) as watchdog:
        try:
            with interrupts.StopRequest() as stop:  # a signal from here on stops after a step
                state, start = restore_or_init(prepared)
                result = train_loop(prepared, state, start, progress=progress,
                                    stop_after=stop_after, stop=stop, watchdog=watchdog)
        finally:
            prepared.close()
    if result.stopped_by is not None:
        raise interrupts.Interrupted(
            f"stopped by {result.stopped_by} at step {result.step}, after saving its "
            f"checkpoint in {prepared.workdir}; the same command resumes the run",
            result.stopped_by)
    return finish(prepared, result)


def load_params(workdir: str | os.PathLike[str], config: Any | None = None,
                step: int | None = None) -> tuple[Transformer, Any]:
    """The trained model of a run (on the default device), and its config (its config.json,
    in today's layout: run_config.saved_config)."""
    workdir = paths.resolve(workdir)
    if config is None:
        config = run_config.saved_config(
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
