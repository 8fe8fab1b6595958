"""Block-size sweep for this project's Pallas GPU kernel with the elementwise gate (bf16, causal).

    python benchmarks/sweep_blocks.py --out runs/sweep.json             # GPU: benchmark shapes
    python benchmarks/sweep_blocks.py --small --out /tmp/sweep.json     # CPU: tiny, interpreted

Phase "fwd" times the forward for each FWD_CANDIDATES entry (block_q, block_kv, num_warps,
num_stages), backward sizes left as the table has them. Phase "fwd+bwd" fixes the forward
winner and times forward+backward for each BWD_CANDIDATES entry (the dq kernel's and the dk/dv
kernel's tiles, and the backward kernels' own num_warps_bwd/num_stages_bwd), so the two phases
tune separate knobs; the final pick is the phase-2 winner.
The first candidate of each phase is the current table entry (ops/block_sizes.py).

Every shape of one head_dim is timed per candidate (median of --iters calls after --warmup)
with the table's own harness and inputs (benchmarks/attention.py: time_forward and
time_forward_backward on the elementwise-gated rows' inputs), so a sweep's milliseconds and the
table's are the same measurement.
A candidate is ranked by the geometric mean over shapes of its time / the best time at that
shape. Only candidates that ran at every shape and whose max relative error against the XLA
reference (float32 reference on the same bf16 inputs, at CHECK_SHAPE: the output in phase 1,
the output and the gradients of q, k, v and gate in phase 2) is below MAX_ERR are ranked. A
candidate that fails to compile or run (too much shared memory, say) is recorded as failed, and
the sweep goes on. After each measurement the JSON (--out) is rewritten, so a run stopped by a
timeout keeps what it measured; --budget_s stops starting new candidates in time to pick a
winner from those measured.

The output ends with the winning dict per (device kind, head_dim) as a Python literal to paste
into ops/block_sizes.py, and the JSON holds it under "winners" (what
`benchmarks/attention.py --block_sizes=<this JSON>` reads).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
from absl import flags

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the benchmarks/ folder

import attention as bench  # noqa: E402 - benchmarks/attention.py: inputs, timing, errors

from gated_attention import ops  # noqa: E402
from gated_attention.cli import flags as cli_flags
from gated_attention.core import paths
from gated_attention.ops.block_sizes import (  # noqa: E402
    BLOCK_KEYS,
    block_sizes_for,
    device_kind_key,
)

# The table's shapes with as many kv heads as heads: B4 S4096 and B1 S16384, H16 D128.
FULL_SHAPES = tuple(s for s in bench.FULL_SHAPES if s.kv_heads == s.heads)
SMALL_SHAPES = (bench.Shape(1, 64, 2, 2, 32),)
CHECK_SHAPE = bench.Shape(1, 500, 4, 2, 128)  # a length no tile divides, GQA 2
MAX_ERR = 2e-2  # bf16 inputs and outputs: about 3e-3 for the output, up to about 6e-3 for grads
# Forward: (block_q, block_kv, num_warps, num_stages). The current table entry comes first.
FWD_CANDIDATES = ((128, 64, 4, 3), (128, 128, 8, 2), (128, 128, 8, 3), (64, 64, 4, 3),
                  (128, 32, 4, 4))
# Backward: (block_q_dq, block_kv_dq, block_q_dkv, block_kv_dkv, num_warps_bwd,
# num_stages_bwd); None keeps the table's backward warps / stages. The current entry first.
BWD_CANDIDATES = ((128, 64, 64, 128, None, None), (128, 32, 32, 128, None, None),
                  (64, 64, 64, 64, 4, 2), (128, 64, 64, 128, 8, 2),
                  (32, 32, 32, 32, None, None))
# --small (CPU, interpreted): one valid forward candidate beside the table's, one invalid on
# purpose (block 8 < the kernel's minimum 16) to exercise the failure path, one backward.
SMALL_FWD_CANDIDATES = ((16, 16, 4, 1), (8, 16, 4, 1))
SMALL_BWD_CANDIDATES = ((16, 16, 16, 16, None, None),)


def fwd_label(sizes: dict[str, int]) -> str:
    return (f"q{sizes['block_q']} kv{sizes['block_kv']} w{sizes['num_warps']} "
            f"s{sizes['num_stages']}")


def bwd_label(sizes: dict[str, int]) -> str:
    return (f"q{sizes['block_q']} kv{sizes['block_kv']} dq {sizes['block_q_dq']}x"
            f"{sizes['block_kv_dq']} dkv {sizes['block_q_dkv']}x{sizes['block_kv_dkv']} "
            f"w{sizes['num_warps']} s{sizes['num_stages']} "
            f"bwd w{sizes['num_warps_bwd']} s{sizes['num_stages_bwd']}")


def shape_label(shape: bench.Shape) -> str:
    return shape.label()


def python_literal(head_dim: int, sizes: dict[str, int]) -> str:
    """`128: dict(block_q=..., ...),` wrapped as ops/block_sizes.py writes its table."""
    first = f"{head_dim}: dict("
    items = [f"{k}={sizes[k]}" for k in BLOCK_KEYS]
    lines, line = [], first
    for i, item in enumerate(items):
        text = item + ("," if i < len(items) - 1 else "),")
        if len(line) + len(text) + 1 > 92 and line.strip() != first.strip():
            lines.append(line.rstrip())
            line = " " * len(first)
        line += text + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


def fwd_candidates(current: dict[str, int], small: bool) -> list[dict[str, int]]:
    out = [dict(current)]
    for bq, bkv, warps, stages in SMALL_FWD_CANDIDATES if small else FWD_CANDIDATES:
        cand = dict(current, block_q=bq, block_kv=bkv, num_warps=warps, num_stages=stages)
        if cand not in out:
            out.append(cand)
    return out


def bwd_candidates(current: dict[str, int], fwd_best: dict[str, int],
                   small: bool) -> list[dict[str, int]]:
    """The current entry, the forward winner as it is, then BWD_CANDIDATES on the latter."""
    out = [dict(current)]
    if fwd_best not in out:
        out.append(dict(fwd_best))
    for q_dq, kv_dq, q_dkv, kv_dkv, warps, stages in (SMALL_BWD_CANDIDATES if small
                                                      else BWD_CANDIDATES):
        cand = dict(fwd_best, block_q_dq=q_dq, block_kv_dq=kv_dq, block_q_dkv=q_dkv,
                    block_kv_dkv=kv_dkv)
        if warps is not None:
            cand.update(num_warps_bwd=warps, num_stages_bwd=stages)
        if cand not in out:
            out.append(cand)
    return out


def _kernel(sizes: dict[str, int]):
    def attn(q, k, v, gate, seg):
        return ops.attention(q, k, v, gate=gate, segment_ids=seg, impl="pallas_gpu",
                             block_sizes=sizes)
    return attn


def _forward_fn(attn, inputs: dict):
    """The forward alone, as a function of the inputs dict (output in bf16: no extra pass)."""
    del inputs

    def fn(inputs):
        return attn(*(inputs[n] for n in ("q", "k", "v", "gate", "segment_ids")))
    return fn


def _inputs(shape: bench.Shape, seed: int = 0) -> dict:
    """The check's inputs dict (q, k, v, gate, segment_ids, probe) at `shape`, G1 gate."""
    b, s, h, n, d = shape
    return bench.make_inputs(b, s, h, n, d, "elementwise", False, jnp.bfloat16, seed=seed)


