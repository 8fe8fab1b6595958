"""Compile a run's train or eval step for a TPU slice or GPU nodes without either (deviceless).

The steps are the ones `loop.run` builds (train_state_spec, make_train_step, jit_train_step,
make_eval_step: same functions, same shardings), traced inside `compiling_for(platform)` so
that every platform-dependent choice (attention kernel, interpret mode, MoE matmul) is the
target's, not the host's. Used by the pre-flight command and by `inspect --accelerator`.

    mesh = tpu_mesh("v5e:2x2", config.mesh)       # a Mesh of compile-only TPU devices
    step = compile_step(config, mesh, "train")    # CompiledStep: .memory, .flops, .hlo_text

    mesh = gpu_mesh(gpu_targets.parse_accelerator("h200-8"), config.mesh)  # XLA:GPU, no GPU
    step = compile_step(config, mesh, "train", platform="gpu")
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from gated_attention.compile import cuda as cuda_compile
from gated_attention.core.errors import UserError
from gated_attention.ops.target import compiling_for
from gated_attention.parallel import distributed, sharding
from gated_attention.training import step as step_lib

STEPS = ("train", "eval")
BATCH_KEYS = ("inputs", "targets", "segment_ids", "positions", "mask")
MOSAIC_CALL = "tpu_custom_call"  # how a Pallas TPU kernel appears in the optimized HLO
MEGACORE_GENERATIONS = ("v4", "v5p")  # topology prefixes whose chips run as one device
# Kernel families by how their custom calls are named in an optimized program: Pallas TPU
# (Mosaic), Pallas GPU on Triton, cuDNN's fused attention, Pallas GPU on Mosaic GPU.
KERNEL_CALLS = {"mosaic_tpu": (MOSAIC_CALL,), "triton": ("__gpu$xla.gpu.triton",),
                "cudnn": ("__cudnn$fmha",), "mosaic_gpu": ("mosaic_gpu",)}


class CompilerNotInstalled(UserError):
    """The compiler for a target is an optional package this environment lacks: the message
    names what to install."""


# A TPU type of each generation, told to libtpu as this host's own while it describes a
# topology: on a host that is no TPU VM it otherwise looks for one (cloud metadata) and prints
# warnings about host bounds and worker hostnames. Compiles do not depend on it.
LIBTPU_HOST_TYPE = {"v4": "v4-8", "v5e": "v5litepod-4", "v5p": "v5p-8", "v6e": "v6e-4"}


def libtpu_missing() -> CompilerNotInstalled | None:
    """The one-line error for a TPU compile without libtpu, or None when it is installed."""
    try:
        import libtpu  # noqa: F401
    except ImportError:
        return CompilerNotInstalled(
            f"compiling for a TPU needs libtpu, which is not installed: `make install-test` "
            f"installs it, or pip install 'jax[tpu]=={jax.__version__}' (no TPU needed)")
    return None


def cuda_pair_missing() -> CompilerNotInstalled | None:
    """The one-line error for a GPU compile without the CUDA compile pair, or None."""
    if cuda_compile.enable():
        return None
    v = jax.__version__
    return CompilerNotInstalled(
        "compiling for an NVIDIA GPU needs the CUDA compile pair, which is not installed: "
        "`make install-test` installs it, or pip install --no-deps --target "
        f"{cuda_compile.folder()} jax-cuda12-plugin=={v} jax-cuda12-pjrt=={v} "
        "nvidia-cuda-nvcc-cu12 (no GPU needed)")


@contextlib.contextmanager
def _compile_only_host(topology: str) -> Iterator[None]:
    """libtpu's host variables set for a compile-only start (LIBTPU_HOST_TYPE) while it
    describes `topology`; those this process did not have are removed again after, so that
    processes started from it do not take themselves for workers of a pod."""
    import os

    told = {"TPU_ACCELERATOR_TYPE": LIBTPU_HOST_TYPE.get(topology.partition(":")[0], "v5p-8"),
            "TPU_WORKER_HOSTNAMES": "localhost"}
    added = [k for k in told if k not in os.environ]
    os.environ.update({k: told[k] for k in added})
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def tpu_devices(topology: str, num_slices: int = 1) -> list[Any]:
    """Compile-only devices of a TPU topology such as "v5e:2x2" or "v5p:2x2x1" (no TPU needed);
    with num_slices > 1, that many such slices joined by the data-centre network (each device
    carries its `slice_index`, as on a multislice pod).

    A one-chip slice ("v5e:1x1") is described as a one-chip host.
    """
    import os

    from jax.experimental import topologies

    if num_slices < 1:
        raise ValueError(f"num_slices={num_slices} must be at least 1")
    # Compiling takes no TPU: let several processes on this host load libtpu at once.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    single_chip = all(int(n) == 1 for n in topology.partition(":")[2].split("x"))
    extra: dict[str, Any] = {"chips_per_host_bounds": [1, 1, 1]} if single_chip else {}
    if num_slices > 1:
        extra["num_slices"] = num_slices
    missing = libtpu_missing()
    if missing is not None:
        raise missing
    try:
        with _compile_only_host(topology):
            devices = list(topologies.get_topology_desc(topology_name=topology, platform="tpu",
                                                        **extra).devices)
    except Exception as err:  # a name libtpu refuses: one line
        raise ValueError(f"cannot describe TPU topology {topology!r}"
                         f"{f' x {num_slices} slices' if num_slices > 1 else ''}: "
                         f"{str(err).splitlines()[0]}") from None
    distributed.clear_libtpu_placeholders()
    # libtpu describes v4 and v5p with one device per TensorCore; their VMs run one per chip
    # (megacore), which is what jax's meshes require: keep the first core of each chip. v2,
    # v3 (and TPU7x) run one device per core, as described.
    if topology.partition(":")[0] in MEGACORE_GENERATIONS:
        devices = [d for d in devices if getattr(d, "core_on_chip", 0) == 0]
    return devices


def tpu_mesh(topology: str, mesh_config: Mapping[str, Any], num_slices: int = 1) -> Mesh:
    """The run's mesh (config.mesh, its dcn_* axes across slices) over the compile-only
    devices of `num_slices` slices of `topology`."""
    return sharding.create_mesh(mesh_config, tpu_devices(topology, num_slices))


def gpu_devices(node: Any) -> list[Any]:
    """Compile-only devices of `node` (a gpu_targets.GpuNode), no GPU needed.

    Needs the CUDA compile pair (jax-cuda12-plugin and -pjrt pinned to jax, and a ptxas from
    nvidia-cuda-nvcc-cu12) and a process whose jax platforms are "cpu" (the plugin registers
    its compiler without a GPU only then).
    """
    from jax.experimental import topologies

    missing = cuda_pair_missing()
    if missing is not None:
        raise missing
    try:
        topology = topologies.get_topology_desc(platform="cuda", topology=node.topology,
                                                target_config=node.target_config())
    except Exception as err:  # plugin absent, or a config it refuses: one line
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"cannot describe {node.accelerator} x {node.hosts} for XLA:GPU "
                         f"({first}); `make install-test` installs jax-cuda12-plugin and "
                         "jax-cuda12-pjrt pinned to jax, and nvidia-cuda-nvcc-cu12, into "
                         f"{cuda_compile.folder()}, which this process must put on sys.path "
                         "before importing jax (gated_attention.compile.cuda.enable())") from None
    return list(topology.devices)


def gpu_mesh(node: Any, mesh_config: Mapping[str, Any]) -> Mesh:
    """The run's mesh (config.mesh) over the compile-only GPUs of `node`."""
    return sharding.create_mesh(mesh_config, gpu_devices(node))


