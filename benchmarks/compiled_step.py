"""The compiled train step of any config for a TPU slice, per chip, on a CPU (no TPU).

    python benchmarks/compiled_step.py \
        --config=configs/ablation.py:arch=dense_1p7b_28l,variant=baseline \
        --accelerator=v5p-8 --variants=baseline,g1_sdpa_elementwise \
        --config.mesh.fsdp=4 --config.mesh.data=1 --config.train.batch_size=16 \
        --config.model.remat=full --config.model.attention_impl=splash

For each variant three programs are compiled by libtpu's XLA TPU compiler, deviceless, as the
pre-flight compiles them (gated_attention/compile/target.py: `main`'s own train step):

- the step as configured (scanned layers if the config scans): per-chip memory (arguments,
  temporaries, total) is read from it;
- the same step unrolled with 1 and with 2 layers (U1, U2), from which the FLOPs and bytes
  accessed of the full step are extrapolated, full = U1 + (L - 1) x (U2 - U1), and split
  into the layers, L x (U2 - U1), and the rest (embedding, logits, loss, optimizer update),
  U1 - (U2 - U1).

Every loop counted by its trip count: XLA's cost analysis counts a while loop's body once,
whatever its trip count (`known_trip_count` in the optimized HLO). The scanned layers are
one such loop (hence U1 and U2); the chunked loss's tiles are more: vocabulary tiles
(`train.loss_tiles=vocab`) a loop in the forward and one in the backward (19 trips each for
the 1.7B at loss_chunk_size 8192), token tiles (`tokens`) one loop in the forward, which
computes the gradient too (4096 / loss_chunk_size trips). U1 and U2 are therefore traced
with the loss's tiles unrolled (`losses.unrolled_tiles`: the same arithmetic, one tile after
another; the vocabulary tiles' backward keeps its recomputed logits by an optimisation
barrier, which the compiler would otherwise merge with the forward's), so their cost
analysis sees every tile. This is exact for FLOPs (tests/test_compiled_step.py: the
vocabulary-tiled step's FLOPs are the plain step's plus one logits matmul, the
recomputation; the token-tiled step's are the plain step's); for bytes it is the
compiler's estimate for the unrolled program, which may fuse a little differently from the
looped one (no carried copies between tiles). The benchmark then reads U1's and U2's
optimized HLO for any while loop left with a trip count above 1 (e.g. `train.grad_accum` >
1, whose micro-batch scan is not unrolled here) and reports them under "loops counted
once": where that list is not empty, the FLOPs and bytes undercount. Not counted at all: a
Pallas kernel's work (splash attention is a custom call without a cost estimate), as in any
XLA cost analysis of such a step.

GB here are 1e9 bytes. These are the compiler's figures (its memory plan and its traffic
estimate), not measurements on a TPU. --json prints the figures as JSON; --hlo_dir writes
the optimized HLO of every program compiled; --cost_only skips
the full step's compile (memory), for FLOPs and bytes alone.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

GB = 1e9
# A while instruction of the optimized HLO (its condition computation's name), and the
# scalar bound its condition compares the loop counter with.
WHILE_OP = re.compile(r" while\(.*?condition=%?([\w.\-]+)")
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
SCALAR_BOUND = re.compile(r"= s32\[\]\S* constant\((\d+)\)")
COMPUTATION = re.compile(r"^(?:ENTRY )?%(\S+) ")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (.*)$")
ARRAY_SHAPE = re.compile(r"\b([a-z]+\d*\[[\d,]*\])")
FUSION_CALL = re.compile(r"calls=%([\w.\-]+)")
OP_NAME = re.compile(r'op_name="([^"]*)"')
VIEWS = ("bitcast", "get-tuple-element", "tuple", "parameter", "constant", "copy-done")


def variant_config(config: Any, variant: str) -> Any:
    """`config` with its attention section (and label) replaced by the paper variant's."""
    from gated_attention.config import run_config

    out = copy.deepcopy(config)
    with out.unlocked():
        out.variant = variant
        out.attention = run_config.attention_section(variant)
    return out


def unrolled(config: Any, layers: int) -> Any:
    """`config` with `layers` decoder blocks run one by one (no scan)."""
    out = copy.deepcopy(config)
    with out.unlocked():
        out.model.num_layers = layers
        out.model.scan_layers = False
    return out


def loops(hlo_text: str) -> list[int]:
    """Trip counts of the while loops in an optimized HLO (0 where it cannot be read).

    From the loop's `known_trip_count` where the compiler prints one, else from its condition
    computation when that compares the counter (from 0, as jax's loops count) with one
    scalar constant, as the TPU compiler's optimized loops do."""
    counts = []
    for line in hlo_text.splitlines():
        match = WHILE_OP.search(line)
        if match is None:
            continue
        trip = TRIP_COUNT.search(line)
        if trip is None:
            start = hlo_text.find(f"\n%{match.group(1)} ")
            body = hlo_text[start:hlo_text.find("\n}", start)] if start >= 0 else ""
            bounds = SCALAR_BOUND.findall(body)
            counts.append(int(bounds[0]) if len(bounds) == 1 else 0)
        else:
            counts.append(int(trip.group(1)))
    return counts


