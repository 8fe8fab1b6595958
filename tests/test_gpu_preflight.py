"""GPU pre-flight: node names map to the GPUs' published figures, the target configs written
from them compile, and a real XLA:GPU compile (deviceless) of the tiny arch's train step on
8 GPUs of 2 hosts holds the Triton kernels, with memory and FLOPs matching hand counts.

One GPU compile of the train step for the whole file (the `tiny_gpu_step` fixture, about 15 s
of CPU); the report, the does-not-fit verdicts and the HLO dump reuse it.
"""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gated_attention.compile import gpu_targets, memory, preflight
from gated_attention.compile import target as target_compile
from gated_attention.config import run_config

ROOT = Path(__file__).resolve().parents[1]


# NVIDIA's data sheets: compute capability, SMs and memory ("80GB", "141GB", "180GB" per GPU
# in an HGX/DGX node; the driver reports a little less than that many GiB).
@pytest.mark.needs("jax_plugins.xla_cuda12")
@pytest.mark.parametrize("name, kind, capability, sms, memory_gb", [
    ("a100-80gb-8", "NVIDIA A100-SXM4-80GB", (8, 0), 108, 80),
    ("h100-8", "NVIDIA H100 80GB HBM3", (9, 0), 132, 80),
    ("h200-8", "NVIDIA H200", (9, 0), 132, 141),
    ("b200-8", "NVIDIA B200", (10, 0), 148, 180),
])
def test_gpu_names_map_to_published_figures_and_their_configs_compile(name, kind, capability,
                                                                      sms, memory_gb):
    node = gpu_targets.parse_accelerator(name, hosts=2)
    assert (node.chips, node.topology, node.spec.compute_capability, node.spec.sms) == (
        16, "1x2x8", capability, sms)
    assert abs(node.hbm_bytes / 2**30 - memory_gb) / memory_gb < 0.01
    assert node.memory_budget(0.75) == int(node.hbm_bytes * 0.75)
    devices = target_compile.gpu_devices(node)
    assert len(devices) == 16 and {d.device_kind for d in devices} == {kind}
    assert sorted({d.process_index for d in devices}) == [0, 1]  # two hosts of 8
    # The config text is one XLA:GPU compiles with: a sharded matmul (2 x 8 x 16 x 64 FLOPs
    # per device once the 8 x 64 rows are gathered) compiles and is counted.
    mesh = jax.sharding.Mesh(devices, ("data",))
    x = jax.ShapeDtypeStruct((128, 64), jnp.float32,
                             sharding=NamedSharding(mesh, PartitionSpec("data")))
    step = target_compile.CompiledStep("matmul", jax.jit(lambda x: x @ x.T).lower(x).compile(),
                                       0.0, 0.0)
    assert step.flops_and_source[0] == 2 * 8 * 128 * 64


def test_unknown_gpu_names_and_bad_hosts_are_refused_with_the_known_ones():
    for bad in ("h200-3", "h200-16", "h300-8", "b200"):
        with pytest.raises(ValueError, match="a100-80gb-1, .*h200-8, .*b200-8"):
            preflight.parse_target(bad)
    with pytest.raises(ValueError, match="--hosts=0 must be a positive"):
        preflight.parse_target("h100-8", hosts=0)
    with pytest.raises(ValueError, match="--hosts=2 applies to GPU nodes"):
        preflight.parse_target("v5p-8", hosts=2)


