"""orbax checkpoints of the train state and the data iterator, saved together and verified.

One CheckpointManager per run under `<workdir>/checkpoints`: periodic and final saves, the
last `keep` kept, asynchronous where the platform allows (the device-to-host copy blocks,
the write does not). Each step's checkpoint holds `state` (params, optimizer state, step; a
StandardSave pytree, restored straight into the current mesh's shardings), `data` (the
grain iterator's state, one file per host), so a resumed run continues with the very next
batch, and `integrity`: a fingerprint of every saved array.

A file can be damaged without changing its size (a flipped byte restores without error), so
`restore_latest` checks what it read: the fingerprints must equal those recorded at save time
and every value must be finite. A checkpoint that fails to restore or to verify is reported
(which one, and why), moved to `<workdir>/checkpoints.damaged/`, and the previous one is
tried. `save` refuses a state holding non-finite values, so a diverged run never replaces
the last good checkpoint.
"""

from __future__ import annotations

import os
import time
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding

from gated_attention.core import paths

DAMAGED_DIR = "checkpoints.damaged"
_GOLDEN = np.uint32(2654435761)  # Knuth's multiplicative hash constant: position weights


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read back as it was saved."""


def abstract_with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying shardings (`shardings` may be a prefix tree of `abstract`)."""

    def attach(sharding: NamedSharding, subtree: Any) -> Any:
        return jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding), subtree)

    return jax.tree.map(attach, shardings, abstract,
                        is_leaf=lambda x: isinstance(x, NamedSharding))


def _as_uint32(x: jax.Array) -> jax.Array:
    """The bits of `x` as a flat uint32 vector (8-byte values give two words each)."""
    width = x.dtype.itemsize
    if x.dtype == jnp.bool_:
        return x.reshape(-1).astype(jnp.uint32)
    if width >= 4:
        return jax.lax.bitcast_convert_type(x, jnp.uint32).reshape(-1)
    unsigned = jnp.uint8 if width == 1 else jnp.uint16
    return jax.lax.bitcast_convert_type(x, unsigned).reshape(-1).astype(jnp.uint32)


def _checksum(x: jax.Array) -> jax.Array:
    """Position-weighted sum of the bits, mod 2**32: any changed word changes it."""
    bits = _as_uint32(x)
    weights = jnp.arange(bits.size, dtype=jnp.uint32) * _GOLDEN + jnp.uint32(1)
    return jnp.sum(bits * weights, dtype=jnp.uint32)


def _finite(x: jax.Array) -> jax.Array:
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.all(jnp.isfinite(x))
    return jnp.array(True)


@jax.jit
def _fingerprint_leaves(leaves: list[jax.Array]) -> tuple[jax.Array, jax.Array]:
    sums = jnp.stack([_checksum(x) for x in leaves])
    finite = jnp.stack([_finite(x) for x in leaves])
    return sums, finite


# A state up to this size is fingerprinted on the host with numpy: the same sums, without
# compiling _fingerprint_leaves (about 1 CPU-s for a small model on a CPU, in every process
# that saves or restores). Larger states, and states spread over several hosts, are reduced
# where they live.
HOST_FINGERPRINT_BYTES = 64 << 20


def _host_uint32(x: np.ndarray) -> np.ndarray:
    """numpy's _as_uint32: the same words in the same order."""
    if x.dtype == np.bool_:
        return x.reshape(-1).astype(np.uint32)
    if x.dtype.itemsize >= 4:
        return np.ascontiguousarray(x).view(np.uint32).reshape(-1)
    unsigned = np.uint8 if x.dtype.itemsize == 1 else np.uint16
    return np.ascontiguousarray(x).view(unsigned).reshape(-1).astype(np.uint32)


def _host_fingerprint(leaves: list[Any]) -> tuple[list[int], list[bool]]:
    sums, finite = [], []
    for leaf in jax.device_get(leaves):
        x = np.asarray(leaf)
        bits = _host_uint32(x)
        weights = np.arange(bits.size, dtype=np.uint32) * _GOLDEN + np.uint32(1)  # mod 2**32
        sums.append(int(np.sum(bits * weights, dtype=np.uint32)))
        finite.append(not jnp.issubdtype(x.dtype, jnp.inexact) or bool(np.isfinite(x).all()))
    return sums, finite


