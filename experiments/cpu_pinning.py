"""Which XLA:CPU settings pin a CPU run's numbers: one training, compared bit for bit.

    python -m experiments.cpu_pinning --root runs/cpu_pinning [--steps 150] [--only a,b]
        [--emulate_cpu EPYC-Rome --steps 40 --warmup_steps 10]

XLA compiles a CPU program for the host's vector extensions, and a wider vector sums a
reduction in another order, so the same command can round differently on two kinds of x86
host; over a training's steps the last bits grow into a different F-Attn. This command trains
the sink recipe's baseline (configs/sinks.py) for `--steps` under each setting of SETTINGS (an
`XLA_FLAGS` text and a core count, set as the process's CPU affinity, as `taskset` does), then
compares every setting's per-step training losses and the saved weights' fingerprints (the
checkpoint's integrity record: one checksum per array) with the others'. Settings whose runs
agree in every bit share a group. A finished setting is kept; a rerun only compares.
`--emulate_cpu` runs every setting under QEMU's user-mode emulation of another CPU model
(`qemu-x86_64 -cpu help` lists them): another kind of host, on this one, about 30x slower.

PINNED and PINNED_CORES are what `make tables` trains with (experiments/make_tables.py),
chosen from these measurements (docs/reproducibility.md): XLA's code limited to AVX2, which
every x86-64 server of the last decade has; no YNNPACK kernels, library code with its own
choice of instructions; and one core, since the core count changed the numbers under every
XLA flag tried. A host then repeats itself bit for bit; an emulated AMD CPU still differed in
the last bit at step 1, so hosts stay a source of variance.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from absl import flags

from gated_attention.cli import flags as cli_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
ISA_LIMIT = "--xla_cpu_max_isa=AVX2"  # XLA's own code: vectors no wider than AVX2's
NO_YNN = "--xla_cpu_experimental_ynn_fusion_type="  # no YNNPACK kernels (they pick their own)
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false"  # Eigen's matmuls on one thread
PINNED = f"{ISA_LIMIT} {NO_YNN}"
PINNED_CORES = 1  # the thread count changed the numbers under every flag tried
# name -> (XLA_FLAGS, cores or None for all the host gives the process)
SETTINGS: dict[str, tuple[str, int | None]] = {
    "default": ("", None),
    "default-1core": ("", 1),
    "one-thread": (ONE_THREAD, None),
    "avx2": (ISA_LIMIT, None),
    "avx2-1core": (ISA_LIMIT, 1),
    "avx": ("--xla_cpu_max_isa=AVX", None),
    "sse4_2": ("--xla_cpu_max_isa=SSE4_2", None),
    "sse4_2-1core": ("--xla_cpu_max_isa=SSE4_2", 1),
    "no-ynn": (NO_YNN, None),
    "no-ynn-1core": (NO_YNN, 1),
    "pinned": (PINNED, None),
    "pinned-1core": (PINNED, PINNED_CORES),
}


@contextlib.contextmanager
def on_cores(cores: int | None) -> Iterator[None]:
    """Within the block, this thread may run on the first `cores` of its cores only, so every
    process it starts keeps to them, as under `taskset` (the CPU affinity is inherited);
    None or 0: no limit. The thread's own affinity is restored afterwards."""
    if not cores:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(sorted(before)[:cores]))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def train_argv(workdir: pathlib.Path, steps: int, warmup_steps: int) -> list[str]:
    return [sys.executable, "-m", "gated_attention.main",
            "--config=configs/sinks.py:variant=baseline", f"--workdir={workdir}",
            f"--config.train.steps={steps}", f"--config.optimizer.warmup_steps={warmup_steps}",
            "--config.train.eval_every=0",
            "--config.train.telemetry_every=0", f"--config.train.checkpoint_every={steps}",
            "--config.train.log_every=1", "--noprogress"]


def run_setting(root: pathlib.Path, name: str, steps: int, warmup_steps: int = 100,
                emulate_cpu: str = "") -> int:
    """Train one setting into root/name (kept when its record.json exists); emulate_cpu: a
    QEMU CPU model (`qemu-x86_64 -cpu help`) to run it on, as another kind of host would."""
    xla_flags, cores = SETTINGS[name]
    workdir = root / name
    if (workdir / "record.json").exists():
        return 0
    if workdir.exists():
        shutil.rmtree(workdir)  # an unfinished attempt: start it again from step 0
    env = {**os.environ, "XLA_FLAGS": xla_flags}
    argv = train_argv(workdir, steps, warmup_steps)
    if emulate_cpu:
        argv = ["qemu-x86_64", "-cpu", emulate_cpu, *argv]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.log", "w") as log, on_cores(cores):
        return subprocess.run(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                              check=False).returncode


