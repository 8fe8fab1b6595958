"""The train and eval steps: pure functions of pytrees, jitted under the run's mesh.

The hot step is one `jax.jit` over pure pytrees: the model is split once into a graphdef and
an nnx.State of its Params (float32), and `make_train_step` merges them inside the traced
function (nnx.jit would walk the object graph in Python on every call). Parameters,
optimizer state and batches are placed by gated_attention.parallel.sharding from their
logical axis names; the state is donated, so it is updated in place.

    graphdef, state, shardings = create_train_state(config, mesh)
    step = jit_train_step(make_train_step(graphdef, config), mesh, shardings)
    state, metrics = step(state, batch)

The loop that drives these steps (data, metrics, evals, checkpoints) is loop.py.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gated_attention.config import run_config
from gated_attention.model import init_by_name
from gated_attention.model.transformer import Transformer
from gated_attention.parallel import sharding
from gated_attention.training import losses, optim, telemetry

State = dict[str, Any]
Batch = Mapping[str, jax.Array]
FINITE_GROUPS = "finite_groups"  # per-parameter gradient finiteness, read only after a bad step
MOE_LOSSES = (("moe_load_balance_loss", "moe_aux_weight"), ("moe_z_loss", "moe_z_loss_weight"))


@dataclasses.dataclass(frozen=True)
class MeshJitted:
    """A jitted function that is called and lowered under its mesh and logical rules.

    The model pins activations by their logical axis names (sharding.constrain), which
    resolve only under both: a call and a lowering outside them would trace another program.
    """

    jitted: Any  # the jax.jit of the function
    mesh: Mesh
    rules: sharding.Rules

    def __call__(self, *args: Any) -> Any:
        with jax.set_mesh(self.mesh), sharding.logical_rules(self.rules):
            return self.jitted(*args)

    def lower(self, *args: Any) -> jax.stages.Lowered:
        """The same program as a call traces (the pre-flight compiles it)."""
        with jax.set_mesh(self.mesh), sharding.logical_rules(self.rules):
            return self.jitted.lower(*args)


def jit_under_mesh(fn: Callable, mesh: Mesh, rules: sharding.Rules = sharding.LOGICAL_RULES,
                   **jit_options: Any) -> MeshJitted:
    """`jax.jit(fn, **jit_options)` traced, called and lowered under `mesh` and `rules`."""
    return MeshJitted(jax.jit(fn, **jit_options), mesh, rules)


@dataclasses.dataclass
class TrainStateSpec:
    graphdef: nnx.GraphDef
    abstract: State           # ShapeDtypeStructs of {"params", "opt_state", "step"}
    shardings: State          # NamedShardings (a prefix tree of the state)
    init: Callable[[], State]  # jitted: builds the sharded state on the devices


def rules_of(config: ml_collections.ConfigDict) -> sharding.Rules:
    """The logical-axis rules of the run (config.mesh's overrides of the defaults)."""
    return sharding.rules_from_config(config.get("mesh"))


def train_state_spec(config: ml_collections.ConfigDict, mesh: Mesh,
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
            params = init_by_name.redraw(params, config.seed)
        return {"params": params, "opt_state": tx.init(params),
                "step": jnp.zeros((), jnp.int32)}

    abstract_model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(params=0)))
    graphdef = nnx.split(abstract_model, nnx.Param, ...)[0]
    abstract = jax.eval_shape(init)
    shardings = sharding.state_shardings(abstract, mesh, rules_of(config))
    return TrainStateSpec(graphdef, abstract, shardings,
                          jax.jit(init, out_shardings=shardings))


def create_train_state(config: ml_collections.ConfigDict, mesh: Mesh,
                       tx: optax.GradientTransformation | None = None
                       ) -> tuple[nnx.GraphDef, State, State]:
    """(graphdef, state placed on the mesh, state shardings) for `config`."""
    spec = train_state_spec(config, mesh, tx)
    with jax.set_mesh(mesh):
        state = spec.init()
    return spec.graphdef, state, spec.shardings


