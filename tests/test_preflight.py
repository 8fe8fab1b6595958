"""Pre-flight: gcloud names map to the documented topologies, and a real TPU compile of the
tiny arch's whole train step (libtpu, deviceless) holds the Pallas kernel as Mosaic calls,
with the compiler's memory and FLOPs matching hand counts.

One TPU compile for the whole file (the `tiny_train_step` fixture); the report, HLO dump,
inspect's memory section and the does-not-fit verdict reuse it.
"""

import dataclasses
import json
import math
import subprocess
import sys
from pathlib import Path

import jax
import pytest

from gated_attention.compile import memory, preflight
from gated_attention.compile import target as target_compile
from gated_attention.compile.tpu_topologies import AcceleratorError, parse_accelerator, torus_layout
from gated_attention.config import run_config

ROOT = Path(__file__).resolve().parents[1]


# Google's Cloud TPU documentation: v4 and v5p types count TensorCores (2 per chip), v5e and
# v6e count chips; slice shapes as the docs list them.
@pytest.mark.parametrize("name, chips, topology, hbm_gib", [
    ("v5litepod-4", 4, "v5e:2x2", 16), ("v5litepod-16", 16, "v5e:4x4", 16),
    ("v5litepod-256", 256, "v5e:16x16", 16), ("v5p-8", 4, "v5p:2x2x1", 95),
    ("v5p-64", 32, "v5p:2x4x4", 95), ("v5p-128", 64, "v5p:4x4x4", 95),
    ("v6e-8", 8, "v6e:2x4", 32), ("v6e-64", 64, "v6e:8x8", 32), ("v4-32", 16, "v4:2x2x4", 32),
])
def test_gcloud_accelerator_names_map_to_topologies(name, chips, topology, hbm_gib):
    tpu = parse_accelerator(name)
    assert (tpu.chips, tpu.topology, tpu.hbm_bytes) == (chips, topology, hbm_gib * 2**30)


def test_unknown_accelerator_names_are_refused_with_the_known_ones():
    for bad in ("v5p-6", "v5litepod-3", "v7-8", "tpu-16", "v5p"):
        with pytest.raises(AcceleratorError, match="known: v4-8, .*v5litepod-16, .*v6e-256"):
            parse_accelerator(bad)
    assert torus_layout(512, 3) == (8, 8, 8) and torus_layout(128, 2) == (8, 16)


def test_cli_refuses_bad_input_in_one_line_before_compiling(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "gated_attention.preflight",
         "--config=configs/ablation.py:arch=tiny", "--accelerator=v5p-6",
         f"--dump_hlo={tmp_path / 'hlo'}"],
        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 2  # a user error (1 is "does not fit")
    assert result.stderr.strip().splitlines()[-1].startswith(
        "Pre-flight error: accelerator 'v5p-6' is not a Cloud TPU type")
    assert not (tmp_path / "hlo").exists()


def tiny_config():
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.num_layers = 2
    config.model.scan_layers = True  # one traced block: the compile stays cheap
    config.model.remat = "full"
    config.model.attention_impl = "pallas_tpu"  # this project's gated flash kernel
    config.train.batch_size = 8
    return config


@pytest.fixture(scope="module")
def tiny_train_step():
    config = tiny_config()
    mesh = preflight.tpu_mesh("v5e:2x2", config.mesh)
    return config, mesh, preflight.compile_step(config, mesh, "train")


@pytest.mark.needs("libtpu")
def test_tiny_train_step_compiles_for_v5e_with_the_pallas_kernel_in_mosaic(tiny_train_step):
    config, mesh, step = tiny_train_step
    assert mesh.devices.size == 4 and mesh.devices.flat[0].device_kind == "TPU v5 lite"
    hlo = step.hlo_text
    # Traced for the TPU (interpret mode off, whatever the host): the gated flash kernel as
    # Mosaic custom calls (forward, its recomputation under full remat, dq and dk/dv: one
    # scanned block), and no CPU interpreter (host callbacks) anywhere.
    assert step.mosaic_kernels == 4, step.mosaic_kernels
    assert "callback" not in hlo.lower()


