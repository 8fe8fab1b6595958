"""Multi-host runs: join the processes, give each host its slice of the batch, log once.

On a Cloud TPU pod every worker runs the same command (tpu_scripts/launch.sh sets
GATED_ATTENTION_MULTIHOST=1); `initialize()` calls `jax.distributed.initialize()`, which
finds the coordinator from the TPU metadata. On other
clusters (or two CPU processes in a test) pass the coordinator address, process count and
process id, by argument or by the environment variables JAX_COORDINATOR_ADDRESS,
JAX_NUM_PROCESSES and JAX_PROCESS_ID. Each host then loads only the rows of the global batch
its devices hold (`local_batch_rows`) and `global_batch` assembles the global arrays with
`jax.make_array_from_process_local_data`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding

# Environment variables set on Cloud TPU VMs of a multi-host slice (any of them means "pod").
TPU_POD_ENV = ("TPU_WORKER_HOSTNAMES", "MEGASCALE_COORDINATOR_ADDRESS", "CLOUD_TPU_TASK_ID")
ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID = (
    "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
# Set to 1 by tpu_scripts/launch.sh: join the pod's processes (jax finds the coordinator from
# the TPU metadata), even where the worker's environment does not show it is a pod.
ENV_MULTIHOST = "GATED_ATTENTION_MULTIHOST"
# Seconds the processes wait for each other to join (jax's default: 300). A grid on a pod
# sets it higher: worker 0 analyses a run while the others already wait for the next one.
ENV_INIT_TIMEOUT = "GATED_ATTENTION_INIT_TIMEOUT_S"


# Variables libtpu sets in the process environment when it starts off a TPU VM (compiling for
# a TPU target on a CPU host), with a "WARNING: could not determine ..." sentence as their
# value. Python's os.environ never sees them, but child processes inherit them.
LIBTPU_PLACEHOLDER_ENV = ("TPU_WORKER_ID", "CLOUD_TPU_TASK_ID", "CLOUD_TPU_ACCELERATOR_TYPE",
                          "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES")


def _value(env: Mapping[str, str], key: str) -> str:
    """The variable's value, or "" when unset or holding a sentence (libtpu's placeholder)."""
    value = env.get(key, "").strip()
    return "" if any(c.isspace() for c in value) else value


def on_tpu_pod(env: Mapping[str, str] | None = None) -> bool:
    """True on a TPU VM that is one worker of several (single-host VMs list one hostname)."""
    env = os.environ if env is None else env
    hosts = [h for h in _value(env, "TPU_WORKER_HOSTNAMES").split(",") if h]
    task_id = _value(env, "CLOUD_TPU_TASK_ID")
    return (len(hosts) > 1 or bool(_value(env, "MEGASCALE_COORDINATOR_ADDRESS"))
            or task_id.isdigit())


def clear_libtpu_placeholders() -> None:
    """Unset the placeholder variables libtpu leaves after a compile-only start on a CPU host,
    so that processes started from this one do not take themselves for workers of a pod. A
    variable this process was started with (os.environ holds it) is kept."""
    for key in LIBTPU_PLACEHOLDER_ENV:
        if key not in os.environ:
            os.unsetenv(key)


def _env_int(env: Mapping[str, str], key: str) -> int | None:
    value = env.get(key)
    if value in (None, ""):
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {key}={value!r} must be an integer") from None


def initialize(multihost: bool | None = None, *, coordinator_address: str | None = None,
               num_processes: int | None = None, process_id: int | None = None,
               env: Mapping[str, str] | None = None) -> bool:
    """Join the other processes when asked to (or on a TPU pod); return whether we did.

    multihost=None decides from the environment: GATED_ATTENTION_MULTIHOST=1, a TPU pod, or
    JAX_COORDINATOR_ADDRESS set. multihost=False never initializes. Calling it twice is
    harmless.
    """
    env = os.environ if env is None else env
    coordinator_address = coordinator_address or env.get(ENV_COORDINATOR) or None
    num_processes = num_processes if num_processes is not None else _env_int(
        env, ENV_NUM_PROCESSES)
    process_id = process_id if process_id is not None else _env_int(env, ENV_PROCESS_ID)
    if multihost is None:
        flag = env.get(ENV_MULTIHOST, "").strip().lower()
        if flag not in ("", "0", "1", "false", "true"):
            raise ValueError(f"environment variable {ENV_MULTIHOST}={flag!r} must be 1 or 0")
        multihost = (flag in ("1", "true") or on_tpu_pod(env)
                     or coordinator_address is not None)
    if not multihost:
        return False
    if coordinator_address is not None and (num_processes is None or process_id is None):
        raise ValueError(f"a coordinator address ({coordinator_address}) needs the process count "
                         f"and this process's id: set {ENV_NUM_PROCESSES} and {ENV_PROCESS_ID} "
                         "(or pass num_processes / process_id)")
    if num_processes is not None and process_id is not None and not (
            0 <= process_id < num_processes):
        raise ValueError(f"process_id={process_id} must be in 0..{num_processes - 1}")
    timeout = _env_int(env, ENV_INIT_TIMEOUT)
    if timeout is not None and timeout <= 0:
        raise ValueError(f"environment variable {ENV_INIT_TIMEOUT}={timeout} must be a positive "
                         "number of seconds")
    if jax.distributed.is_initialized():
        return True
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id,
                               **({} if timeout is None else {"initialization_timeout": timeout}))
    return True


def barrier(name: str) -> None:
    """Return once every process has reached the barrier `name` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def is_main_process() -> bool:
    """Only process 0 writes logs, metrics files and reports."""
    return jax.process_index() == 0


