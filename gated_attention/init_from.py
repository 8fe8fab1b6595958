"""Continued training: start a new run from the parameters of another run's checkpoint.

`--config.train.init_from=WORKDIR` (and optionally `train.init_from_step`, 0 = latest) makes a
new run begin with that run's weights and everything else of its own: a fresh optimizer and
learning-rate schedule, step 0, its own data and sequence length, and any RoPE base or
scaling. This is how a model trained at 256 tokens continues at 1024 with RoPE base 1M, as
the paper's long-context recipe does (base 10k -> 1M, continued training at 32k).

Only parameters are read; the source run is never written. A run that already holds its own
checkpoint resumes from that one, so a killed continued run picks up where it stopped.
"""

from __future__ import annotations

import json
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp
from flax import nnx

from gated_attention import checkpoint as checkpoint_lib
from gated_attention import config_lib, paths
from gated_attention import workdir as workdir_lib
from gated_attention.model import abstract_model
from gated_attention.model_config import ModelConfig


def source_config(source: str) -> ml_collections.ConfigDict:
    """The saved config of the run at `source` (ConfigError if it is not a run)."""
    root = paths.resolve(source)
    config_file = root / workdir_lib.CONFIG_FILE
    if not config_file.exists():
        raise config_lib.ConfigError(f"train.init_from={source!r} holds no "
                                     f"{workdir_lib.CONFIG_FILE}: it is not a run's workdir")
    return ml_collections.ConfigDict(json.loads(config_file.read_text()))


def _param_shapes(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    state = nnx.state(abstract_model(cfg), nnx.Param)
    leaves = jax.tree_util.tree_flatten_with_path(state)[0]
    return {jax.tree_util.keystr(path): (tuple(x.shape), str(x.dtype)) for path, x in leaves}


def check_source(config: ml_collections.ConfigDict, cfg: ModelConfig) -> None:
    """Refuse (ConfigError, before anything is compiled or written) a source that cannot fit.

    The source must be another workdir holding a config and a checkpoint (at init_from_step
    if given), and its model must have exactly this run's parameter names and shapes.
    """
    source, step = config.train.init_from, config.train.get("init_from_step", 0)
    if step < 0:
        raise config_lib.ConfigError(f"train.init_from_step={step} must be >= 0 (0 = latest)")
    saved = source_config(source)
    steps = _checkpoint_steps(source)
    if not steps:
        raise config_lib.ConfigError(f"train.init_from={source!r} holds no checkpoint")
    if step and step not in steps:
        raise config_lib.ConfigError(f"train.init_from_step={step} is not among the "
                                     f"checkpoints of {source}: {sorted(steps)}")
    ours, theirs = _param_shapes(cfg), _param_shapes(config_lib.model_config(saved))
    differences = [f"{name}: {theirs.get(name, '<absent>')} -> {ours.get(name, '<absent>')}"
                   for name in sorted(set(ours) | set(theirs))
                   if ours.get(name) != theirs.get(name)]
    if differences:
        raise config_lib.ConfigError(
            f"train.init_from={source!r}: its checkpoint does not fit this model (change "
            "config.model / the variant to match it):\n  " + "\n  ".join(differences[:10]))


def _checkpoint_steps(source: str) -> list[int]:
    directory = paths.resolve(source) / "checkpoints"
    if not directory.exists():
        return []
    return [int(p.name) for p in directory.iterdir() if p.name.isdigit()]


def restore_params(source: str, step: int, abstract_params: Any, shardings: Any) -> Any:
    """The `params` subtree of the source checkpoint, placed with this run's shardings."""
    target = {"params": checkpoint_lib.abstract_with_shardings(abstract_params, shardings)}
    item = paths.resolve(source) / "checkpoints" / str(step) / "state"
    # A partial restore: the optimizer state and step in the checkpoint are not read.
    args = ocp.args.PyTreeRestore(item=target, partial_restore=True,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(target))
    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.restore(item, args=args)["params"]


def initial_state(config: ml_collections.ConfigDict, state: dict[str, Any],
                  spec: Any) -> dict[str, Any]:
    """`state` (freshly initialised) with the source run's parameters when train.init_from is set.

    The optimizer state stays fresh (AdamW moments at zero) and the step stays 0, so the new
    schedule starts from its warm-up.
    """
    source = config.train.get("init_from", "")
    if not source:
        return state
    step = config.train.get("init_from_step", 0) or max(_checkpoint_steps(source))
    params = restore_params(source, step, spec.abstract["params"], spec.shardings["params"])
    print(f"Initialised the parameters from {source} (step {step}); fresh optimizer, step 0.")
    return {**state, "params": params}
