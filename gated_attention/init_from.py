"""Continued training: start a new run from the parameters of another run's checkpoint.

`--config.train.init_from=WORKDIR` (and optionally `train.init_from_step`, 0 = latest) makes a
new run begin with that run's weights and everything else of its own: a fresh optimizer and
learning-rate schedule, step 0, its own data and sequence length, and any RoPE base or
scaling. This is how a model trained at 256 tokens continues at 1024 with RoPE base 1M, as
the paper's long-context recipe does (base 10k -> 1M, continued training at 32k).

Only parameters are read; the source run is never written. config_lib.check_init_from checks
the source (a run with checkpoints whose parameters fit this model) before anything is
compiled or written. A run that already holds its own checkpoint resumes from that one, so a
killed continued run picks up where it stopped.
"""

from __future__ import annotations

from typing import Any

import orbax.checkpoint as ocp

from gated_attention import checkpoint as checkpoint_lib
from gated_attention import config_lib, paths


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
    step = config.train.get("init_from_step", 0) or config_lib.init_from_steps(source)[-1]
    params = restore_params(source, step, spec.abstract["params"], spec.shardings["params"])
    print(f"Initialised the parameters from {source} (step {step}); fresh optimizer, step 0.")
    return {**state, "params": params}