def per_host_batch(batch_size: int, process_count: int) -> int:
    """Rows of the global batch (train.batch_size) each host loads."""
    if batch_size % process_count:
        raise ValueError(f"train.batch_size={batch_size} must be divisible by the number of "
                         f"hosts ({process_count})")
    return batch_size // process_count


def host_rows(batch_size: int, process_index: int, process_count: int) -> slice:
    """This host's rows of a global batch drawn whole (the data then do not depend on the
    number of hosts)."""
    per_host = per_host_batch(batch_size, process_count)
    return slice(process_index * per_host, (process_index + 1) * per_host)


def local_batch_rows(sharding: NamedSharding, global_batch_size: int) -> slice:
    """The contiguous rows of a [batch, ...] global array that this process's devices hold.

    Processes that hold the same rows (the batch axis replicated across them, e.g. tensor
    parallelism across hosts) get the same slice and must load the same examples.
    """
    indices = sharding.addressable_devices_indices_map((global_batch_size,))
    starts = sorted({(idx[0].start or 0, idx[0].stop or global_batch_size)
                     for idx in indices.values()})
    lo, hi = starts[0][0], starts[-1][1]
    covered = sum(stop - start for start, stop in starts)
    if covered != hi - lo:
        raise ValueError("this process's devices hold non-contiguous batch rows; build the mesh "
                         "with sharding.create_mesh so batch shards follow process order")
    return slice(lo, hi)


def data_shard(sharding: NamedSharding, global_batch_size: int) -> tuple[int, int]:
    """(shard index, shard count) for this process's input pipeline.

    Processes holding the same rows (the batch replicated across them, e.g. tensor
    parallelism across hosts) get the same index, so they read the same examples; splitting
    the data by process_index / process_count would feed those replicas different rows.
    """
    rows = local_batch_rows(sharding, global_batch_size)
    size = rows.stop - rows.start
    return rows.start // size, global_batch_size // size


def global_batch(local: Mapping[str, np.ndarray], sharding: NamedSharding,
                 global_batch_size: int) -> dict[str, jax.Array]:
    """Global [batch, ...] arrays from the rows this process loaded (see local_batch_rows)."""
    out: dict[str, Any] = {}
    for key, value in local.items():
        value = np.asarray(value)
        shape = (global_batch_size, *value.shape[1:])
        out[key] = jax.make_array_from_process_local_data(sharding, value, shape)
    return out
