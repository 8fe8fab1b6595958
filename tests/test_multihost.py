"""Two CPU processes joined by jax.distributed train like one process with all the devices."""

import importlib.util
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gated_attention.parallel import distributed

WORKER = Path(__file__).with_name("multiprocess_worker.py")
_spec = importlib.util.spec_from_file_location("multiprocess_worker", WORKER)
worker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker)


def test_initialize_decides_from_flags_and_environment():
    assert distributed.initialize(False, env={"JAX_COORDINATOR_ADDRESS": "h:1"}) is False
    assert distributed.initialize(None, env={}) is False  # one host, nothing asked for
    assert distributed.on_tpu_pod({"TPU_WORKER_HOSTNAMES": "10.0.0.2,10.0.0.3"})
    assert not distributed.on_tpu_pod({"TPU_WORKER_HOSTNAMES": "10.0.0.2"})
    assert distributed.on_tpu_pod({"CLOUD_TPU_TASK_ID": "3"})
    # what libtpu leaves in the environment after a compile-only start on a CPU host
    placeholder = ("WARNING: could not determine TPU worker number, please set env var "
                   "`TPU_WORKER_ID` manually, otherwise libtpu.so may not properly initialize.")
    assert not distributed.on_tpu_pod({k: placeholder for k in distributed.TPU_POD_ENV})
    with pytest.raises(ValueError, match="set JAX_NUM_PROCESSES and JAX_PROCESS_ID"):
        distributed.initialize(None, env={"JAX_COORDINATOR_ADDRESS": "localhost:1234"})
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' must be an integer"):
        distributed.initialize(None, env={"JAX_NUM_PROCESSES": "two"})
    assert distributed.initialize(None, env={"GATED_ATTENTION_MULTIHOST": "0"}) is False
    with pytest.raises(ValueError, match="GATED_ATTENTION_MULTIHOST='maybe' must be 1 or 0"):
        distributed.initialize(None, env={"GATED_ATTENTION_MULTIHOST": "maybe"})
    with pytest.raises(ValueError, match="GATED_ATTENTION_INIT_TIMEOUT_S=0 must be a positive"):
        distributed.initialize(True, env={"GATED_ATTENTION_INIT_TIMEOUT_S": "0"})
    with pytest.raises(ValueError, match="process_id=2 must be in 0..1"):
        distributed.initialize(True, coordinator_address="localhost:1", num_processes=2,
                               process_id=2, env={})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def spawn(port: int, logs: Path, *flags: str) -> list[subprocess.Popen]:
    """Two worker processes of 4 CPU devices each, joined on localhost:port.

    Their output goes to files in `logs`, not pipes: a worker blocked on a full pipe that
    nobody drains yet would never reach jax.distributed's shutdown barrier.
    """
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = []
    for i in range(2):
        with open(logs / f"worker{i}.out", "w") as out, open(logs / f"worker{i}.err", "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, str(WORKER), f"--process_id={i}", "--num_processes=2",
                 f"--port={port}", "--local_devices=4", *flags],
                stdout=out, stderr=err, text=True, env=env))
    return procs


def finish(procs: list[subprocess.Popen], logs: Path) -> list[dict]:
    """Each worker's last stdout line (JSON), after checking it exited cleanly."""
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            p.kill()
    errors = [(logs / f"worker{i}.err").read_text()[-3000:] for i in range(len(procs))]
    # One worker's failure shows up in the other as a barrier timeout: print both.
    assert [p.returncode for p in procs] == [0] * len(procs), "\n\n".join(
        f"worker {i} (exit {p.returncode}):\n{err}" for i, (p, err) in enumerate(zip(procs,
                                                                                  errors)))
    return [json.loads((logs / f"worker{i}.out").read_text().strip().splitlines()[-1])
            for i in range(len(procs))]


