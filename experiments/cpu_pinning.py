"""Which XLA:CPU settings pin a CPU run's numbers: one training, compared bit for bit.

    python -m experiments.cpu_pinning --root runs/cpu_pinning [--steps 150] [--only a,b]

XLA compiles a CPU program for the host's vector extensions, and a wider vector sums a
reduction in another order, so the same command can round differently on two kinds of x86
host; over a training's steps the last bits grow into a different F-Attn. This command trains
the sink recipe's baseline (configs/sinks.py) for `--steps` under each setting of SETTINGS (an
`XLA_FLAGS` text and a core count, the count through `taskset`), then compares every setting's
per-step training losses and the saved weights' fingerprints (the checkpoint's integrity
record: one checksum per array) with the others'. Settings whose runs agree in every bit
share a group. A finished setting is kept; a rerun only compares.

PINNED is the setting `make tables` trains with (experiments/make_tables.py), chosen from
these measurements (docs/reproducibility.md): an instruction-set limit every x86-64 host of
the last decade meets, and one compute thread, so a host's core count cannot change the order
of a sum either.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from gated_attention import cli_flags

REPO = pathlib.Path(__file__).resolve().parents[1]
ONE_THREAD = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
PINNED = f"--xla_cpu_max_isa=AVX2 {ONE_THREAD}"
# name -> (XLA_FLAGS, cores or None for all the host gives the process)
SETTINGS: dict[str, tuple[str, int | None]] = {
    "default": ("", None),
    "default-1core": ("", 1),
    "one-thread": (ONE_THREAD, None),
    "avx2": ("--xla_cpu_max_isa=AVX2", None),
    "avx2-1core": ("--xla_cpu_max_isa=AVX2", 1),
    "avx": ("--xla_cpu_max_isa=AVX", None),
    "sse4_2": ("--xla_cpu_max_isa=SSE4_2", None),
    "sse4_2-1core": ("--xla_cpu_max_isa=SSE4_2", 1),
    "no-xnnpack": ("--xla_cpu_use_xnnpack=false", None),
    "pinned": (PINNED, None),
    "pinned-1core": (PINNED, 1),
}


def train_argv(workdir: pathlib.Path, steps: int) -> list[str]:
    return [sys.executable, "-m", "gated_attention.main",
            "--config=configs/sinks.py:variant=baseline", f"--workdir={workdir}",
            f"--config.train.steps={steps}", "--config.train.eval_every=0",
            "--config.train.telemetry_every=0", f"--config.train.checkpoint_every={steps}",
            "--config.train.log_every=1", "--noprogress"]


def run_setting(root: pathlib.Path, name: str, steps: int) -> int:
    """Train one setting into root/name (kept when its record.json exists)."""
    xla_flags, cores = SETTINGS[name]
    workdir = root / name
    if (workdir / "record.json").exists():
        return 0
    if workdir.exists():
        shutil.rmtree(workdir)  # an unfinished attempt: start it again from step 0
    env = {**os.environ, "XLA_FLAGS": xla_flags}
    argv = train_argv(workdir, steps)
    if cores is not None:
        argv = ["taskset", "-c", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))[:cores]),
                *argv]
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.log", "w") as log:
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
        rows.append({**row, "group": group, "loss": run["losses"][last], "step": last,
                     "first_difference": first_difference(reference["losses"], run["losses"]),
                     "threads": run["record"]["hardware"].get("cpu_threads")})
    return rows


def markdown(rows: Sequence[Mapping[str, Any]], reference: str) -> str:
    lines = ["| setting | XLA_FLAGS | cores | loss at the last step | bit-identical group "
             f"| first step differing from `{reference}` |", "|---|---|---|---|---|---|"]
    for r in rows:
        loss = "-" if r["loss"] is None else f"{r['loss']:.10f}"
        diff = "-" if r["first_difference"] is None else str(r["first_difference"])
        lines.append(f"| {r['setting']} | `{r['xla_flags']}` | {r['cores']} | {loss} "
                     f"| {r['group']} | {diff} |")
    return "\n".join(lines)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    flags.DEFINE_string("root", "runs/cpu_pinning", "Where the runs go.", flag_values=flag_values)
    flags.DEFINE_integer("steps", 150, "Training steps per run.", flag_values=flag_values)
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
        code = run_setting(root, name, args.steps)
        print(f"{name}: exit {code}", flush=True)
    rows = compare({n: read_run(root / n, args.steps) for n in names})
    text = markdown(rows, names[0])
    (root / "comparison.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
