"""The training run: data -> jitted step (step.py) -> metrics -> evals -> checkpoints.

`run` is four steps, each a function of the PreparedRun the first one returns: prepare (every
check, then claim the workdir), restore_or_init, train_loop, finish. The loop calls one hook
per concern after each step: telemetry, held-out eval, lm-eval harness, progress, checkpoint.

    summary = run(config, workdir)
    model, config = load_params(workdir)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import optax
from etils import epath
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from gated_attention import data as data_lib
from gated_attention.config import optimizer_config, run_config
from gated_attention.core import paths
from gated_attention.evaluation import hook as harness_hook
from gated_attention.model import accounting
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.transformer import Transformer
from gated_attention.parallel import distributed, sharding
from gated_attention.training import checkpoint as checkpoint_lib
from gated_attention.training import init_from, interrupts, optim, progress_log, run_record
from gated_attention.training import metrics_writer as metrics_lib
from gated_attention.training import step as step_lib
from gated_attention.training import telemetry as telemetry_lib
from gated_attention.training import watchdog as watchdog_lib
from gated_attention.training import workdir as workdir_lib
from gated_attention.training.step import FINITE_GROUPS, State, TrainStateSpec
from gated_attention.training.workdir_lock import WorkdirLock


class NonFiniteError(RuntimeError):
    """Training met a non-finite loss or gradient and train.on_nonfinite says to stop."""


# ----------------------------------------------------------------------------- prepare


@dataclasses.dataclass
class PreparedRun:
    config: ml_collections.ConfigDict
    workdir: epath.Path           # local, or in a bucket
    mode: str                     # "new", "resume" or "extend" (workdir.prepare)
    primary: bool
    mesh: Mesh
    rules: sharding.Rules
    data_sharding: NamedSharding
    inputs: data_lib.Inputs
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


def check_run(config: ml_collections.ConfigDict, devices: list[Any] | None = None
              ) -> tuple[ModelConfig, Mesh, sharding.Rules]:
    """Every check that needs neither data nor a compile: (ModelConfig, mesh, rules).

    The one place a run's config is validated; raises ConfigError naming the field.
    """
    cfg = run_config.validate_run_config(config)
    if config.train.get("init_from"):  # reads the source run: its parameters fit this model
        init_from.check_source(config, cfg)
    try:
        rules = step_lib.rules_of(config)
        mesh = sharding.create_mesh(config.mesh, devices)
    except ValueError as err:
        if isinstance(err, run_config.ConfigError):
            raise
        count = len(devices) if devices is not None else jax.device_count()
        raise run_config.ConfigError(f"config.mesh does not fit the {count} devices: "
                                     f"{_one_line(err)}") from None
    step_lib.check_batch_layout(config, mesh, rules)
    return cfg, mesh, rules


def _load_inputs(config: ml_collections.ConfigDict, target: str | os.PathLike[str],
                 shard_index: int, shard_count: int) -> data_lib.Inputs:
    """The run's data. The sources raise ConfigError (one line at the entry point) for a
    mistake in the data settings or files; any other exception is a bug and keeps its
    traceback."""
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


def prepare(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str], *,
            overwrite: bool = False, devices: list[Any] | None = None) -> PreparedRun:
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
    spec = step_lib.train_state_spec(config, mesh, tx)
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
            span = optimizer_config.schedule_span(run.config.optimizer, steps)
            fixed = " (optimizer.schedule_steps, unchanged)" if span != steps else ""
            log(f"train.steps grew to {steps}: continuing from step {step}, with the "
                f"learning-rate schedule of a {span}-step run{fixed} from here on.")
        return state, step
    run.inputs.train.set_state(start_position)
    if had_checkpoints:
        log(f"No usable checkpoint left in {run.workdir}: training again from step 0.")
    with jax.set_mesh(run.mesh):
        state = run.spec.init()
    return init_from.initial_state(run.config, state, run.spec), 0  # train.init_from, if set


# ----------------------------------------------------------------------------- the loop's hooks


class _PendingMetrics:
    """Step metrics still on the device. They are read together at log, checkpoint and stop
    points (one host sync for many steps), checked for non-finite steps, then written."""

    def __init__(self, run: PreparedRun, writer: metrics_lib.MetricsWriter, start: int):
        train_cfg = run.config.train
        self.writer, self.train_cfg = writer, train_cfg
        self.names = step_lib.parameter_names(run.spec.abstract["params"])
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


class _Progress:
    """A tqdm bar, or a plain line every train.log_every steps (pods: the output goes to a log
    file), or nothing (another host than the first, or progress=False).

    The bar is made after the first step (the compile), so its rate and ETA are the steps'.
    """

    def __init__(self, run: PreparedRun, start: int, enabled: bool):
        config = run.config
        self.steps = config.train.steps
        self.label = f"{config.arch}/{config.variant}"
        self.wants_bar = enabled and run.primary and start < self.steps
        self.bar: Any = None
        self.plain = (progress_log.ProgressLine(config, run.mesh.devices.flat)
                      if not self.wants_bar and run.primary else None)

    def report(self, done: int, metrics: _PendingMetrics, at_log: bool) -> None:
        """The last written step's loss and rate (after a metrics sync)."""
        loss, rate = metrics.last["loss"], metrics.last["tokens_per_sec"]
        if self.bar is not None:
            self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rate:,.0f}")
        elif self.plain is not None and at_log:
            print(self.plain.line(done, loss, rate, metrics.tokens_per_step / rate), flush=True)

    def advance(self, done: int) -> None:
        if self.bar is not None:
            self.bar.update(1)
        elif self.wants_bar:
            self.bar = progress_log.progress_bar(self.steps, done, self.label)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