def fingerprint(tree: Any, host_bytes: int = HOST_FINGERPRINT_BYTES
                ) -> tuple[dict[str, int], list[str]]:
    """({leaf path: checksum}, paths of leaves holding a non-finite value) of a pytree; on the
    host when the tree is this process's alone and at most `host_bytes`."""
    with_paths = jax.tree_util.tree_leaves_with_path(tree)
    names = [jax.tree_util.keystr(p) for p, _ in with_paths]
    leaves = [leaf for _, leaf in with_paths]
    local = all(getattr(leaf, "is_fully_addressable", True) for leaf in leaves)
    if local and sum(leaf.nbytes for leaf in leaves) <= host_bytes:
        sums, finite = _host_fingerprint(leaves)
    else:
        sums, finite = jax.device_get(_fingerprint_leaves(leaves))
    return ({n: int(s) for n, s in zip(names, sums)},
            [n for n, ok in zip(names, finite) if not ok])


class Checkpointer:
    def __init__(self, workdir: str | os.PathLike[str], *, keep: int, async_save: bool = True):
        self.workdir = paths.resolve(workdir)  # local or gs://
        self.directory = self.workdir / "checkpoints"
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                               enable_async_checkpointing=async_save)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, data_iterator: Any) -> None:
        """Save `state` (and the iterator) at `step`; a non-finite state is refused."""
        sums, nonfinite = fingerprint(state)
        if nonfinite:
            raise CheckpointError(f"refusing to save step {step}: non-finite values in "
                                  f"{nonfinite[0]} (and {len(nonfinite) - 1} more arrays); "
                                  "the previous checkpoints are kept")
        args = {"state": ocp.args.StandardSave(state),
                "integrity": ocp.args.JsonSave({"step": int(step), "fingerprints": sums})}
        if data_iterator is not None:
            args["data"] = grain.checkpoint.CheckpointSave(data_iterator)
        self.manager.save(step, args=ocp.args.Composite(**args), force=True)

    def restore(self, step: int, target: Any, data_iterator: Any) -> Any:
        """Restore `state` onto `target`'s shardings (and the data iterator in place), verified.

        Raises CheckpointError saying why the checkpoint at `step` is not usable.
        """
        args = {"state": ocp.args.StandardRestore(target)}
        if data_iterator is not None:
            args["data"] = grain.checkpoint.CheckpointRestore(data_iterator)
        try:
            restored = self.manager.restore(step, args=ocp.args.Composite(**args))
            recorded = self.manager.restore(
                step, args=ocp.args.Composite(integrity=ocp.args.JsonRestore()))["integrity"]
        except Exception as err:  # noqa: BLE001 - orbax and tensorstore raise many kinds
            raise CheckpointError(_one_line(f"it cannot be read: {type(err).__name__}: {err}")
                                  ) from err
        state = restored["state"]
        sums, nonfinite = fingerprint(state)
        if nonfinite:
            raise CheckpointError(f"it holds non-finite values in {nonfinite[0]}")
        expected = (recorded or {}).get("fingerprints") or {}
        if set(expected) != set(sums):
            raise CheckpointError("its arrays are not those recorded at save time")
        changed = [name for name in sums if sums[name] != expected[name]]
        if changed:
            raise CheckpointError(f"{changed[0]} differs from what was saved (fingerprint "
                                  f"mismatch in {len(changed)} arrays)")
        return state

    def restore_latest(self, target: Any, data_iterator: Any, *,
                       log: Any = print) -> tuple[int, Any] | None:
        """(step, state) of the newest checkpoint that restores and verifies, else None.

        Each unusable one is reported and moved to `<workdir>/checkpoints.damaged/`, so a
        later start does not meet it again; the next older one is then tried.
        """
        self.manager.wait_until_finished()
        for step in reversed(self.all_steps()):
            try:
                state, problem = self.restore(step, target, data_iterator), None
            except CheckpointError as err:
                state, problem = None, err
            if _on_every_host(problem is None):  # all hosts resume from the same step
                return step, state
            moved = self.move_aside(step)
            log(f"Checkpoint {self.directory / str(step)} is unusable: "
                f"{problem or 'another host could not use it'}. "
                f"Moved it to {moved}; trying the one before.")
        return None

    def move_aside(self, step: int) -> Any:
        """Move the checkpoint of `step` out of orbax's sight (nothing is deleted)."""
        from gated_attention.parallel import distributed

        moved = self.workdir / DAMAGED_DIR / f"{step}-{time.strftime('%Y%m%d-%H%M%S')}"
        if jax.process_index() == 0:
            moved.parent.mkdir(parents=True, exist_ok=True)
            free, n = moved, 1
            while free.exists():
                free, n = moved.with_name(f"{moved.name}-{n}"), n + 1
            paths.move_tree(self.directory / str(step), free)
            moved = free
        distributed.barrier(f"checkpoint {step} moved aside")
        self.manager.reload()
        return moved

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()


def _on_every_host(ok: bool) -> bool:
    """Whether `ok` holds on every process (one small all-gather when there are several)."""
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    return bool(np.all(multihost_utils.process_allgather(np.int32(ok))))


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."
