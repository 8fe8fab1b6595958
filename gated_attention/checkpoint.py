"""orbax checkpoints of the train state and the data iterator, saved together.

One CheckpointManager per run under `<workdir>/checkpoints`: periodic and final saves, the
last `keep` kept, asynchronous where the platform allows (the device-to-host copy blocks,
the write does not). Each step's checkpoint holds `state` (params, optimizer state, step; a
StandardSave pytree, restored straight into the current mesh's shardings) and `data` (the
grain iterator's state, one file per host), so a resumed run continues with the very next
batch.
"""

from __future__ import annotations

import os
from typing import Any

import grain
import jax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding

from gated_attention import paths


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (`shardings` may be a prefix tree of `abstract`)."""

    def attach(sharding: NamedSharding, subtree: Any) -> Any:
        return jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), subtree)

    return jax.tree.map(attach, shardings, abstract,
                        is_leaf=lambda x: isinstance(x, NamedSharding))


class Checkpointer:
    def __init__(self, workdir: str | os.PathLike[str], *, keep: int, async_save: bool = True):
        self.directory = paths.resolve(workdir) / "checkpoints"  # local or gs://
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: Any, data_iterator: Any) -> None:
        args = {"state": ocp.args.StandardSave(state)}
        if data_iterator is not None:
            args["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self.manager.save(step, args=ocp.args.Composite(**args), force=True)

    def restore(self, step: int, target: Any, data_iterator: Any) -> Any:
        """Restore `state` onto `target`'s shardings, and the data iterator in place."""
        args = {"state": ocp.args.StandardRestore(target)}
        if data_iterator is not None:
            args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        restored = self.manager.restore(step, args=ocp.args.Composite(**args))
        return restored["state"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