class _Telemetry:
    """telemetry.py's statistics after every train.telemetry_every updates, with the weights
    the next step starts from, and of the final weights on the last step's batch (so the
    curves reach the run's end). Never at step 0: a run shorter than the interval never
    compiles it. The points wait on the device with the step metrics."""

    def __init__(self, run: PreparedRun, metrics: _PendingMetrics):
        self.every = run.config.train.get("telemetry_every", 0)
        self.steps = run.config.train.steps
        self.metrics = metrics  # its `telemetry` list is swapped for a new one at each write
        self.fn = (step_lib.jit_on_params_and_batch(
            telemetry_lib.make_telemetry_fn(run.spec.graphdef, run.config), run.mesh,
            run.spec.shardings["params"], run.rules) if self.every else None)

    def before_step(self, step: int, params: nnx.State, batch: Mapping[str, jax.Array]) -> None:
        if self.fn is not None and step and step % self.every == 0:
            self.metrics.telemetry.append((step, self.fn(params, batch)))

    def after_step(self, done: int, params: nnx.State, batch: Mapping[str, jax.Array]) -> None:
        if self.fn is not None and done == self.steps and done % self.every == 0:
            self.metrics.telemetry.append((done, self.fn(params, batch)))


class _HeldOutEval:
    """The held-out loss every train.eval_every steps and at the last one (due even when the
    loop stops early), written to the metrics and shown under the bar."""

    def __init__(self, run: PreparedRun, writer: metrics_lib.MetricsWriter,
                 progress: _Progress):
        train_cfg = run.config.train
        self.every, self.steps = train_cfg.eval_every, train_cfg.steps
        self.writer, self.progress = writer, progress
        self.fn = step_lib.jit_on_params_and_batch(
            step_lib.make_eval_step(run.spec.graphdef, train_cfg.grad_accum), run.mesh,
            run.spec.shardings["params"], run.rules)
        self.batches = [distributed.global_batch(b, run.data_sharding, train_cfg.batch_size)
                        for b in run.inputs.eval_batches]
        self.last: dict[str, Any] | None = None

    def __call__(self, done: int, params: nnx.State) -> None:
        if not (self.every and self.batches
                and (done % self.every == 0 or done == self.steps)):
            return
        self.last = {"step": done, **step_lib.evaluate(self.fn, params, self.batches)}
        self.writer.write(done, {k: v for k, v in self.last.items() if k != "step"},
                          kind="eval")
        self.progress.note(f"step {done}: held-out loss {self.last['loss']:.4f}, "
                           f"perplexity {self.last['perplexity']:.2f}")


