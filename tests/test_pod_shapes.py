"""Slice shapes of every documented TPU type, and the multislice pre-flight (libtpu, deviceless).

References: Google's "TPU v5p" page (its table of slice shapes up to 16x16x24), the v4 page
("12x12x24" as an example torus), and the per-type tables of Google's MaxText / xpk
(v4-384 = 4x4x12, v5p-9216 = 12x16x24, v5p-10368 = 12x12x36, ...): hand-copied values, not
a rule, so a wrong rule fails here.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gated_attention.compile.tpu_topologies import (
    AcceleratorError,
    cube_layout,
    known_accelerators,
    parse_accelerator,
)

ROOT = Path(__file__).resolve().parents[1]

PUBLISHED = {
    # Google's v5p table (topology per chip count)
    "v5p-128": "4x4x4", "v5p-256": "4x4x8", "v5p-512": "4x8x8", "v5p-1024": "8x8x8",
    "v5p-2048": "8x8x16", "v5p-4096": "8x16x16", "v5p-8192": "16x16x16",
    "v5p-12288": "16x16x24",
    # MaxText / xpk per-type tables: the shapes in 64-chip steps
    "v4-384": "4x4x12", "v4-1536": "8x8x12", "v5p-384": "4x4x12", "v5p-640": "4x4x20",
    "v5p-768": "4x8x12", "v5p-1152": "4x12x12", "v5p-2304": "8x12x12",
    "v5p-3456": "12x12x12", "v5p-4608": "12x12x16", "v5p-6272": "4x28x28",
    "v5p-7808": "4x4x244", "v5p-9216": "12x16x24", "v5p-10368": "12x12x36",
    "v5p-11520": "12x20x24", "v5p-9856": "4x28x44",
    # single hosts and the small slices
    "v4-8": "2x2x1", "v4-32": "2x2x4", "v5p-64": "2x4x4",
    # v3: 2-D torus, 2 cores per chip in the name
    "v3-8": "2x2", "v3-32": "4x4", "v3-2048": "32x32", "v2-512": "16x16",
    # TPU7x (GKE only), named as xpk names it: TensorCores, 2 per chip
    "tpu7x-8": "2x2x1", "tpu7x-128": "4x4x4", "tpu7x-12288": "16x16x24",
}


@pytest.mark.parametrize("name, layout", sorted(PUBLISHED.items()))
def test_published_shapes(name, layout):
    tpu = parse_accelerator(name)
    assert tpu.topology.split(":")[1] == layout
    assert tpu.chips * tpu.generation.cores_per_name_unit == int(name.split("-")[1])


def test_every_cube_step_up_to_the_pod_and_nothing_past_it():
    names = set(known_accelerators())
    # v4: every whole number of cubes up to the 4096-chip pod (v4-8192 = 16x16x16)
    assert {f"v4-{128 * k}" for k in range(1, 65)} <= names
    assert parse_accelerator("v4-8192").topology == "v4:16x16x16"
    assert "v4-8320" not in names
    # v5p: up to 96 cubes, except primes above 64 (Google offers no 4x4x268)
    v5p = {int(n.split("-")[1]) // 128 for n in names if n.startswith("v5p-")} - {0}
    assert v5p == set(range(1, 97)) - {67, 71, 73, 79, 83, 89}
    assert cube_layout(67) is None and cube_layout(61) == (4, 4, 244)
    for bad in ("v5p-8576", "v5p-12416", "v4-192", "v3-16"):
        with pytest.raises(AcceleratorError, match="not a Cloud TPU type"):
            parse_accelerator(bad)


def test_hosts_per_slice():
    # Google: v5litepod-8 / v6e-8 are one 8-chip VM; v4, v5p and v3 hosts hold 4 chips.
    assert [parse_accelerator(n).hosts for n in
            ("v5litepod-8", "v5litepod-16", "v6e-8", "v4-8", "v4-32", "v5p-128", "v3-32")] == [
        1, 4, 1, 1, 4, 16, 4]


def test_type_check_command_for_create():
    ok = subprocess.run([sys.executable, "-m", "gated_attention.compile.tpu_topologies", "v4-384"],
                        capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert ok.returncode == 0 and ok.stdout.split() == [
        "v4-384", "topology=v4:4x4x12", "chips=192", "hosts=48"]
    bad = subprocess.run([sys.executable, "-m", "gated_attention.compile.tpu_topologies", "v4-100"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert bad.returncode == 2 and bad.stderr.startswith("error: accelerator 'v4-100' is not")


@pytest.mark.needs("libtpu")
@pytest.mark.parametrize("topology, devices", [
    ("v4:4x4x12", 192), ("v5p:16x16x24", 6144), ("v3:4x4", 32), ("tpu7x:2x2x1", 8)])
def test_libtpu_describes_the_new_shapes(topology, devices):
    """The deviceless compiler knows the shapes: one device per chip on v4 / v5p (megacore),
    one per core on v3 and TPU7x (2 per chip)."""
    from gated_attention.compile import target as target_compile

    assert len(target_compile.tpu_devices(topology)) == devices


@pytest.mark.needs("libtpu")
def test_two_slice_devices_carry_their_slice():
    from gated_attention.compile import target as target_compile

    devices = target_compile.tpu_devices("v5e:2x2", num_slices=2)
    assert sorted(d.slice_index for d in devices) == [0] * 4 + [1] * 4


@pytest.mark.slow
@pytest.mark.needs("libtpu")
def test_preflight_compiles_the_tiny_config_for_two_slices(tmp_path):
    """The real pre-flight, 2 x v5e-4 (data parallel across the slices through dcn_data=2):
    8 devices, the batch split 8 ways, per-chip memory and the fit printed; without the DCN
    axis it is refused before compiling, naming the field."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    common = [sys.executable, "-m", "gated_attention.preflight",
              "--config=configs/ablation.py:arch=tiny,variant=baseline",
              "--accelerator=v5litepod-4", "--slices=2", "--steps=train",
              "--config.data.seq_len=64", "--config.train.batch_size=8",
              # one layer: the slices' claims do not depend on the depth, and the tiny
              # arch's 4 unrolled layers made this the file's 16 CPU-s
              "--config.model.num_layers=1"]
    from gated_attention.compile import preflight
    from gated_attention.config import run_config

    config = run_config.base_config("tiny", "baseline")
    with pytest.raises(ValueError, match=r"^--slices=2 needs mesh.dcn_\* sizes that multiply "
                       r"to 2 \(e.g. --config.mesh.dcn_data=2\); the config spans 1 slice\(s\) "
                       r"\(none set\)$"):
        preflight.preflight(config, parse_accelerator("v5litepod-4"), num_slices=2)
    config.mesh.dcn_data = 4
    with pytest.raises(ValueError, match=r"spans 4 slice\(s\) \(mesh.dcn_data=4\)"):
        preflight.check_slices(config, 2)
    result = subprocess.run([*common, "--config.mesh.dcn_data=2", "--json"], capture_output=True,
                            text=True, cwd=ROOT, env=env, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    import json

    info = json.loads(result.stdout)
    assert (info["slices"], info["chips"], info["devices"]) == (2, 8, 8)
    assert info["mesh"] == {"data": 8, "fsdp": 1, "tensor": 1, "expert": 1}
    assert info["hbm_per_device"] == 16 * 2**30 and info["fits"] is True
    train = info["steps"]["train"]
    assert 0 < train["memory"]["total"] < 2**30 and train["fits"]