def _computations(hlo_text: str) -> dict[str, list[str]]:
    """The optimized HLO's computations by name, each as its instruction lines."""
    out: dict[str, list[str]] = {}
    name = None
    for line in hlo_text.splitlines():
        header = COMPUTATION.match(line)
        if header and line.rstrip().endswith("{"):
            name = header.group(1)
            out[name] = []
        elif line.rstrip() == "}":  # (a kernel's attributes may span lines opening "}}")
            name = None
        elif name is not None:
            out[name].append(line)
    return out


def _result(rest: str) -> tuple[list[str], str]:
    """The array shapes an instruction produces ("f32[2,256,4,32]"; a tuple gives several)
    and its opcode, from the text after its " = "."""
    if not rest.startswith("("):
        shape, _, tail = rest.partition(" ")
        return ARRAY_SHAPE.findall(shape), tail.split("(", 1)[0]
    depth = 0
    for end, char in enumerate(rest):
        depth += (char == "(") - (char == ")")
        if depth == 0:
            return ARRAY_SHAPE.findall(rest[:end + 1]), rest[end + 1:].strip().split("(", 1)[0]
    return [], ""


def stored_arrays(hlo_text: str) -> list[tuple[str, str, str]]:
    """(instruction, shape, jax op name) of every array an unfused instruction of the
    optimized HLO writes: what the program stores in memory between its fusions
    (instructions inside a fusion's computation stay on chip; views such as bitcast and
    get-tuple-element write nothing)."""
    fused = set(FUSION_CALL.findall(hlo_text))
    out = []
    for name, lines in _computations(hlo_text).items():
        if name in fused:
            continue
        for line in lines:
            match = INSTRUCTION.match(line)
            if match is None:
                continue
            shapes, opcode = _result(match.group(2))
            if opcode in VIEWS:
                continue
            op_name = OP_NAME.search(line)
            out += [(match.group(1), shape, op_name.group(1) if op_name else "")
                    for shape in shapes]
    return out


def figures(step: Any) -> dict[str, Any]:
    """Per-chip memory, FLOPs and bytes accessed of one compiled step."""
    cost = step.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list | tuple) else cost
    memory = step.memory
    return {"arguments": memory["arguments"], "temporaries": memory["temporaries"],
            "total": memory["total"], "flops": float(cost.get("flops", 0.0)),
            "bytes": float(cost.get("bytes accessed", 0.0)),
            "compile_s": round(step.compile_seconds, 1)}


def extrapolate(one: dict[str, Any], two: dict[str, Any], layers: int) -> dict[str, Any]:
    """FLOPs and bytes of an L-layer program from its unrolled 1- and 2-layer compiles (each
    with "flops", "bytes" and "loops_counted_once"): per layer U2 - U1, the layers L times
    that, the rest U1 - (U2 - U1), the full program U1 + (L - 1)(U2 - U1)."""
    out: dict[str, Any] = {"layers": layers, "loops_counted_once": one["loops_counted_once"]
                           + two["loops_counted_once"]}
    for key in ("flops", "bytes"):
        per_layer = two[key] - one[key]
        out[key] = {"per_layer": per_layer, "layers": layers * per_layer,
                    "rest": one[key] - per_layer, "full": one[key] + (layers - 1) * per_layer}
    return out


def measure(config: Any, mesh: Any, hlo: dict[str, str] | None = None,
            cost_only: bool = False, unroll_loss: bool = True) -> dict[str, Any]:
    """The full step's memory, and its FLOPs / bytes extrapolated from U1 and U2; `hlo`, if
    given, receives each program's optimized HLO ("full", "u1", "u2"). cost_only: skip the
    full step (no memory figures); unroll_loss=False costs the looped loss as compiled (its
    tiles counted once: the undercount this module corrects)."""
    from gated_attention.compile.target import compile_step
    from gated_attention.config import run_config
    from gated_attention.training import losses

    layers = run_config.model_config(config).num_layers
    programs = {}
    todo = [("u1", unrolled(config, 1)), ("u2", unrolled(config, 2))]
    if not cost_only:
        todo.insert(0, ("full_compile", config))
    for name, one_config in todo:
        costed = name != "full_compile" and unroll_loss
        with losses.unrolled_tiles() if costed else contextlib.nullcontext():
            step = compile_step(one_config, mesh, "train")
        programs[name] = figures(step)
        if name != "full_compile":
            programs[name]["loops_counted_once"] = [n for n in loops(step.hlo_text) if n != 1]
        print(f"compiled {config.variant} {name}: {programs[name]}", file=sys.stderr,
              flush=True)
        if hlo is not None:
            hlo[name.removesuffix("_compile")] = step.hlo_text
    out: dict[str, Any] = {**programs, **extrapolate(programs["u1"], programs["u2"], layers)}
    if not cost_only:
        full = programs["full_compile"]
        out["memory"] = {k: full[k] for k in ("arguments", "temporaries", "total")}
    return out


