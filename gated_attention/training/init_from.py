"""Continued training: start a new run from the parameters of another run's checkpoint.

`--config.train.init_from=WORKDIR` (and optionally `train.init_from_step`, 0 = latest) makes a
new run begin with that run's weights and everything else of its own: a fresh optimizer and
learning-rate schedule, step 0, its own data and sequence length, and any RoPE base or
scaling. This is how a model trained at 256 tokens continues at 1024 with RoPE base 1M, as
the paper's long-context recipe does (base 10k -> 1M, continued training at 32k).

Only parameters are read; the source run is never written. `check_source` checks
the source (a run with checkpoints whose parameters fit this model) before anything is
compiled or written. A run that already holds its own checkpoint resumes from that one, so a
killed continued run picks up where it stopped.
"""

from __future__ import annotations

import json
from typing import Any

import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from gated_attention.config import run_config
from gated_attention.core import paths
from gated_attention.core.checks import require
from gated_attention.model.model_config import ModelConfig
from gated_attention.model.transformer import abstract_model
from gated_attention.training import checkpoint as checkpoint_lib


def restore_params(source: str, step: int, abstract_params: Any, shardings: Any) -> Any:
    """The `params` subtree of the source checkpoint, placed with this run's shardings."""
    target = {"params": checkpoint_lib.abstract_with_shardings(abstract_params, shardings)}
    item = paths.resolve(source) / "checkpoints" / str(step) / "state"
    # A partial restore: the optimizer state and step in the checkpoint are not read.
    args = ocp.args.PyTreeRestore(item=target, partial_restore=True,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(target))
    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.restore(item, args=args)["params"]


def initial_state(config: Any, state: dict[str, Any],
                  spec: Any) -> dict[str, Any]:
    """`state` (freshly initialised) with the source run's parameters when train.init_from is set.

    The optimizer state stays fresh (AdamW moments at zero) and the step stays 0, so the new
    schedule starts from its warm-up.
    """
    source = config.train.get("init_from", "")
    if not source:
        return state
    step = config.train.get("init_from_step", 0) or init_from_steps(source)[-1]
    params = restore_params(source, step, spec.abstract["params"], spec.shardings["params"])
    print(f"Initialised the parameters from {source} (step {step}); fresh optimizer, step 0.")
    return {**state, "params": params}


def init_from_steps(source: str) -> list[int]:
    """The checkpoint steps of the run at `source` (train.init_from), oldest first."""
    directory = paths.resolve(source) / "checkpoints"
    if not directory.exists():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def check_source(config: Any, cfg: ModelConfig) -> None:
    """train.init_from must be a run workdir with checkpoints (train.init_from_step among them;
    0 = the latest) whose parameters have exactly this model's names and shapes: checked from
    both configs, abstractly, before anything is compiled or written."""
    source, step = str(config.train.init_from), int(config.train.get("init_from_step", 0))
    saved, steps = paths.resolve(source) / "config.json", init_from_steps(source)
    require(saved.exists() and bool(steps), f"train.init_from={source!r} is not a run workdir "
            "with checkpoints (e.g. a shorter run of this model, or one written by "
            "`python -m gated_attention.convert from_hf`)")
    require(not step or step in steps, f"train.init_from_step={step} is not among the "
            f"checkpoints of {source}: {steps}")
    theirs = run_config.model_config(ml_collections.ConfigDict(json.loads(saved.read_text())))

    def shapes(model_cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
        state = nnx.state(abstract_model(model_cfg), nnx.Param)
        return {".".join(map(str, path)): tuple(v.get_value().shape)
                for path, v in nnx.to_flat_state(state)}

    ours, source_shapes = shapes(cfg), shapes(theirs)
    for name in sorted(set(ours) | set(source_shapes)):
        require(ours.get(name) == source_shapes.get(name),
                f"train.init_from={source!r} has parameter {name} of shape "
                f"{source_shapes.get(name)}, this model needs {ours.get(name)}")