@pytest.mark.needs("libtpu")
def test_compiler_memory_and_flops_match_hand_counts(tiny_train_step):
    config, mesh, step = tiny_train_step
    cfg = run_config.model_config(config)
    # Arguments: float32 weights + two AdamW moments (replicated over data=4), the step
    # counter, and this device's quarter of the 5 int32 [8, 256] batch arrays.
    params = memory.parameter_bytes(cfg, dict(mesh.shape))
    assert params == 4 * 2 * (128 * 128 * 4 + 128 * 384 * 3 + 2 * 128 + 2 * 32) + 4 * (
        1024 * 128 + 128)  # q,k,v(GQA 2 of 4 heads),o,gate = 4 of D x 128; 3 FFN; 4 norms
    batch = 5 * (8 // 4) * 256 * 4
    assert math.isclose(step.memory["arguments"], 3 * params + 4 + batch, rel_tol=0.01)
    assert step.memory["aliased"] >= 3 * params  # the donated state is updated in place
    # FLOPs: XLA's cost analysis counts a loop body once: the scanned layers count as one
    # layer. Per token: 6 x the tied embedding/head matmul, plus 8 x one layer's matmul
    # weights (6 for forward and backward, 2 for remat's second forward).
    layer_weights = 128 * 128 * 4 + 128 * 384 * 3
    head = 1024 * 128
    dense = (6 * head + 8 * layer_weights) * 8 * 256
    # The Mosaic kernels count through their cost estimates: per causal (query, key) pair of
    # 8 rows x 4 heads, 2 x head_dim 32 FLOPs per matmul; 2 matmuls in each of the two
    # forwards (the second under remat), 3 in dq, 4 in dk/dv.
    pairs = 8 * 4 * 256 * 257 // 2
    attention = (2 + 2 + 3 + 4) * 2 * 32 * pairs
    assert math.isclose(step.flops * mesh.devices.size, dense + attention, rel_tol=0.03)
    assert not math.isclose(step.flops * mesh.devices.size, dense, rel_tol=0.03)


@pytest.mark.needs("libtpu")
def test_report_dump_and_verdict(tiny_train_step, tmp_path, monkeypatch):
    config, _, step = tiny_train_step
    monkeypatch.setattr(preflight, "compile_step", lambda *a, **k: step)
    tpu = parse_accelerator("v5litepod-4")
    info = preflight.preflight(config, tpu, ("train",), dump_hlo=tmp_path / "hlo")
    train = info["steps"]["train"]
    assert info["fits"] and train["headroom"] == 16 * 2**30 - step.memory["total"]
    assert (tmp_path / "hlo" / "train_step.hlo.txt").read_text() == step.hlo_text
    json.dumps(info)  # --json prints it
    text = preflight.format_report(info)
    assert "v5e:2x2" in text and text.endswith("=> fits on v5litepod-4")
    # An existing dump is never overwritten.
    with pytest.raises(ValueError, match="train_step.hlo.txt exists"):
        preflight.preflight(config, tpu, ("train",), dump_hlo=tmp_path / "hlo")
    # The same program on a chip with 1 MiB of HBM does not fit.
    small = dataclasses.replace(tpu, generation=dataclasses.replace(tpu.generation,
                                                                      hbm_bytes=2**20))
    refused = preflight.preflight(config, small, ("train",))
    assert not refused["fits"] and "does NOT fit" in preflight.format_report(refused)
    # ... and says what would shrink it: the weights over the 4 data-parallel chips, half
    # the sequences per micro-batch (remat is already full), a larger slice.
    assert preflight.format_report(refused).splitlines()[-1] == (
        "to fit: weights sharded over the data-parallel devices too (--config.mesh.data=1 "
        "--config.mesh.fsdp=4); fewer sequences per micro-batch (--config.train.grad_accum=2 "
        "or more; 8 now); a larger slice (--accelerator)")
    # A program the compiler refuses for memory is a "does not fit", not a crash.
    def out_of_memory(*args, **kwargs):
        raise jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the "
                                         "total memory required ... (599.83G) exceeds ...")

    monkeypatch.setattr(preflight, "compile_step", out_of_memory)
    oom = preflight.preflight(config, tpu, ("train", "eval"))
    assert not oom["fits"] and "(599.83G)" in oom["steps"]["eval"]["compiler_error"]
    assert "train step: refused by the compiler: RESOURCE_EXHAUSTED" in \
        preflight.format_report(oom)
    monkeypatch.setattr(preflight, "compile_step", lambda *a, **k: step)
    # inspect --mesh --accelerator shows the compiler's figure next to the estimate. Its
    # compile is the fixture's program (the same config on the same v5e:2x2 mesh): handed the
    # fixture's step instead of compiling it a second time (13 of this file's 29 CPU-s).
    asked = []

    def devices(mesh):
        return dict(mesh.shape), [(d.id, d.device_kind) for d in mesh.devices.flat]

    def same_program(config_, mesh_, name, **kwargs):
        asked.append((config_.to_dict(), devices(mesh_), name, kwargs))
        return step

    monkeypatch.setattr(target_compile, "compile_step", same_program)
    section = memory.report(config, "", None, accelerator="v5litepod-4")
    mesh = tiny_train_step[1]
    assert asked == [(config.to_dict(), devices(mesh), "train", {})]
    assert section["compiled_train_step"]["total"] == step.memory["total"]
    assert section["mesh"]["data"] == 4