def abstract_batch(config: Any, mesh: Mesh, rules: sharding.Rules) -> dict[str, Any]:
    """ShapeDtypeStructs of one global training batch (int32 [batch, seq_len], packed rows)."""
    shape = (config.train.batch_size, config.data.seq_len)
    placed = sharding.batch_sharding(mesh, rules)
    return {k: jax.ShapeDtypeStruct(shape, jnp.int32, sharding=placed) for k in BATCH_KEYS}


@dataclasses.dataclass
class CompiledStep:
    """One compiled step and what the compiler says about it (figures are per device)."""

    name: str
    compiled: jax.stages.Compiled
    compile_seconds: float      # wall clock: tracing, lowering and compiling
    compile_cpu_seconds: float  # CPU time of this process over the same span (all threads)

    @property
    def memory(self) -> dict[str, int]:
        stats = self.compiled.memory_analysis()
        out = {"arguments": stats.argument_size_in_bytes, "outputs": stats.output_size_in_bytes,
               "aliased": stats.alias_size_in_bytes, "temporaries": stats.temp_size_in_bytes,
               "code": stats.generated_code_size_in_bytes}
        # Donated arguments share their buffers with the outputs (aliased): count them once.
        out["total"] = (out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
                        + out["code"])
        return out

    @property
    def flops(self) -> float:
        """FLOPs per device the compiler counts (0.0 where it has no count: see flops_source)."""
        return self.flops_and_source[0]

    @property
    def flops_source(self) -> str:
        return self.flops_and_source[1]

    @functools.cached_property
    def flops_and_source(self) -> tuple[float, str]:
        """(FLOPs per device, where they come from).

        TPU: the compiler's cost analysis (Pallas kernels by their cost estimates). XLA:GPU has
        none (`cost_analysis()` is None); its HLO cost analysis is run over the optimized
        program instead, which counts plain ops and counts custom calls (Triton, cuDNN) as 0.
        """
        cost = self.compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list | tuple) else cost
        if cost and "flops" in cost:
            return float(cost["flops"]), "compiler"
        try:
            from jax._src.lib import xla_client

            cpu = jax.devices("cpu")[0].client
            modules = self.compiled.runtime_executable().hlo_modules()
            total = sum(float(xla_client._xla.hlo_module_cost_analysis(cpu, m).get("flops", 0))
                        for m in modules)
        except Exception:  # noqa: BLE001 - a private entry point: no figure rather than a crash
            return 0.0, "none"
        custom = sum(n for family, n in self.kernels.items() if family != "mosaic_tpu")
        return total, ("compiler (HLO cost analysis; custom-call kernels count 0)" if custom
                       else "compiler (HLO cost analysis)")

    @functools.cached_property
    def hlo_text(self) -> str:
        return self.compiled.as_text()

    @property
    def mosaic_kernels(self) -> int:
        """Pallas TPU kernels (Mosaic custom calls) in the optimized program."""
        return self.hlo_text.count(f"custom_call_target=\"{MOSAIC_CALL}\"")

    @functools.cached_property
    def kernels(self) -> dict[str, int]:
        """Custom-call kernels in the optimized program, by family (KERNEL_CALLS)."""
        targets = re.findall(r'custom_call_target="([^"]+)"', self.hlo_text)
        return {family: sum(any(t.startswith(p) for p in prefixes) for t in targets)
                for family, prefixes in KERNEL_CALLS.items()}