def read_run(workdir: pathlib.Path, steps: int) -> dict[str, Any] | None:
    """Per-step training losses, the final weights' fingerprints, and the run's record."""
    record_path = workdir / "record.json"
    if not record_path.exists():
        return None
    losses = {}
    for line in (workdir / "metrics.jsonl").read_text().splitlines():
        entry = json.loads(line)
        if entry.get("kind") == "train":
            losses[int(entry["step"])] = float(entry["loss"])
    integrity = workdir / "checkpoints" / str(steps) / "integrity" / "metadata"
    return {"losses": losses, "fingerprints": json.loads(integrity.read_text())["fingerprints"],
            "record": json.loads(record_path.read_text())}


def first_difference(a: Mapping[int, float], b: Mapping[int, float]) -> int | None:
    """The first step whose loss differs in any bit; None when all agree."""
    return next((s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)), None)


def compare(runs: Mapping[str, Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per setting: its last loss, its group (runs equal in every loss and every
    weight share one) and the first step where it leaves the first setting's losses."""
    groups: list[tuple[Mapping[str, Any], str]] = []
    reference = next((r for r in runs.values() if r), None)
    rows = []
    for name, run in runs.items():
        xla_flags, cores = SETTINGS[name]
        row: dict[str, Any] = {"setting": name, "xla_flags": xla_flags or "(none)",
                               "cores": cores or "all"}
        if run is None:
            rows.append({**row, "group": "failed", "loss": None, "first_difference": None})
            continue
        key = {"losses": run["losses"], "fingerprints": run["fingerprints"]}
        group = next((g for k, g in groups if k == key), None)
        if group is None:
            group = chr(ord("A") + len(groups))
            groups.append((key, group))
        last = max(run["losses"])
        shared = set(run["losses"]) & set(reference["losses"])
        rows.append({**row, "group": group, "loss": run["losses"][last], "step": last,
                     "first_difference": first_difference(reference["losses"], run["losses"]),
                     "largest_difference": max((abs(run["losses"][s] - reference["losses"][s])
                                                for s in shared), default=None),
                     "same_weights": run["fingerprints"] == reference["fingerprints"],
                     "threads": run["record"]["hardware"].get("cpu_threads")})
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], reference: str) -> str:
    lines = ["| setting | XLA_FLAGS | cores | loss at the last step | bit-identical group "
             f"| first step differing from `{reference}` | largest loss difference from it |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = "-" if r["loss"] is None else f"{r['loss']:.10f}"
        diff = "-" if r["first_difference"] is None else str(r["first_difference"])
        largest = ("-" if r.get("largest_difference") is None else
                   "0" if r["largest_difference"] == 0 else f"{r['largest_difference']:.1e}")
        lines.append(f"| {r['setting']} | `{r['xla_flags']}` | {r['cores']} | {loss} "
                     f"| {r['group']} | {diff} | {largest} |")
    return "\n".join(lines)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    flags.DEFINE_string("root", "runs/cpu_pinning", "Where the runs go.", flag_values=flag_values)
    flags.DEFINE_integer("steps", 150, "Training steps per run.", flag_values=flag_values)
    flags.DEFINE_integer("warmup_steps", 100, "The learning rate's warm-up (the recipe's 100 "
                         "needs at least 100 steps).", flag_values=flag_values)
    flags.DEFINE_string("emulate_cpu", "", "Run every setting under qemu-x86_64 -cpu MODEL "
                        "(e.g. EPYC-Rome, Haswell): another kind of x86 host on this one.",
                        flag_values=flag_values)
    flags.DEFINE_string("only", "", "Comma-separated setting names (default: all).",
                        flag_values=flag_values)
    return flag_values


def main(argv: Sequence[str] | None = None) -> int:
    cli = cli_flags.Command("experiments.cpu_pinning", __doc__)
    args = cli.parse(define_flags(flags.FlagValues()), argv)
    names = [n for n in args.only.split(",") if n] or list(SETTINGS)
    unknown = sorted(set(names) - set(SETTINGS))
    if unknown:
        cli.error(f"--only names {unknown}; settings: {', '.join(SETTINGS)}")
    root = pathlib.Path(args.root)
    for name in names:
        code = run_setting(root, name, args.steps, args.warmup_steps, args.emulate_cpu)
        print(f"{name}: exit {code}", flush=True)
    rows = compare({n: read_run(root / n, args.steps) for n in names})
    text = markdown(rows, names[0])
    (root / "comparison.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    sys.exit(main())