def format_table(results: dict[str, dict[str, Any]]) -> str:
    names = list(results)
    rows: list[tuple[str, ...]] = [("per chip", *names)]
    has_memory = all("memory" in results[n] for n in names)
    for key in ("total", "temporaries", "arguments") if has_memory else ():
        rows.append((f"{key} memory (GB)",
                     *(f"{results[n]['memory'][key] / GB:.3f}" for n in names)))
    for key, label, scale, fmt in (("flops", "FLOPs", 1.0, "{:.4g}"),
                                   ("bytes", "bytes accessed (GB)", GB, "{:.4g}")):
        for part in ("full", "layers", "rest", "per_layer"):
            rows.append((f"{label}, {part.replace('_', ' ')}",
                         *(fmt.format(results[n][key][part] / scale) for n in names)))
    rows.append(("loops counted once (trips)", *(
        ", ".join(map(str, results[n]["loops_counted_once"])) or "none" for n in names)))
    rows.append(("compile s (full, U1, U2)", *(
        ", ".join(str(results[n][p]["compile_s"]) if p in results[n] else "-"
                  for p in ("full_compile", "u1", "u2")) for n in names)))
    if len(names) > 1:
        base = results[names[0]]
        for n in names[1:]:
            ratio = [f"{results[n]['bytes']['full'] / base['bytes']['full']:.3f}",
                     f"{results[n]['flops']['full'] / base['flops']['full']:.3f}"]
            label = "bytes, FLOPs"
            if has_memory:
                ratio.insert(0, f"{results[n]['memory']['total'] / base['memory']['total']:.3f}")
                label = "total, " + label
            rows.append((f"{n} / {names[0]}: {label}", *([""] * (len(names) - 1)),
                         ", ".join(ratio)))
    width = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(r, width))) for r in rows)


def run(config: Any, accelerator: str, variants: list[str], cost_only: bool = False,
        hlo_dir: str = "") -> dict[str, Any]:
    from gated_attention.compile.preflight import parse_target, tpu_mesh
    from gated_attention.config import run_config

    target = parse_target(accelerator)
    mesh = tpu_mesh(target.topology, config.mesh)
    results = {}
    for variant in variants:
        one = variant_config(config, variant)
        run_config.validate_run_config(one)
        hlo: dict[str, str] = {}
        results[variant] = measure(one, mesh, hlo, cost_only=cost_only)
        if hlo_dir:
            Path(hlo_dir).mkdir(parents=True, exist_ok=True)
            for name, text in hlo.items():
                (Path(hlo_dir) / f"{variant}.{name}.hlo.txt").write_text(text)
    return results


def main(argv: list[str]) -> None:
    import jax
    from absl import flags

    from gated_attention.compile import gpu_targets
    from gated_attention.config import run_config

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        sys.exit(f"unexpected arguments: {' '.join(argv[1:])}")
    variants = [v for v in FLAGS.variants.split(",") if v] or [FLAGS.config.variant]
    try:
        for v in variants:
            run_config.attention_section(v)
        if gpu_targets.is_gpu_accelerator(FLAGS.accelerator):
            raise run_config.ConfigError(f"--accelerator={FLAGS.accelerator}: this benchmark "
                                         "compiles for TPU slices (XLA:GPU has no cost analysis)")
        results = run(FLAGS.config, FLAGS.accelerator, variants, FLAGS.cost_only,
                      FLAGS.hlo_dir)
    except (run_config.ConfigError, ValueError) as err:
        sys.exit(f"compiled_step error: {err}")
    config = FLAGS.config
    header = (f"{config.arch} on {FLAGS.accelerator}, batch {config.train.batch_size} x "
              f"{config.data.seq_len}, mesh {dict(config.mesh)}, remat {config.model.remat}, "
              f"scan_layers {config.model.scan_layers}, attention "
              f"{config.model.attention_impl}, loss_chunk_size "
              f"{config.train.get('loss_chunk_size', 0)} over "
              f"{config.train.get('loss_tiles', 'vocab')}; jax {jax.__version__}, libtpu "
              f"{version('libtpu')}")
    if FLAGS.json:
        print(json.dumps({"setting": header, "variants": results}, indent=2))
        return
    print(header)
    print(format_table(results))

if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    import jax

    jax.config.update("jax_platforms", "cpu")
    from absl import app, flags
    from ml_collections import config_flags

    from gated_attention.preflight import parse_flags

    config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                    "configs/ablation.py:arch=tiny,variant=baseline",
                                    lock_config=True)
    flags.DEFINE_string("accelerator", "v5p-8", "Cloud TPU type (v5p-8, v5litepod-8, ...).")
    flags.DEFINE_string("variants", "", "Comma-separated variants compiled side by side "
                        "(default: the config's).")
    flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
    flags.DEFINE_bool("cost_only", False, "Compile only U1 and U2 (FLOPs and bytes; no memory).")
    flags.DEFINE_string("hlo_dir", "", "Write each program's optimized HLO here "
                        "(<variant>.<full|u1|u2>.hlo.txt).")
    flags.mark_flags_as_required(["config"])
    app.run(main, flags_parser=parse_flags)