def test_cli_refuses_an_unknown_gpu_in_one_line_before_compiling(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gated_attention.preflight",
         "--config=configs/ablation.py:arch=tiny", "--accelerator=h200-3",
         f"--dump_hlo={tmp_path / 'hlo'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2  # a user error (1 is "does not fit")
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Pre-flight error: accelerator 'h200-3' is not a GPU node"), last
    assert "h200-8" in last and not (tmp_path / "hlo").exists()


def tiny_config():
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.num_layers = 2
    config.model.attention_impl = "pallas_gpu"  # this project's gated Triton kernel
    config.train.batch_size = 8
    return config


@pytest.fixture(scope="module")
def tiny_gpu_step():
    config = tiny_config()
    node = gpu_targets.parse_accelerator("h100-4", hosts=2)  # 8 GPUs on 2 hosts
    mesh = preflight.gpu_mesh(node, config.mesh)
    return config, node, mesh, preflight.compile_step(config, mesh, "train", platform="gpu")


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_tiny_train_step_compiles_for_8_gpus_of_2_hosts_with_triton_kernels(tiny_gpu_step):
    config, node, mesh, step = tiny_gpu_step
    assert mesh.devices.size == 8 and mesh.devices.flat[0].device_kind == node.spec.name
    hlo = step.hlo_text
    # Two unscanned layers: each has the forward and the dk/dv kernel (dq added atomically
    # inside it); with no remat the forward is not recomputed. No interpreter anywhere.
    assert step.kernels == {"mosaic_tpu": 0, "triton": 4, "cudnn": 0, "mosaic_gpu": 0}
    assert "callback" not in hlo.lower()
    assert "all-reduce" in hlo  # data parallel over both hosts: gradients are summed


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_gpu_memory_and_flops_match_hand_counts(tiny_gpu_step):
    config, node, mesh, step = tiny_gpu_step
    cfg = run_config.model_config(config)
    params = memory.parameter_bytes(cfg, dict(mesh.shape))
    assert params == 4 * 2 * (128 * 128 * 4 + 128 * 384 * 3 + 2 * 128 + 2 * 32) + 4 * (
        1024 * 128 + 128)  # q,k,v(GQA 2 of 4 heads),o,gate = 4 of D x 128; 3 FFN; 4 norms
    batch = 5 * (8 // 8) * 256 * 4  # this GPU's row of the 5 int32 [8, 256] batch arrays
    assert math.isclose(step.memory["arguments"], 3 * params + 4 + batch, rel_tol=0.01)
    assert step.memory["aliased"] >= 3 * params  # the donated state is updated in place
    # FLOPs: XLA's HLO count of the plain ops; the Triton kernels count 0 (the source says
    # so). Per token: 6 x the tied embedding/head matmul and 6 x each layer's matmul weights.
    flops, source = step.flops_and_source
    assert source == "compiler (HLO cost analysis; custom-call kernels count 0)"
    dense = (6 * 1024 * 128 + 6 * 2 * (128 * 128 * 4 + 128 * 384 * 3)) * 1 * 256
    assert math.isclose(flops, dense, rel_tol=0.05), (flops, dense)


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_gpu_report_dump_and_verdicts(tiny_gpu_step, tmp_path, monkeypatch):
    config, node, _, step = tiny_gpu_step
    monkeypatch.setattr(preflight, "compile_step", lambda *a, **k: step)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    info = preflight.preflight(config, node, ("train",), dump_hlo=tmp_path / "hlo")
    train = info["steps"]["train"]
    budget = int(node.hbm_bytes * 0.75)  # jax's allocator default share
    assert info["fits"] and train["headroom"] == budget - step.memory["total"]
    assert info["memory_budget_per_device"] == budget and info["platform"] == "gpu"
    assert train["kernels"]["triton"] == 4 and train["flops_source"].startswith("compiler")
    assert (tmp_path / "hlo" / "train_step.hlo.txt").read_text() == step.hlo_text
    json.dumps(info)  # --json prints it
    text = preflight.format_report(info)
    assert "2 host(s) x 4 NVIDIA H100 80GB HBM3" in text and "4 triton" in text
    assert "custom-call kernels count 0" in text and text.endswith("=> fits on h100-4")
    # The share follows XLA_PYTHON_CLIENT_MEM_FRACTION, as the run will.
    monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.5")
    half = preflight.preflight(config, node, ("train",))
    assert half["memory_budget_per_device"] == int(node.hbm_bytes * 0.5)
    # The same program on a GPU of 8 MiB does not fit: the project judges, XLA:GPU does not.
    small = dataclasses.replace(node, spec=dataclasses.replace(node.spec, memory_bytes=8 * 2**20))
    refused = preflight.preflight(config, small, ("train",))
    assert not refused["fits"] and "does NOT fit" in preflight.format_report(refused)
    # No count from the compiler: the model's, named as such (never a silent 0).
    monkeypatch.setitem(step.__dict__, "flops_and_source", (0.0, "none"))
    counted = preflight.preflight(config, node, ("train",))["steps"]["train"]
    assert counted["flops_source"].startswith("model")
    assert counted["flops_per_step"] == pytest.approx(preflight.model_flops_per_step(config))


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_xla_gpu_compiles_a_program_over_the_gpus_memory_and_the_preflight_refuses_it():
    """Two 48 GiB buffers on one H100 of 80 GB: XLA:GPU compiles it; the fit says no."""
    node = gpu_targets.parse_accelerator("h100-1")
    device = target_compile.gpu_devices(node)[0]
    big = jax.ShapeDtypeStruct((12, 2**30), jnp.float32,
                               sharding=jax.sharding.SingleDeviceSharding(device))
    compiled = jax.jit(lambda x: (x + 1.0, x * 2.0)).lower(big).compile()
    step = target_compile.CompiledStep("big", compiled, 0.0, 0.0)
    assert step.memory["total"] >= 3 * 48 * 2**30 > node.hbm_bytes
