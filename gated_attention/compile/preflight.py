"""Pre-flight: compile a run's train and eval steps for a TPU slice or GPU nodes on any CPU.

    python -m gated_attention.preflight \
        --config=configs/ablation.py:arch=dense_1p7b_28l,variant=g1_sdpa_elementwise \
        --accelerator=v5p-64 [--config.mesh.fsdp=32 ...] [--json] [--dump_hlo=DIR]
    # 2 slices joined by the data-centre network, data parallel across them:
    python -m gated_attention.preflight ... --accelerator=v5p-64 --slices=2 \
        --config.mesh.dcn_data=2
    python -m gated_attention.preflight --config=... --accelerator=h200-8 [--hosts=2]
    # before any data exist: random ids in the run's shapes; every check, nothing compiled:
    python -m gated_attention.preflight ... --config.data.source=synthetic [--check_only]

The steps are the ones `main` runs (step.train_state_spec, make_train_step, jit_train_step,
make_eval_step: same functions, same shardings), traced inside `compiling_for("tpu")` so the
attention kernel and its interpret mode are chosen for the TPU, and compiled by libtpu's real
XLA TPU compiler (and Mosaic, for Pallas kernels) for a deviceless topology. The compiler's
own figures are printed per chip: argument, output, temporary and total bytes against the
chip's HBM, whether it fits, FLOPs next to the model's 6N + attention count, compile time.
XLA's cost analysis counts a loop body once, and a Pallas kernel by its cost estimate only:
with scanned layers or gradient accumulation the compiled FLOPs are those of one layer / one
micro-batch; this project's kernels carry estimates, jax's splash kernel does not.

GPU nodes (h100-8, h200-8, b200-8, a100-80gb-8; gpu_targets.py) compile through XLA:GPU
(the CUDA compile pair, no GPU): Triton kernels down to a cubin. XLA:GPU neither refuses a
program larger than the GPU nor has a cost analysis: the fit is judged here against jax's
allocator share of the GPU's memory, and the FLOPs are XLA's HLO count of the plain ops
(custom-call kernels count 0), which the report says, next to the model's count.

With train.telemetry_every > 0 the telemetry function (gated_attention/training/telemetry.py) is
compiled too, as `loop.run` jits it (same parameter and batch shardings, under the mesh), and
judged like a step: its first call comes after telemetry_every steps, too late to find that
it does not compile or fit.

The data checks (documents, tokenizer, vocabulary, epochs) run first, on the config's own
data fields; with data.source=synthetic there is nothing to read, and the report's `data:`
line reminds that the real run's checks still apply. A step that does not fit ends the report
with the overrides that shrink it (memory.fit_levers).

The building blocks (tpu_mesh, gpu_mesh, compile_step) live in gated_attention/compile/target.py;
compile_telemetry is here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax  # noqa: E402

from gated_attention.compile import gpu_targets
from gated_attention.compile.target import (  # noqa: E402, F401 - building blocks, also exported
    MOSAIC_CALL,
    STEPS,
    CompiledStep,
    abstract_batch,
    compile_step,
    gpu_devices,
    gpu_mesh,
    tpu_devices,
    tpu_mesh,
)
from gated_attention.compile.tpu_topologies import GiB, TpuSlice, parse_accelerator
from gated_attention.config import run_config  # noqa: E402
from gated_attention.core.errors import UserError  # noqa: E402
from gated_attention.training.run_checks import check_run  # noqa: E402

Target = TpuSlice | gpu_targets.GpuNode
TELEMETRY = "telemetry"
PREFLIGHT_STEPS = (*STEPS, TELEMETRY)  # what --steps may name


def parse_target(name: str, hosts: int | None = None) -> Target:
    """A GPU node name (h200-8, with `hosts` nodes) or a Cloud TPU type (v5p-64)."""
    if gpu_targets.is_gpu_accelerator(name) or name.strip().split("-")[0] in gpu_targets.GPUS:
        return gpu_targets.parse_accelerator(name, 1 if hosts is None else hosts)
    if hosts not in (None, 1):
        raise UserError(f"--hosts={hosts} applies to GPU nodes ("
                        f"{', '.join(gpu_targets.known_accelerators())}); a TPU type "
                        "already names its hosts")
    try:
        return parse_accelerator(name)
    except ValueError as err:
        raise UserError(f"{err}; GPU nodes: {', '.join(gpu_targets.known_accelerators())}") \
            from None


def steps_main_runs(config: Any) -> tuple[str, ...]:
    """The train step, the eval step unless the run never evaluates (eval_every = 0), and the
    telemetry function unless it is off (telemetry_every = 0)."""
    evaluates = config.train.eval_every > 0 and config.train.eval_batches > 0
    telemetry = config.train.get("telemetry_every", 0) > 0
    return ("train", *(("eval",) if evaluates else ()), *((TELEMETRY,) if telemetry else ()))


def compile_telemetry(config: Any, mesh: Any, platform: str = "tpu",
                      batch: Mapping[str, Any] | None = None) -> CompiledStep:
    """The telemetry function compiled for `mesh`'s devices as `loop.run` jits it (the
    parameters' shardings, the batch split as the train step's, traced under the mesh and the
    logical rules), so a run cannot first fail at step telemetry_every.

    batch: abstract arrays (default: the training batch, packed rows, as abstract_batch)."""
    from gated_attention.ops.target import compiling_for
    from gated_attention.parallel import sharding
    from gated_attention.training import step as step_lib
    from gated_attention.training import telemetry

    rules = sharding.rules_from_config(config.get("mesh"))
    step_lib.check_batch_layout(config, mesh, rules)
    with compiling_for(platform, device_kind=mesh.devices.flat[0].device_kind):
        spec = step_lib.train_state_spec(config, mesh)
        batch = abstract_batch(config, mesh, rules) if batch is None else batch
        start, cpu_start = time.perf_counter(), time.process_time()
        jitted = step_lib.jit_on_params_and_batch(
            telemetry.make_telemetry_fn(spec.graphdef, config), mesh, spec.shardings["params"],
            rules)
        compiled = jitted.lower(spec.abstract["params"], batch).compile()
    return CompiledStep(TELEMETRY, compiled, time.perf_counter() - start,
                        time.process_time() - cpu_start)


def _label(name: str) -> str:
    """A column of the report: "train step", "eval step", "telemetry"."""
    return name if name == TELEMETRY else f"{name} step"


def model_flops_per_step(config: Any) -> float:
    """6 N per token plus causal attention, for a whole global batch (inspect's count)."""
    from gated_attention.model.accounting import train_flops_per_token

    cfg = run_config.model_config(config)
    return train_flops_per_token(cfg, config.data.seq_len) * (config.train.batch_size
                                                              * config.data.seq_len)


def check_slices(config: Any, num_slices: int) -> None:
    """The config's DCN mesh axes (mesh.dcn_*) must span exactly the slices compiled for."""
    from gated_attention.parallel import sharding

    if num_slices < 1:
        raise UserError(f"--slices={num_slices} must be at least 1")
    dcn = dict(zip(sharding.DCN_KEYS, sharding.dcn_shape(config.mesh)))
    spanned = math.prod(dcn.values())
    if spanned != num_slices:
        set_axes = ", ".join(f"mesh.{k}={v}" for k, v in dcn.items() if v != 1) or "none set"
        raise UserError(f"--slices={num_slices} needs mesh.dcn_* sizes that multiply to "
                        f"{num_slices} (e.g. --config.mesh.dcn_data={num_slices}); the config "
                        f"spans {spanned} slice(s) ({set_axes})")


def data_note(config: Any) -> str:
    """Which data the steps were compiled with, and what was checked of them."""
    source = config.data.source
    if source == "synthetic":
        return (f"data: synthetic (random ids of the model's {config.model.vocab_size:,}-id "
                "vocabulary, nothing read); the real run's data checks (documents, tokenizer, "
                "vocabulary, epochs) still apply: run the pre-flight with its data fields")
    return (f"data: {source}, checked before compiling (documents, tokenizer, vocabulary, "
            "epochs)")


def preflight(config: Any, tpu: Target, steps: tuple[str, ...] | None = None,
              dump_hlo: Path | None = None, num_slices: int = 1,
              check_only: bool = False) -> dict[str, Any]:
    """Compile `steps` of `config` (default: those `main` runs, steps_main_runs) for the GPU
    nodes, or for `num_slices` slices of a TPU type (their DCN mesh axes across slices); the
    report as a dict (bytes per device). check_only: every check up to the compile (config,
    data, mesh on the target's devices, batch layout), nothing compiled."""
    cfg = run_config.validate_run_config(config)
    steps = steps_main_runs(config) if steps is None else tuple(steps)
    if num_slices != 1 and isinstance(tpu, gpu_targets.GpuNode):
        raise UserError(f"--slices={num_slices} is for TPU types; GPU nodes take --hosts")
    check_slices(config, num_slices)
    check_run(config)  # documents, tokenizer, vocabulary: what the run reads before step 1
    if dump_hlo is not None:
        taken = [dump_hlo / f"{s}_step.hlo.txt" for s in steps
                 if (dump_hlo / f"{s}_step.hlo.txt").exists()]
        if taken:
            raise UserError(f"--dump_hlo: {taken[0]} exists; choose an empty folder")
    gpu = isinstance(tpu, gpu_targets.GpuNode)
    platform = "gpu" if gpu else "tpu"
    mesh = (gpu_mesh(tpu, config.mesh) if gpu
            else tpu_mesh(tpu.topology, config.mesh, num_slices))
    devices = mesh.devices.size
    chips = tpu.chips * num_slices
    hbm = tpu.hbm_bytes * chips // devices
    fraction = gpu_targets.memory_fraction() if gpu else 1.0
    budget = int(hbm * fraction)  # what a program may use: jax's allocator share on a GPU
    report: dict[str, Any] = {
        "arch": config.arch, "variant": cfg.variant.name, "accelerator": tpu.accelerator,
        "platform": platform, "topology": tpu.topology, "slices": num_slices, "chips": chips,
        "hosts": tpu.hosts if gpu else None, "devices": devices,
        "device_kind": mesh.devices.flat[0].device_kind, "hbm_per_device": hbm,
        "memory_fraction": fraction, "memory_budget_per_device": budget,
        "mesh": {k: int(v) for k, v in mesh.shape.items()},
        "batch_size": config.train.batch_size, "grad_accum": config.train.grad_accum,
        "seq_len": config.data.seq_len, "attention_impl": cfg.attention_impl,
        "remat": cfg.remat, "scan_layers": cfg.scan_layers,
        "model_flops_per_step": model_flops_per_step(config),
        "telemetry_every": config.train.get("telemetry_every", 0), "steps": {},
        "data_source": config.data.source, "data_note": data_note(config),
    }
    if TELEMETRY in steps:
        from gated_attention.training.telemetry import telemetry_rows

        report["telemetry_rows"] = telemetry_rows(config)
    if check_only:
        from gated_attention.parallel import sharding
        from gated_attention.training import step as step_lib

        step_lib.check_batch_layout(config, mesh, sharding.rules_from_config(config.get("mesh")))
        report.update(checked_only=True, fits=None)
        return report
    for name in steps:
        try:
            step = (compile_telemetry(config, mesh, platform=platform) if name == TELEMETRY
                    else compile_step(config, mesh, name, platform=platform))
        except jax.errors.JaxRuntimeError as err:  # the compiler's own "does not fit"
            if "RESOURCE_EXHAUSTED" not in str(err):
                raise
            report["steps"][name] = {"fits": False, "compiler_error": str(err).splitlines()[0]}
            continue
        flops, source = step.flops_and_source
        if flops <= 0:  # no count from the compiler: the model's, and the report says so
            flops = report["model_flops_per_step"] / devices
            source = "model (6N + attention; the compiler gave no count)"
        info = {"memory": step.memory, "flops_per_device": flops,
                "flops_per_step": flops * devices, "flops_source": source,
                "compile_seconds": round(step.compile_seconds, 2),
                "compile_cpu_seconds": round(step.compile_cpu_seconds, 2),
                "mosaic_kernels": step.mosaic_kernels, "kernels": step.kernels}
        if name != "train":  # the train state stays resident while eval or telemetry runs
            state = report["steps"].get("train", {}).get("memory", {}).get("arguments", 0)
            info["memory"]["total"] += max(0, state - info["memory"]["arguments"])
        info["fits"] = info["memory"]["total"] <= budget
        info["headroom"] = budget - info["memory"]["total"]
        report["steps"][name] = info
        if dump_hlo is not None:
            dump_hlo.mkdir(parents=True, exist_ok=True)
            (dump_hlo / f"{name}_step.hlo.txt").write_text(step.hlo_text)
    report["fits"] = all(s["fits"] for s in report["steps"].values())
    return report


def _gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / 2**20:.1f} MiB"