GATED = bench.Impl("sweep", None, gate="elementwise")  # what the timed rows feed


def _error(phase: str, got, inputs: dict, want) -> float:
    """Max relative error of the output (fwd) or of the output and every gradient."""
    if phase == "fwd":
        return bench.rel_errors((got, {}), (want[0], {}))["out"]
    return max(bench.rel_errors(got, want).values())


def _device_alive() -> bool:
    try:
        jax.block_until_ready(jnp.arange(8.0).sum())
        return True
    except Exception:  # noqa: BLE001 - any failure here means the device is gone
        return False


class Sweep:
    """Runs both phases for one head_dim, recording rows into `self.report` as it goes."""

    def __init__(self, report: dict, out: Path | None, small: bool, warmup: int, iters: int):
        self.report, self.out, self.small = report, out, small
        self.warmup, self.iters = warmup, iters
        self.inputs: dict = {}  # shape -> inputs dict (made once)
        self.refs: dict = {}  # shape -> the reference's (out, grads)
        self.dead = ""  # non-empty: why every later candidate is skipped

    def save(self) -> None:
        if self.out is None:
            return
        paths.write_atomic(self.out, json.dumps(self.report, indent=1) + "\n")

    def inputs_for(self, shape: bench.Shape, seed: int = 0) -> dict:
        key = (shape, seed)
        if key not in self.inputs:
            self.inputs[key] = _inputs(shape, seed)
        return self.inputs[key]

    def timed_args(self, shape: bench.Shape) -> tuple:
        """The table's own inputs for the elementwise-gated rows (same harness, same data)."""
        key = (shape, "timed")
        if key not in self.inputs:
            self.inputs[key] = bench._inputs(shape, GATED)
        return self.inputs[key]

    def reference(self, inputs: dict):
        key = next(k for k, v in self.inputs.items() if v is inputs)
        if key not in self.refs:
            self.refs[key] = bench.reference_outputs_and_grads(inputs)
        return self.refs[key]

    def measure(self, phase: str, sizes: dict[str, int], current: bool, shapes, deadline: float,
                check_inputs: dict | None) -> list[dict]:
        """Time one candidate at every shape; returns its rows (already printed and saved)."""
        label = (fwd_label if phase == "fwd" else bwd_label)(sizes)
        build = _forward_fn if phase == "fwd" else bench.outputs_and_grads
        rows, error = [], None
        self.report["in_progress"] = f"{phase} {label}"  # names the culprit if the process dies
        self.save()
        for shape in shapes:
            row = dict(phase=phase, head_dim=shape[3], candidate=label, current=current,
                       sizes=sizes, shape=shape_label(shape), status="ok", ms=None,
                       tflops=None, error=None, compile_s=None)
            rows.append(row)
            if self.dead or time.monotonic() > deadline:
                row["status"] = f"skipped: {self.dead or 'over the time budget'}"
                continue
            if any(r["status"] != "ok" for r in rows[:-1]):
                row["status"] = "skipped: failed at an earlier shape"
                continue
            timer = bench.time_forward if phase == "fwd" else bench.time_forward_backward
            try:
                start = time.monotonic()
                _, seconds = timer(_kernel(sizes), self.timed_args(shape), self.warmup,
                                   self.iters)
                row["compile_s"] = round(max(0.0, time.monotonic() - start - seconds * (
                    self.warmup + self.iters)), 2)
                if error is None:  # --small: the check runs at the timed shape
                    inputs = check_inputs or self.inputs_for(shape)
                    check = bench._compile(build(_kernel(sizes), inputs), inputs)
                    error = _error(phase, check(inputs), inputs, self.reference(inputs))
            except Exception as exc:  # noqa: BLE001 - a failing candidate must not stop the sweep
                row["status"] = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
                if not _device_alive():
                    self.dead = f"device unusable after {label} failed"
                continue
            flops = bench.causal_flops(shape) * (1.0 if phase == "fwd" else 3.5)
            row.update(ms=float(f"{seconds * 1e3:.4g}"),
                       tflops=float(f"{flops / seconds / 1e12:.4g}"))
        self.report.pop("in_progress", None)
        for row in rows:
            row["error"] = error
            if row["status"] == "ok" and error is not None and not error < MAX_ERR:
                row["status"] = f"wrong: error {error:.1e} >= {MAX_ERR:g}"
            self.report["results"].append(row)
            print(format_row(row), flush=True)
        self.save()
        return rows

    def run_phase(self, phase: str, candidates, current: dict[str, int], shapes,
                  deadline: float, check_inputs: dict | None):
        """Measure every candidate; returns (winner's sizes, its rows), or (None, None)."""
        measured = []
        for sizes in candidates:
            measured.append((sizes, self.measure(phase, sizes, sizes == current, shapes,
                                                 deadline, check_inputs)))
        ok = [(sizes, rows) for sizes, rows in measured if all(r["status"] == "ok" for r in rows)]
        if not ok:
            return None, None
        best_ms = [min(rows[i]["ms"] for _, rows in ok) for i in range(len(shapes))]

        def score(item):
            _, rows = item
            return math.exp(sum(math.log(r["ms"] / b) for r, b in zip(rows, best_ms))
                            / len(rows))

        return min(ok, key=score)