class _Harness:
    """lm-eval's tasks every train.harness_every steps and at the last (evaluation/hook.py).
    The tasks are resolved here, before the first step, so a bad one fails at once."""

    def __init__(self, run: PreparedRun, start: int, writer: metrics_lib.MetricsWriter):
        self.train_cfg, self.writer = run.config.train, writer
        wanted = self.train_cfg.get("harness_every", 0) and start < self.train_cfg.steps
        self.harness = harness_hook.TrainingHarness(run) if wanted else None

    def __call__(self, done: int, params: nnx.State) -> None:
        if self.harness is not None and harness_hook.due(self.train_cfg, done):
            self.writer.write(done, self.harness(params), kind="harness")


def _sync_points(train_cfg: ml_collections.ConfigDict, done: int) -> tuple[bool, bool]:
    """(log, checkpoint) due after `done` steps: the last step is both."""
    last = done == train_cfg.steps
    at_log = done % train_cfg.log_every == 0 or last
    at_checkpoint = last or bool(train_cfg.checkpoint_every
                                 and done % train_cfg.checkpoint_every == 0)
    return at_log, at_checkpoint


def _save_checkpoint(run: PreparedRun, done: int, state: State,
                     writer: metrics_lib.MetricsWriter) -> None:
    """The state and the data position; the metrics written so far go out with it."""
    run.ckpt.save(done, state, run.inputs.train)
    writer.flush()  # a bucket's metrics.jsonl is rewritten here, not every step


# ----------------------------------------------------------------------------- the loop


@dataclasses.dataclass
class LoopResult:
    state: State
    step: int                          # the last step trained
    train: dict[str, Any]              # the last train record
    eval: dict[str, Any] | None        # the last held-out evaluation of this call
    stopped_by: str | None = None      # the signal that ended the loop early
    wall_seconds: float | None = None  # wall time of this call's loop (record.json)
    code: dict[str, Any] | None = None  # the code version when the loop started (record.json)


class _Loop:
    """The jitted step and the hooks of one train_loop call; `done` is the last step trained,
    kept up to date so that a failed loop still knows where it stopped."""

    def __init__(self, run: PreparedRun, start: int, progress: bool):
        self.run, self.train_cfg = run, run.config.train
        self.step_fn = step_lib.jit_train_step(
            step_lib.make_train_step(run.spec.graphdef, run.config, run.tx), run.mesh,
            run.spec.shardings, run.rules)
        self.progress = _Progress(run, start, progress)
        self.writer = metrics_lib.MetricsWriter(run.workdir, enabled=run.primary,
                                                resume_step=start)
        self.evaluation = _HeldOutEval(run, self.writer, self.progress)
        self.harness = _Harness(run, start, self.writer)
        self.metrics = _PendingMetrics(run, self.writer, start)
        self.telemetry = _Telemetry(run, self.metrics)
        self.done, self.stopped_by = start, None

    def train(self, state: State, end: int, stop: interrupts.StopRequest,
              watchdog: watchdog_lib.StepWatchdog) -> State:
        """Steps up to `end`, or to the step at which a signal asks to stop."""
        run, train_cfg = self.run, self.train_cfg
        for step in range(self.done, end):
            batch = distributed.global_batch(next(run.inputs.train), run.data_sharding,
                                             train_cfg.batch_size)
            self.telemetry.before_step(step, state["params"], batch)
            state, step_metrics = self.step_fn(state, batch)
            self.done = done = step + 1
            self.telemetry.after_step(done, state["params"], batch)
            self.metrics.add(done, step_metrics)
            at_log, at_checkpoint = _sync_points(train_cfg, done)
            stopping = stop.should_stop(done, sync_point=at_log or at_checkpoint)
            if at_log or at_checkpoint or stopping:
                self.metrics.write()  # pending records go out with every checkpoint
                self.progress.report(done, self.metrics, at_log)
            self.progress.advance(done)
            self.evaluation(done, state["params"])
            self.harness(done, state["params"])
            if at_checkpoint or stopping:
                _save_checkpoint(run, done, state, self.writer)
            if stopping:
                self.stopped_by = stop.signal_name
                break
            watchdog.arm(done)
        return state

    def close(self) -> None:
        self.progress.close()
        self.writer.close()


