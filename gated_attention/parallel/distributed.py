"""Multi-host runs: join the processes, give each host its slice of the batch, log once.

On a Cloud TPU pod every worker runs the same command (tpu_scripts/launch.sh sets
GATED_ATTENTION_MULTIHOST=1); `initialize()` calls `jax.distributed.initialize()`, which
finds the coordinator from the TPU metadata. Without that variable, `initialize(None)`
(`main --multihost=auto`) detects the clusters jax.distributed itself can join, the way jax
detects them (`detect_cluster`): a GKE TPU slice (its environment variables), a GCE TPU VM
pod (the metadata server's `agent-worker-number` and `worker-network-endpoints`, asked only
where the PCI bus shows TPU chips, with a short timeout), a SLURM job step of several tasks
and an Open MPI job of several ranks (their environment variables). On other clusters (or two
CPU processes in a test) pass the coordinator address, process count and process id, by
argument or by the environment variables JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and
JAX_PROCESS_ID. Each host then loads only the rows of the global batch
its devices hold (`local_batch_rows`) and `global_batch` assembles the global arrays with
`jax.make_array_from_process_local_data`.
"""

from __future__ import annotations

import os
import sys
import traceback
import urllib.error
import urllib.request
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


# The GCE metadata server of a TPU VM (what jax.distributed asks on a TPU VM pod); the
# variable points it elsewhere (a test's stand-in server, a proxy).
METADATA_URL = "http://metadata.google.internal/computeMetadata/v1/instance/attributes"
ENV_METADATA_URL = "GATED_ATTENTION_METADATA_URL"
METADATA_TIMEOUT_S = 2.0
# What jax's own cluster detection requires of a SLURM job step and of an Open MPI job.
SLURM_ENV = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
             "SLURM_LOCALID")
OMPI_ENV = "OMPI_MCA_orte_hnp_uri"


def tpu_vm_metadata(key: str, url: str = METADATA_URL,
                    timeout_s: float = METADATA_TIMEOUT_S) -> str | None:
    """The TPU VM's metadata attribute `key`, or None when the server does not answer it."""
    request = urllib.request.Request(f"{url.rstrip('/')}/{key}",
                                     headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.read().decode().strip() if response.status == 200 else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def _tpu_chips_present() -> bool:
    """TPU chips on this host's PCI bus (jax's own test before it asks the metadata server)."""
    try:
        from jax._src import hardware_utils

        return hardware_utils.num_available_tpu_chips_and_device_id()[0] > 0
    except Exception:  # a jax without the helper: assume no TPU
        return False


def _num_slices_in_tpu_env(tpu_env: str | None) -> int:
    """MEGASCALE_NUM_SLICES from the metadata's `tpu-env` lines (`KEY: 'value'`)."""
    for line in (tpu_env or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "MEGASCALE_NUM_SLICES":
            value = value.strip().strip("'\"")
            return int(value) if value.isdigit() else 1
    return 1


def gce_tpu_pod(env: Mapping[str, str] | None = None, metadata_url: str | None = None) -> bool:
    """True on a worker of a GCE TPU VM slice of several hosts (or of several slices), as the
    metadata server describes it. The server is asked only with `metadata_url` (or
    GATED_ATTENTION_METADATA_URL) given, or where TPU chips are on the PCI bus."""
    env = os.environ if env is None else env
    url = metadata_url or env.get(ENV_METADATA_URL) or None
    if url is None:
        if "TPU_SKIP_MDS_QUERY" in env or not _tpu_chips_present():
            return False
        url = METADATA_URL
    worker = tpu_vm_metadata("agent-worker-number", url)
    if worker is None or not worker.isdigit():
        return False
    endpoints = [e for e in (tpu_vm_metadata("worker-network-endpoints", url) or "").split(",")
                 if e.strip()]
    slices = _env_int(env, "MEGASCALE_NUM_SLICES") or _num_slices_in_tpu_env(
        tpu_vm_metadata("tpu-env", url))
    return len(endpoints) > 1 or slices > 1


def slurm_job(env: Mapping[str, str] | None = None) -> bool:
    """A SLURM job step of several tasks (srun), as jax's SlurmCluster requires it."""
    env = os.environ if env is None else env
    return all(k in env for k in SLURM_ENV) and (_env_int(env, "SLURM_NTASKS") or 1) > 1


def openmpi_job(env: Mapping[str, str] | None = None) -> bool:
    """An Open MPI job (mpirun) of several ranks, as jax's OmpiCluster requires it."""
    env = os.environ if env is None else env
    return OMPI_ENV in env and (_env_int(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1


def detect_cluster(env: Mapping[str, str] | None = None,
                   metadata_url: str | None = None) -> str | None:
    """Which multi-process job this process is part of: "gke-tpu", "slurm", "openmpi",
    "gce-tpu", or None (a single process). The environment is read first; the metadata server
    last (see gce_tpu_pod)."""
    env = os.environ if env is None else env
    if on_tpu_pod(env):
        return "gke-tpu"
    if slurm_job(env):
        return "slurm"
    if openmpi_job(env):
        return "openmpi"
    if gce_tpu_pod(env, metadata_url):
        return "gce-tpu"
    return None


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

    multihost=None decides from the environment: GATED_ATTENTION_MULTIHOST=1,
    JAX_COORDINATOR_ADDRESS set, or a cluster `detect_cluster` finds (a TPU pod on GKE or
    GCE, a SLURM or Open MPI job), which jax.distributed then joins through its own
    detection. multihost=False never initializes. Calling it twice is harmless.
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
        multihost = (flag in ("1", "true") or coordinator_address is not None
                     or (flag not in ("0", "false") and detect_cluster(env) is not None))
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


def end_failed_process(exit_code: int = 1) -> None:
    """End a failed process of a multi-process job now: its traceback, then exit (called while
    the exception is handled). With one process it returns: the caller re-raises.

    A normal exit runs jax.distributed's shutdown, which waits for every peer at a barrier;
    when this process failed because a peer died (a collective that lost its partner), that
    barrier waits for the dead peer until the coordination service's heartbeat gives up
    (100 s by default), and whatever relaunches the job (a grid on Ray, JobSet) waits as
    long. Here nothing is left to save (the run resumes from its last checkpoint),
    so the process ends at once, as the step watchdog ends a stuck one."""
    if jax.process_count() == 1:
        return
    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def barrier(name: str) -> None:
    """Return once every process has reached the barrier `name` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


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