def format_row(r: dict) -> str:
    ms = "-" if r["ms"] is None else f"{r['ms']:.3f}"
    tf = "-" if r["tflops"] is None else f"{r['tflops']:.4g}"
    err = "-" if r["error"] is None else f"{r['error']:.1e}"
    name = r["candidate"] + (" (current)" if r["current"] else "")
    return f"| {r['phase']} | {name} | {r['shape']} | {ms} | {tf} | {err} | {r['status']} |"


TABLE_HEADER = ("| phase | candidate | shape | ms | TFLOP/s | max rel err vs XLA | status |\n|"
                + "---|" * 7)


def sweep(shapes, small: bool, warmup: int, iters: int, budget_s: float | None,
          out: Path | None, kind: str | None = None) -> dict:
    """Both phases for every head_dim among `shapes`; returns the report (also in `out`)."""
    device = jax.devices()[0]
    kind = kind or device_kind_key(device)
    report = dict(device_kind=device.device_kind, table_key=kind,
                  platform=jax.default_backend(), jax=jax.__version__, small=small,
                  dtype="bfloat16", gate="elementwise", causal=True, warmup=warmup, iters=iters,
                  max_err=MAX_ERR, shapes=[shape_label(s) for s in shapes],
                  check_shape=None if small else CHECK_SHAPE.label() + " (GQA)",
                  results=[], winners={kind: {}}, summary={}, literals={})
    runner = Sweep(report, out, small, warmup, iters)
    runner.save()
    start = time.monotonic()
    head_dims = sorted({s.head_dim for s in shapes})
    print(f"# sweep: {device.device_kind} ({report['platform']}, table key {kind!r}), jax "
          f"{jax.__version__}; bf16, causal, elementwise gate; median of {iters} after "
          f"{warmup} warm-up; " + (f"budget {budget_s:g} s" if budget_s else "no time budget"))
    print(TABLE_HEADER, flush=True)
    for n, d in enumerate(head_dims):
        group = [s for s in shapes if s.head_dim == d]
        share = None if budget_s is None else budget_s * (n + 1) / len(head_dims)
        group_start = time.monotonic() - start
        fwd_deadline = math.inf if share is None else start + group_start + 0.45 * (
            share - group_start)
        end = math.inf if share is None else start + share
        check = None if small else runner.inputs_for(CHECK_SHAPE._replace(head_dim=d), seed=1)
        current = block_sizes_for(d, kind=kind)
        fwd_best, _ = runner.run_phase("fwd", fwd_candidates(current, small), current, group,
                                       fwd_deadline, check)
        if fwd_best is None:
            print(f"# head_dim {d}: no forward candidate ran correctly; backward phase skipped")
            report["summary"][str(d)] = dict(fwd_winner=None, winner=None)
            runner.save()
            continue
        best, rows = runner.run_phase("fwd+bwd", bwd_candidates(current, fwd_best, small),
                                      current, group, end, check)
        summary = dict(fwd_winner=fwd_label(fwd_best), winner=None)
        if best is not None:
            currents = [r for r in report["results"] if r["phase"] == "fwd+bwd"
                        and r["head_dim"] == d and r["current"]]
            summary.update(winner=bwd_label(best), sizes=best, fwd_bwd_ms={
                r["shape"]: r["ms"] for r in rows}, fwd_bwd_tflops={
                r["shape"]: r["tflops"] for r in rows}, speedup_vs_current={
                c["shape"]: (round(c["ms"] / r["ms"], 3) if c["ms"] else None)
                for c, r in zip(currents, rows)})
            report["winners"][kind][str(d)] = best
            report["literals"][str(d)] = python_literal(d, best)
        report["summary"][str(d)] = summary
        runner.save()
    report["elapsed_s"] = round(time.monotonic() - start, 1)
    runner.save()
    print_summary(report)
    return report


