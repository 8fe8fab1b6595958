"""What Ray buys a grid on one machine, and how soon a run lost with its node goes on.

    python benchmarks/ray_grid.py --out /tmp/ray_grid_bench            # both measurements
    python benchmarks/ray_grid.py --out /tmp/b --skip_node_loss         # the grid only

1. Wall time of a grid of 8 tiny runs (tiny arch, 2 variants x 4 seeds, the sizes below,
   training only): run one after another, each `python -m gated_attention.main` started
   when the previous one ends (what the runner did before grids went to Ray, `--parallel 1`),
   then as `python -m experiments.run_grid --parallel 2` on Ray started on this machine.
2. Time from a node's loss to the run's resumption, on a Ray cluster of 3 one-CPU nodes on
   this machine (ray.cluster_utils.Cluster): a run is started, its trainer gets SIGTERM (it
   saves and exits 143) and its node is removed; timed until the retried trainer is running
   and until it logs "Resumed".
Prints one JSON line per measurement and the machine's load average beside each.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

from absl import flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from experiments import grid_lib, run_grid  # noqa: E402
from gated_attention.cli import flags as cli_flags  # noqa: E402
from gated_attention.core import paths  # noqa: E402

SETTINGS = ["model.num_layers=1", "model.d_model=32", "model.num_heads=2", "model.num_kv_heads=1",
            "model.head_dim=16", "model.mlp_dim=64", "model.vocab_size=260",
            "data.tokenizer='byte'", "data.seq_len=32", "train.batch_size=4",
            "train.steps=100", "train.checkpoint_every=50", "train.log_every=10",
            "train.eval_every=0", "optimizer.warmup_steps=2", "train.async_checkpoint=False"]
GRID = """
from experiments.grid_lib import Run
def runs(scale, seeds):
    return [Run(arch='tiny', variant=v, seed=s) for v in ('baseline', 'g1_sdpa_elementwise')
            for s in seeds]
"""


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    flags.DEFINE_string("out", None, "Folder for the grids' roots.", flag_values=flag_values)
    flags.DEFINE_bool("skip_node_loss", False, "Measure the grid only.", flag_values=flag_values)
    flags.DEFINE_bool("skip_grid", False, "Measure the node loss only.", flag_values=flag_values)
    flags.mark_flag_as_required("out", flag_values=flag_values)
    return flag_values


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def argv(grid: pathlib.Path, root: pathlib.Path, seeds: str, *extra: str) -> list[str]:
    out = [str(grid), "--root", str(root), "--seeds", seeds, "--no_analyze", *extra]
    for item in SETTINGS:
        out += ["--set", item]
    return out


def sequential(grid: pathlib.Path, root: pathlib.Path) -> float:
    runs = grid_lib.grid_runs(grid, "tiny", (0, 1, 2, 3))
    start = time.monotonic()
    for run in runs:
        cmd, _ = run_grid.commands(run, root, "tiny", run_grid.parse_settings(SETTINGS))
        subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def on_ray(grid: pathlib.Path, root: pathlib.Path) -> float:
    start = time.monotonic()
    subprocess.run([sys.executable, "-m", "experiments.run_grid",
                    *argv(grid, root, "0,1,2,3", "--parallel", "2")], check=True, cwd=ROOT,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - start


def node_loss(grid: pathlib.Path, out: pathlib.Path) -> dict[str, float]:
    import psutil
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for i in range(3):
        cluster.add_node(num_cpus=1, env_vars={"NODE_TAG": f"n{i}"})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    root = out / "node_loss"
    name = "tiny-baseline-s0"
    workdir = str(root / name)
    long = [s.replace("train.steps=100", "train.steps=400") for s in SETTINGS]
    cmd = [sys.executable, "-m", "experiments.run_grid", str(grid), "--root", str(root),
           "--only", name, "--no_analyze", "--ray_address", cluster.address]
    for item in long:
        cmd += ["--set", item]
    driver = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)

    def trainer():
        for p in psutil.process_iter(["cmdline"]):
            args = p.info["cmdline"] or []
            if "gated_attention.main" in args and f"--workdir={workdir}" in args:
                return p
        return None

    try:
        while trainer() is None or not (root / name / "metrics.jsonl").exists():
            time.sleep(0.2)
        victim = trainer()
        tag = victim.environ()["NODE_TAG"]
        victim.send_signal(signal.SIGTERM)
        victim.wait(timeout=120)
        lost = time.monotonic()
        node = next(n for n in cluster.worker_nodes
                    if n._ray_params.env_vars.get("NODE_TAG") == tag)
        cluster.remove_node(node)
        while trainer() is None:
            time.sleep(0.2)
        running = time.monotonic() - lost
        log = root / "_logs" / f"{name}.train.log"
        while "Resumed" not in (paths.read_current(log) if log.exists() else ""):
            time.sleep(0.5)
        resumed = time.monotonic() - lost
        driver.wait(timeout=600)
    finally:
        driver.kill()
        ray.shutdown()
        cluster.shutdown()
    return {"retried_trainer_running_s": round(running, 1),
            "resumed_logged_s": round(resumed, 1)}


def main() -> None:
    args = cli_flags.Command("benchmarks/ray_grid.py", __doc__).parse(
        define_flags(flags.FlagValues()))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    grid = out / "grid.py"
    grid.write_text(GRID)
    if not args.skip_grid:
        before = load()
        seq = sequential(grid, out / "sequential")
        ray_s = on_ray(grid, out / "ray")
        print(json.dumps({"runs": 8, "sequential_s": round(seq, 1), "ray_parallel2_s":
                          round(ray_s, 1), "load_before": before, "load_after": load()}),
              flush=True)
    if not args.skip_node_loss:
        before = load()
        print(json.dumps({**node_loss(grid, out), "load_before": before,
                          "load_after": load()}), flush=True)


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main()