def make_loss_fn(graphdef: nnx.GraphDef, config: ml_collections.ConfigDict
                 ) -> Callable[[nnx.State, Batch], tuple[jax.Array, dict]]:
    """`loss_fn(params, batch) -> (loss, info)`: cross-entropy (whole, or a tile at a time)
    plus z-loss and the weighted MoE losses; info holds the parts for the metrics."""
    train = config.train

    def loss_fn(params: nnx.State, batch: Batch) -> tuple[jax.Array, dict]:
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


def make_train_step(graphdef: nnx.GraphDef, config: ml_collections.ConfigDict,
                    tx: optax.GradientTransformation | None = None, *,
                    guard_nonfinite: bool = True
                    ) -> Callable[[State, Batch], tuple[State, dict]]:
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
    grad_fn = jax.value_and_grad(make_loss_fn(graphdef, config), has_aux=True)
    accum = config.train.grad_accum

    def gradients(params: nnx.State, batch: Batch):
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

    def step(state: State, batch: Batch) -> tuple[State, dict]:
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

        updates, opt_state = tx.update(grads, state["opt_state"], params)
        new_params = optax.apply_updates(params, updates)
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
                   rules: sharding.Rules = sharding.LOGICAL_RULES) -> MeshJitted:
    """The train step jitted with explicit shardings and the state donated."""
    replicated = NamedSharding(mesh, PartitionSpec())
    return jit_under_mesh(step_fn, mesh, rules,
                          in_shardings=(shardings, sharding.batch_sharding(mesh, rules)),
                          out_shardings=(shardings, replicated), donate_argnums=(0,))


def jit_on_params_and_batch(fn: Callable[[nnx.State, Batch], Any], mesh: Mesh,
                            param_shardings: State, rules: sharding.Rules) -> MeshJitted:
    """`fn(params, batch)` jitted as the run places both: the eval step and the telemetry
    (the parameters as the train state holds them, the batch split as the train step's)."""
    return jit_under_mesh(fn, mesh, rules, in_shardings=(
        param_shardings, sharding.batch_sharding(mesh, rules)))


def split_micro_batches(batch: Batch, k: int) -> dict[str, jax.Array]:
    """[B, ...] -> [k, B/k, ...] with rows i, i+k, ... in micro-batch i (each stays spread
    over every data shard)."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1),
                        dict(batch))


def make_eval_step(graphdef: nnx.GraphDef, micro_batches: int = 1
                   ) -> Callable[[nnx.State, Batch], dict]:
    """Held-out nll sum and token count of a batch, in `micro_batches` sequential pieces (as
    the train step's grad_accum): a paper-size batch never needs its logits all at once."""

    def one(params: nnx.State, batch: Batch) -> dict:
        model = nnx.merge(graphdef, params)
        logits, _ = model(batch["inputs"], positions=batch["positions"],
                          segment_ids=batch["segment_ids"])
        _, info = losses.cross_entropy(logits, batch["targets"], batch["mask"])
        return {"nll_sum": info["nll"] * info["tokens"], "tokens": info["tokens"]}

    def eval_step(params: nnx.State, batch: Batch) -> dict:
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


def evaluate(eval_fn: Callable[[nnx.State, Batch], dict], params: nnx.State,
             batches: list[dict[str, jax.Array]]) -> dict[str, float]:
    """Held-out loss (mean over target tokens) and perplexity."""
    totals = [eval_fn(params, b) for b in batches]
    nll = float(sum(t["nll_sum"] for t in totals))
    tokens = float(sum(t["tokens"] for t in totals))
    loss = nll / max(tokens, 1.0)
    return {"loss": loss, "perplexity": math.exp(min(loss, 80.0)), "tokens": tokens}


def check_batch_layout(config: ml_collections.ConfigDict, mesh: Mesh,
                       rules: sharding.Rules) -> None:
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
        telemetry.telemetry_rows(config, shards)


def parameter_names(params: Any) -> list[str]:
    """Dotted names of the parameter leaves ("layers.0.attention.q_proj.kernel"), leaf order."""

    def name(path: tuple[Any, ...]) -> str:
        parts = [str(getattr(p, "key", getattr(p, "name", getattr(p, "idx", p)))) for p in path]
        return ".".join(parts).removesuffix(".value")

    return [name(path) for path, _ in jax.tree_util.tree_leaves_with_path(params)]