def format_report(info: Mapping[str, Any]) -> str:
    mesh = ",".join(f"{k}={v}" for k, v in info["mesh"].items())
    if info.get("platform") == "gpu":
        where = (f"{info['hosts']} host(s) x {info['chips'] // info['hosts']} "
                 f"{info['device_kind']}, topology {info['topology']}, "
                 f"{_gib(info['hbm_per_device'])} per GPU, of which jax's allocator takes "
                 f"{info['memory_fraction']:.0%}: {_gib(info['memory_budget_per_device'])}")
    else:
        slices = info.get("slices", 1)
        where = (f"topology {info['topology']}{f' x {slices} slices' if slices > 1 else ''}, "
                 f"{info['chips']} chips, {_gib(info['hbm_per_device'])} HBM per device")
    slices = info.get("slices", 1)
    target = f"{slices} x {info['accelerator']}" if slices > 1 else info["accelerator"]
    head = [
        f"pre-flight {info['arch']} / {info['variant']} on {target} ({where})",
        f"mesh {mesh}; batch {info['batch_size']} x {info['seq_len']}, grad_accum "
        f"{info['grad_accum']}, remat {info['remat']}, scan_layers {info['scan_layers']}, "
        f"attention {info['attention_impl']}",
    ]
    if info.get("checked_only"):
        return "\n".join(head + [info["data_note"], f"=> checks passed for {target}; nothing "
                                 "compiled (drop --check_only to compile)"])
    refused = {n: s["compiler_error"] for n, s in info["steps"].items() if "compiler_error" in s}
    head += [f"{_label(n)}: refused by the compiler: {e}" for n, e in refused.items()]
    steps = {n: s for n, s in info["steps"].items() if n not in refused}
    rows: list[tuple[str, ...]] = [("per device", *(_label(s) for s in steps))]

    def row(label: str, fn: Any) -> None:
        rows.append((label, *(fn(s) for s in steps.values())))

    for key in ("arguments", "outputs", "aliased", "temporaries", "total"):
        row(f"  {key}", lambda s, k=key: _gib(s["memory"][k]))
    if TELEMETRY in steps and "telemetry_rows" in info:
        row("  rows of the global batch", lambda s: str(info["batch_size"]) if s is not
            steps.get(TELEMETRY) else str(info["telemetry_rows"]))
    row("  fits (headroom)", lambda s: ("yes" if s["fits"] else "NO")
        + f" ({_gib(s['headroom'])})")
    row("  compiled FLOPs", lambda s: f"{s['flops_per_device']:.4g}")
    row("  compiled FLOPs x devices", lambda s: f"{s['flops_per_step']:.4g}")
    if info.get("platform") == "gpu":
        row("  kernels in HLO", lambda s: ", ".join(
            f"{n} {family}" for family, n in s["kernels"].items() if n) or "none")
    else:
        row("  Mosaic kernels in HLO", lambda s: str(s["mosaic_kernels"]))
    row("  compile time (CPU time)", lambda s: f"{s['compile_seconds']:.1f} s "
        f"({s['compile_cpu_seconds']:.1f} s)")
    rows.append(("model FLOPs / step (6N + attention)",
                 f"{info['model_flops_per_step']:.4g}", *([""] * max(0, len(steps) - 1))))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    body = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                      enumerate(zip(r, width))) for r in rows]
    notes = []
    sources = sorted({s["flops_source"] for s in steps.values() if "flops_source" in s})
    if sources and sources != ["compiler"]:
        notes.append("note: compiled FLOPs from " + "; ".join(sources))
    if info["scan_layers"] or info["grad_accum"] > 1:
        kernels = ("the attention kernels are custom calls, not counted"
                   if info.get("platform") == "gpu" else "of the attention kernels only "
                   "pallas_tpu's are counted (splash has no cost estimate)")
        notes.append("note: XLA counts a loop body once: compiled FLOPs hold one layer (scanned "
                     f"blocks) and one micro-batch (grad_accum); {kernels}")
    if TELEMETRY in steps:
        from gated_attention.training.telemetry import BLOCK

        looped = (f"; its first-token pass loops over {BLOCK} x {BLOCK} (query, key) blocks, "
                  "counted once" if info["seq_len"] > BLOCK else "")
        notes.append(f"note: telemetry runs once every {info['telemetry_every']} steps{looped}")
    notes.append(info["data_note"])
    verdict = "fits" if info["fits"] else "does NOT fit"
    ending = [f"=> {verdict} on {target}"]
    if not info["fits"]:
        from gated_attention.compile.memory import fit_levers

        ending.append(fit_levers(info["mesh"], info["batch_size"], info["grad_accum"],
                                 info["remat"], more_devices="a larger slice (--accelerator)"))
    return "\n".join(head + body + notes + ending)