def compile_step(config: Any, mesh: Mesh, step: str = "train",
                 platform: str = "tpu") -> CompiledStep:
    """Trace `main`'s train (or eval) step for `platform` and compile it for `mesh`'s devices.

    The mesh's device kind (e.g. "NVIDIA H200") picks the kernels' tile sizes."""
    if step not in STEPS:
        raise ValueError(f"step={step!r} is not allowed; choose one of {', '.join(STEPS)}")
    rules = sharding.rules_from_config(config.get("mesh"))
    step_lib.check_batch_layout(config, mesh, rules)
    with compiling_for(platform, device_kind=mesh.devices.flat[0].device_kind):
        spec = step_lib.train_state_spec(config, mesh)
        batch = abstract_batch(config, mesh, rules)
        start, cpu_start = time.perf_counter(), time.process_time()
        if step == "train":
            jitted = step_lib.jit_train_step(step_lib.make_train_step(spec.graphdef, config),
                                             mesh, spec.shardings, rules)
            lowered = jitted.lower(spec.abstract, batch)
        else:  # as loop.run builds its eval step
            eval_jit = step_lib.jit_on_params_and_batch(
                step_lib.make_eval_step(spec.graphdef, config.train.grad_accum), mesh,
                spec.shardings["params"], rules)
            lowered = eval_jit.lower(spec.abstract["params"], batch)
        compiled = lowered.compile()
    return CompiledStep(step, compiled, time.perf_counter() - start,
                        time.process_time() - cpu_start)