@pytest.mark.slow
def test_two_processes_agree_with_one_process(tmp_path):
    """Two processes of 4 devices train like one process of 8, in two set-ups (one start):

    1. the train step on synthetic data, each process one "slice" of dcn_data=2: each loads
       only its half of the batch;
    2. the whole `loop.run` (data pipeline, metrics, orbax checkpoints) on a tensor=8 axis
       spanning both processes: the batch is replicated over them, so each must read the
       whole batch (splitting by process index fails here); only process 0 writes metrics.
    """
    from test_train import mini_config

    from gated_attention.training import loop
    from gated_attention.training.metrics_writer import read_jsonl

    config = mini_config(tmp_path, steps=4, eval_every=4, checkpoint_every=2)
    config.optimizer.warmup_steps = 2
    config.model.update(dict(d_model=64, num_heads=8, num_kv_heads=8, head_dim=8, mlp_dim=128))
    config.mesh.update(dict(data=1, fsdp=1, tensor=8))
    (tmp_path / "config.json").write_text(config.to_json_best_effort())
    mesh = "data=1,fsdp=2,tensor=2,dcn_data=2"
    procs = spawn(free_port(), tmp_path, f"--mesh={mesh}", "--steps=3",
                  f"--config_json={tmp_path / 'config.json'}", f"--workdir={tmp_path / 'pod'}")
    # The single-process references run meanwhile, on 8 devices of this process.
    reference, _, _, _ = worker.train_steps(
        worker.tiny_config({"data": 2, "fsdp": 2, "tensor": 2}), 3)
    loop.run(config, tmp_path / "one", progress=False)
    results = finish(procs, tmp_path)

    assert [r["process"] for r in results] == [0, 1]
    assert all(r["processes"] == 2 and r["devices"] == 8 for r in results)
    assert results[0]["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2, "expert": 1}
    # 1. Each host loaded only its half of the global batch.
    assert [r["rows"] for r in results] == [[0, 4], [4, 8]]
    assert [r["shard"] for r in results] == [[0, 2], [1, 2]]
    for r in results:
        np.testing.assert_allclose(r["losses"], reference, rtol=1e-5)
    assert reference[-1] < reference[0]  # and it does train
    # 2. loop.run across hosts equals loop.run in one process.
    pod = read_jsonl(tmp_path / "pod" / "metrics.jsonl")
    one = read_jsonl(tmp_path / "one" / "metrics.jsonl")
    assert [(r["kind"], r["step"]) for r in pod] == [(r["kind"], r["step"]) for r in one]
    assert len(pod) == 4 + 1  # written once (by process 0), not once per process
    np.testing.assert_allclose([r["loss"] for r in pod], [r["loss"] for r in one], rtol=1e-5)
    assert sorted(p.name for p in (tmp_path / "pod" / "checkpoints").iterdir()) == ["2", "4"]


@pytest.mark.needs("libtpu")
def test_a_tpu_target_compile_leaves_no_pod_environment_to_children():
    """libtpu, started to compile for a TPU on this CPU host, sets CLOUD_TPU_TASK_ID and
    friends in the process environment; a child process (a grid's run) must still see a
    single host."""
    from gated_attention.compile import target as target_compile

    target_compile.tpu_devices("v5e:2x2")
    probe = ("import os, sys; from gated_attention.parallel import distributed; "
             "print(distributed.on_tpu_pod(), sorted(k for k in distributed.LIBTPU_PLACEHOLDER_ENV"
             " if k in os.environ))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1]).stdout.split()
    assert out == ["False", "[]"]


# ------------------------------------------------- detection: GCE TPU metadata, SLURM, Open MPI

class _MetadataServer:
    """A stand-in GCE metadata server on 127.0.0.1: answers only with the Metadata-Flavor
    header, like Google's, and 404 for an attribute it does not hold."""

    def __init__(self, attributes: dict[str, str]):
        import http.server
        import threading

        attrs = attributes

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                key = self.path.rsplit("/", 1)[-1]
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_response(403)
                    self.end_headers()
                    return
                body = attrs.get(key)
                self.send_response(200 if body is not None else 404)
                self.end_headers()
                self.wfile.write((body or "").encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = (f"http://127.0.0.1:{self.server.server_address[1]}/computeMetadata/v1/"
                    "instance/attributes")
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("attributes, expected", [
    # two workers, the old name:id:ip format and the new host list
    ({"agent-worker-number": "1", "worker-network-endpoints":
      "t1v-n-a-w-0:0:10.0.0.2,t1v-n-a-w-1:1:10.0.0.3"}, True),
    ({"agent-worker-number": "0", "worker-network-endpoints": "10.0.0.2,10.0.0.3"}, True),
    # a single-host TPU VM (v5litepod-8): not a pod
    ({"agent-worker-number": "0", "worker-network-endpoints": "10.0.0.2"}, False),
    # ... unless it is one slice of several (multislice, from the tpu-env attribute)
    ({"agent-worker-number": "0", "worker-network-endpoints": "10.0.0.2",
      "tpu-env": "ACCELERATOR_TYPE: 'v5litepod-8'\nMEGASCALE_NUM_SLICES: '2'\n"}, True),
    # a GCE VM that is no TPU worker (no agent-worker-number)
    ({"hostname": "vm"}, False),
])
def test_a_gce_tpu_pod_is_detected_from_the_metadata_server(attributes, expected):
    server = _MetadataServer(attributes)
    try:
        env = {distributed.ENV_METADATA_URL: server.url}
        assert distributed.gce_tpu_pod(env) is expected
        assert distributed.detect_cluster(env) == ("gce-tpu" if expected else None)
    finally:
        server.close()


def test_no_metadata_server_means_no_pod_quickly():
    import time

    start = time.monotonic()
    url = f"http://127.0.0.1:{free_port()}/computeMetadata/v1/instance/attributes"
    assert distributed.gce_tpu_pod({distributed.ENV_METADATA_URL: url}) is False
    # without an override and no TPU chips on the PCI bus, nothing is asked at all
    assert distributed.gce_tpu_pod({}) is False
    assert time.monotonic() - start < 5


def test_initialize_auto_joins_a_detected_pod_through_jax_own_detection(monkeypatch):
    """On a detected GCE TPU pod (or SLURM job), initialize(None) calls
    jax.distributed.initialize() with nothing filled in: jax finds the coordinator itself."""
    import jax

    calls = []
    monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
    server = _MetadataServer({"agent-worker-number": "1",
                              "worker-network-endpoints": "10.0.0.2,10.0.0.3"})
    try:
        env = {distributed.ENV_METADATA_URL: server.url}
        assert distributed.initialize(None, env=env) is True
        assert distributed.initialize(None, env={**env, "GATED_ATTENTION_MULTIHOST": "0"}) \
            is False  # 0 turns detection off
    finally:
        server.close()
    assert distributed.initialize(None, env=slurm_env(0, 2, 1234)) is True
    assert calls == [dict(coordinator_address=None, num_processes=None, process_id=None)] * 2


def slurm_env(task: int, tasks: int, job: int) -> dict[str, str]:
    """What srun sets for one task of a job step on one node (localhost)."""
    return {"SLURM_JOB_ID": str(job), "SLURM_STEP_NODELIST": "localhost",
            "SLURM_NTASKS": str(tasks), "SLURM_PROCID": str(task), "SLURM_LOCALID": str(task),
            "SLURM_STEP_NUM_NODES": "1"}


def test_slurm_and_openmpi_are_detected_as_jax_detects_them(monkeypatch):
    """Our decision agrees with jax's own SlurmCluster / OmpiCluster on stand-in environments:
    a step of several tasks (or ranks) is a job to join, a single task is not."""
    from jax._src.clusters import OmpiCluster, SlurmCluster

    ompi = {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911",
            "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    for env, kind, cluster, (count, rank) in [(slurm_env(1, 2, 77), "slurm", SlurmCluster, (2, 1)),
                                               (ompi, "openmpi", OmpiCluster, (4, 3))]:
        assert distributed.detect_cluster(env) == kind
        with monkeypatch.context() as m:
            for key in list(os.environ):
                if key.startswith(("SLURM_", "OMPI_")):
                    m.delenv(key)
            for key, value in env.items():
                m.setenv(key, value)
            assert cluster.is_env_present()
            assert (cluster.get_process_count(), cluster.get_process_id()) == (count, rank)
    assert distributed.detect_cluster(slurm_env(0, 1, 77)) is None  # one task: one process
    assert distributed.detect_cluster({**ompi, "OMPI_COMM_WORLD_SIZE": "1"}) is None
    partial = {k: v for k, v in slurm_env(0, 2, 77).items() if k != "SLURM_STEP_NODELIST"}
    assert distributed.detect_cluster(partial) is None  # salloc's shell, outside srun


def test_two_slurm_tasks_join_one_job_on_their_own(tmp_path):
    """Two processes with nothing but srun's variables (one node, localhost) join one jax job
    through --multihost=auto's decision and jax's SLURM detection: 2 processes, ids 0 and 1,
    rather than two independent single-process runs."""
    probe = ("from gated_attention.parallel import distributed; import jax; "
             "joined = distributed.initialize(None); "
             "print(joined, jax.process_index(), jax.process_count(), flush=True)")
    job = 4096 * 7 + (free_port() % 4096)  # the coordinator port jax derives from the job id
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("SLURM_", "OMPI_", "JAX_", "XLA_FLAGS"))}
    procs = []
    for task in range(2):
        with open(tmp_path / f"worker{task}.out", "w") as out, \
                open(tmp_path / f"worker{task}.err", "w") as err:
            procs.append(subprocess.Popen(
                [sys.executable, "-c", probe], stdout=out, stderr=err, text=True,
                env={**base, **slurm_env(task, 2, job), "JAX_PLATFORMS": "cpu",
                     "PYTHONPATH": str(Path(__file__).parents[1])},
                cwd=Path(__file__).parents[1]))
    try:
        for p in procs:
            p.wait(timeout=120)
    finally:
        for p in procs:
            p.kill()
    outs = [(tmp_path / f"worker{i}.out").read_text().split() for i in range(2)]
    assert [p.returncode for p in procs] == [0, 0], [
        (tmp_path / f"worker{i}.err").read_text()[-2000:] for i in range(2)]
    assert outs == [["True", "0", "2"], ["True", "1", "2"]]