def train_loop(run: PreparedRun, state: State, start: int, *, progress: bool = True,
               stop_after: int | None = None, stop: interrupts.StopRequest | None = None,
               watchdog: watchdog_lib.StepWatchdog | None = None) -> LoopResult:
    """Train from `start` to train.steps: steps, metrics, evals, checkpoints, signals.

    stop_after: leave the loop after that many steps, as if killed (tests use it).
    stop: the signal catcher (default: one installed for the loop alone).
    watchdog: re-armed before every step (default: the run's, `watchdog.for_run`); left armed
    when the loop fails, so that the caller's cleanup cannot wait on a dead peer for ever.
    """
    train_cfg = run.config.train
    loop = _Loop(run, start, progress)
    end = train_cfg.steps if stop_after is None else min(train_cfg.steps, start + stop_after)
    code = run_record.code_version()  # now: the checkout may move on while the run trains
    loop_start = time.perf_counter()
    own_stop = stop is None
    stop = interrupts.StopRequest().install() if own_stop else stop
    # Several hosts: a step that hangs on a dead peer ends this process with its stack.
    watchdog = watchdog or watchdog_lib.for_run(train_cfg, jax.process_count())
    watchdog.arm(start, first=True)
    failed = True
    try:
        state = loop.train(state, end, stop, watchdog)
        failed = False
    finally:
        if failed:  # armed for what follows: the writer's close here, the checkpointer's
            watchdog.arm(loop.done, during="the failed run's cleanup")  # (waits on every peer)
        else:
            watchdog.disarm()
        if own_stop:
            stop.uninstall()
        loop.close()
        wall_seconds = time.perf_counter() - loop_start
        if run.primary and train_cfg.steps > start:  # every call with steps to train, even
            run_record.add_call(run.workdir, start_step=start,  # a failed one: the record
                                end_step=loop.done, wall_seconds=wall_seconds)  # sums them
    return LoopResult(state, loop.done, loop.metrics.last, loop.evaluation.last,
                      loop.stopped_by, wall_seconds, code)


# ----------------------------------------------------------------------------- finish


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


def run(config: ml_collections.ConfigDict, workdir: str | os.PathLike[str], *,
        overwrite: bool = False, progress: bool = True, stop_after: int | None = None,
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


def load_params(workdir: str | os.PathLike[str],
                config: ml_collections.ConfigDict | None = None, step: int | None = None
                ) -> tuple[Transformer, ml_collections.ConfigDict]:
    """The trained model of a run (on the default device), and its config (its config.json,
    in today's layout: run_config.saved_config)."""
    workdir = paths.resolve(workdir)
    if config is None:
        config = run_config.saved_config(
            json.loads((workdir / workdir_lib.CONFIG_FILE).read_text()))
    mesh = sharding.create_mesh({"data": 1}, devices=jax.devices()[:1])
    spec = step_lib.train_state_spec(config, mesh)
    ckpt = checkpoint_lib.Checkpointer(workdir, keep=config.train.keep_checkpoints,
                                       async_save=False)
    step = ckpt.latest_step() if step is None else step
    if step is None:
        raise FileNotFoundError(f"{workdir} holds no checkpoint")
    target = checkpoint_lib.abstract_with_shardings(spec.abstract, spec.shardings)
    state = ckpt.restore(step, target, None)
    ckpt.close()
    return nnx.merge(spec.graphdef, state["params"]), config
