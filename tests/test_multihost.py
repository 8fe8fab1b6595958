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

from gated_attention import distributed

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
    2. the whole `train.run` (data pipeline, metrics, orbax checkpoints) on a tensor=8 axis
       spanning both processes: the batch is replicated over them, so each must read the
       whole batch (splitting by process index fails here); only process 0 writes metrics.
    """
    from test_train import mini_config

    from gated_attention import train
    from gated_attention.metrics_writer import read_jsonl

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
    train.run(config, tmp_path / "one", progress=False)
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
    # 2. train.run across hosts equals train.run in one process.
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
    from gated_attention import target_compile

    target_compile.tpu_devices("v5e:2x2")
    probe = ("import os, sys; from gated_attention import distributed; "
             "print(distributed.on_tpu_pod(), sorted(k for k in distributed.LIBTPU_PLACEHOLDER_ENV"
             " if k in os.environ))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[1]).stdout.split()
    assert out == ["False", "[]"]