def _preflight_cli(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT
                   ) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "gated_attention.preflight", *args],
                          capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, **(env or {})})


TINY_SYNTHETIC = ("--config=configs/ablation.py:arch=tiny", "--config.data.source=synthetic")


def _hidden_libtpu(folder: Path) -> dict[str, str]:
    """An environment in which `import libtpu` fails, as where it was never installed."""
    (folder / "libtpu").mkdir()
    (folder / "libtpu" / "__init__.py").write_text("raise ImportError('not installed')\n")
    return {"PYTHONPATH": f"{folder}:{ROOT}"}


@pytest.mark.slow  # one process (jax and the config): about 10 s on the shared host
@pytest.mark.reference("error_message")
def test_a_tpu_target_without_libtpu_is_one_line_naming_what_to_install(tmp_path):
    result = _preflight_cli(*TINY_SYNTHETIC, "--accelerator=v5p-8", env=_hidden_libtpu(tmp_path))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "Pre-flight error: compiling for a TPU needs libtpu, which is not installed: "
        f"`make install-test` installs it, or pip install 'jax[tpu]=={jax.__version__}' (no "
        "TPU needed)")


@pytest.mark.slow  # one process (jax and the config): about 10 s on the shared host
@pytest.mark.reference("error_message")
def test_a_gpu_target_without_the_cuda_compile_pair_is_one_line_naming_it(tmp_path):
    empty = tmp_path / "no_cuda_compile"
    empty.mkdir()
    result = _preflight_cli(*TINY_SYNTHETIC, "--accelerator=h200-8",
                            env={"GATED_ATTENTION_CUDA_COMPILE": str(empty)})
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("Pre-flight error: compiling for an NVIDIA GPU needs the CUDA "
                           "compile pair, which is not installed: `make install-test` installs "
                           f"it, or pip install --no-deps --target {empty} jax-cuda12-plugin=="
                           f"{jax.__version__} jax-cuda12-pjrt=={jax.__version__} "), last


def documented_preflights() -> list[tuple[str, str]]:
    """(document, command) of every pre-flight command in README.md and docs/*.md bash blocks,
    continuation lines joined, a trailing pipe dropped."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_docs import DOCUMENTS, fenced_blocks

    found = []
    for doc in DOCUMENTS:
        for _, info, body in fenced_blocks(doc.read_text()):
            if info.split()[:1] != ["bash"]:
                continue
            for line in body.replace("\\\n", " ").splitlines():
                if "gated_attention.preflight" in line:
                    command = line.split(" | ")[0].strip()
                    found.append((str(doc.relative_to(ROOT)), " ".join(command.split())))
    return found


def test_the_documents_have_preflight_commands():
    documents = {doc for doc, _ in documented_preflights()}
    assert {"README.md", "docs/preflight.md", "docs/gpu_clusters.md"} <= documents


@pytest.mark.slow  # one process per command (jax, the config, the target's devices)
@pytest.mark.needs("libtpu", "jax_plugins.xla_cuda12")
@pytest.mark.reference("smoke")
@pytest.mark.parametrize("document,command", documented_preflights(),
                         ids=[f"{d}:{i}" for i, (d, _) in enumerate(documented_preflights())])
def test_every_documented_preflight_passes_its_checks_as_printed(document, command, tmp_path):
    """Each pre-flight command of the documents, as printed, gets through every check before
    the compile (config, data, the mesh on the target's devices, the batch layout): a
    newcomer's copy of it compiles (--check_only; the verdicts are measured in the docs).
    The walk-throughs' shell variables take their documented values."""
    import os

    shell = (f"TPU_TYPE=v5p-64 variant=g1_sdpa_elementwise; "
             f"{command.replace('python ', f'{sys.executable} ', 1)} --check_only")
    result = subprocess.run(["bash", "-c", shell], capture_output=True, text=True, cwd=ROOT,
                            timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, f"{document}: {command}\n{result.stderr[-3000:]}"
    assert "=> checks passed for" in result.stdout