def print_summary(report: dict) -> None:
    kind = report["table_key"]
    print(f"\n# winners for {kind} (sweep took {report['elapsed_s']} s)")
    for d, summary in report["summary"].items():
        if summary.get("winner") is None:
            print(f"# head_dim {d}: no winner (forward winner: {summary.get('fwd_winner')})")
            continue
        print(f"# head_dim {d}: forward winner {summary['fwd_winner']}; final {summary['winner']}"
              f"; fwd+bwd TFLOP/s {summary['fwd_bwd_tflops']}; speed-up over the current "
              f"table entry {summary['speedup_vs_current']}")
    if report["literals"]:
        print(f"# paste into gated_attention/ops/block_sizes.py (the {kind!r} row's table, "
              "keyed by head_dim):")
        for literal in report["literals"].values():
            print("\n".join("    " + line for line in literal.splitlines()))


def parse_shapes(text: str) -> tuple[bench.Shape, ...]:
    """"BxSxHxD" or "BxSxHxKVxD", comma separated."""
    shapes = []
    for item in text.split(","):
        dims = [int(x) for x in item.split("x")]
        if len(dims) == 4:
            dims.insert(3, dims[2])
        if len(dims) != 5:
            raise ValueError(f"--shapes item {item!r} must be BxSxHxD or BxSxHxKVxD")
        shapes.append(bench.Shape(*dims))
    return tuple(shapes)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The script's flags, on `flag_values` (importing the module defines none)."""
    flags.DEFINE_bool("small", False, "Tiny shape and candidates, kernels interpreted (runs on "
                      "a CPU).", flag_values=flag_values)
    flags.DEFINE_string("shapes", None, "BxSxHxD or BxSxHxKVxD[,...] (default: the table's MHA "
                        "shapes, or the tiny one).", flag_values=flag_values)
    flags.DEFINE_integer("warmup", None, "Warm-up calls (default: 1 with --small, else 2).",
                         flag_values=flag_values)
    flags.DEFINE_integer("iters", None, "Timed calls (default: 2 with --small, else 10).",
                         flag_values=flag_values)
    flags.DEFINE_float("budget_s", None, "Start no new candidate after this many seconds (per "
                       "head_dim share; 45% of it for the forward phase).",
                       flag_values=flag_values)
    flags.DEFINE_string("out", None, "JSON report, rewritten after each row.",
                        flag_values=flag_values)
    return flag_values


def main() -> None:
    args = cli_flags.Command("benchmarks/sweep_blocks.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    shapes = (parse_shapes(args.shapes) if args.shapes
              else SMALL_SHAPES if args.small else FULL_SHAPES)
    warmup = args.warmup if args.warmup is not None else (1 if args.small else 2)
    iters = args.iters if args.iters is not None else (2 if args.small else 10)
    out = Path(args.out) if args.out else None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
    report = sweep(shapes, args.small, warmup, iters, args.budget_s, out)
    sys.exit(0 if all(s.get("winner") for s in report["summary"].values()) else 1)


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
