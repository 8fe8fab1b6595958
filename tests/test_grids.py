"""Grid definitions, the resumable grid runner (with stand-in commands) and the summary."""

from __future__ import annotations

import csv
import json
import pathlib
import sys

import pytest

from experiments import grid_lib, run_grid, summarize
from gated_attention.model.variants import VARIANTS

GRIDS = sorted(p for p in pathlib.Path(grid_lib.__file__).parent.glob("grids/*.py")
               if p.name != "__init__.py")
TABLES = grid_lib.paper_tables()

# Stand-in for gated_attention.main / analyze: records each call, fails on request, writes the
# files the real commands write (config.json; analysis/analysis.json with chosen metrics).
# Its settings are in fake_env.json beside it (Ray's workers do not see the test's environment).
FAKE = r'''
import json, os, pathlib, sys
env = json.loads(pathlib.Path(__file__).with_name("fake_env.json").read_text())
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
workdir = pathlib.Path(args["workdir"])
with open(workdir.parent / "calls.txt", "a") as f:
    f.write(f"{sys.argv[1]} {workdir.name}\n")
if args["variant"] in env.get("FAIL_VARIANTS", "").split(","):
    sys.exit(3)
workdir.mkdir(parents=True, exist_ok=True)
if sys.argv[1] == "train":
    (workdir / "config.json").write_text(json.dumps({"variant": args["variant"]}))
else:
    m = json.loads(env["FAKE_METRICS"])[args["variant"]]
    (workdir / "analysis").mkdir(exist_ok=True)
    (workdir / "analysis" / "analysis.json").write_text(json.dumps({
        "perplexity": m[0], "first_token_attention": m[1], "massive_activation": m[2],
        "gate_score_mean": m[3], "sink_rate": 0.0, "step": 20,
        "params": {"params_added_vs_baseline": 1000},
        "stability": {"train": {"spikes": 1, "diverged": False},
                      "final_eval": {"perplexity": m[0]}}}))
'''


@pytest.mark.parametrize("grid", GRIDS, ids=lambda p: p.stem)
def test_every_grid_loads_at_every_scale(grid):
    for scale in grid_lib.SCALES:
        runs = grid_lib.grid_runs(grid, scale, seeds=(0, 1))
        names = [r.name for r in runs]
        assert runs and len(names) == len(set(names))
        assert {r.variant for r in runs} <= set(VARIANTS)
        assert {r.seed for r in runs} == {0, 1}
        if scale == "tiny":
            assert {r.arch for r in runs} <= {"tiny", "tiny_moe", "sink_tiny", "passkey_tiny"}


def test_paper_grids_cover_every_table_row():
    by_name = {p.stem: p for p in GRIDS}
    for grid, table in [("table1", "table1_moe"), ("table3", "table3_nonlinearity"),
                        ("table4", "table4_sink_and_activation"),
                        ("table6", "table6_switch_head")]:
        variants = {r.variant for r in grid_lib.grid_runs(by_name[grid], "paper", (0,))}
        assert {row["name"] for row in TABLES[table]} <= variants, grid
    table2 = grid_lib.grid_runs(by_name["table2_lr"], "paper", (0,))
    covered = {(r.variant, dict(r.overrides)["optimizer.peak_lr"]) for r in table2}
    assert {(row["name"], row["max_lr"]) for row in TABLES["table2_dense"]} <= covered
    assert all(dict(r.overrides).get("model.narrow_ffn_to_match_baseline")
               for r in table2 if r.variant.startswith("g1_"))


def test_bad_names_are_refused():
    with pytest.raises(grid_lib.GridError, match="scale='huge'"):
        grid_lib.grid_runs(GRIDS[0], "huge", (0,))
    with pytest.raises(grid_lib.GridError, match="variant='g9'"):
        grid_lib.Run(arch="tiny", variant="g9")
    with pytest.raises(grid_lib.GridError, match="section.field=value"):
        run_grid.parse_settings(["train.steps"])
    assert run_grid.parse_settings(["train.steps=20", "data.source=files"]) == {
        "train.steps": 20, "data.source": "files"}


def _grid_file(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "grid.py"
    path.write_text(
        "from experiments.grid_lib import Run\n"
        "def runs(scale, seeds):\n"
        "    return [Run(arch='tiny', variant=v, seed=s, table='table4_sink_and_activation')\n"
        "            for v in ('baseline', 'g1_sdpa_elementwise', 'g1_sdpa_headwise',\n"
        "                      'g2_value_elementwise') for s in seeds]\n")
    return path


@pytest.fixture(scope="module")
def local_ray():
    """Ray on this machine, started once for the module (run_grid.main uses it)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.mark.slow
@pytest.mark.needs("ray")
def test_runner_resumes_skips_and_survives_failures(tmp_path, local_ray, capsys):
    fake = tmp_path / "fake.py"

    def setenv(**values):
        (tmp_path / "fake_env.json").write_text(json.dumps(values))

    fake.write_text(FAKE)
    root = tmp_path / "root"
    # Ours: PPL in the paper's order; F-Attn reversed; M-Act one swap.
    metrics = {"baseline": [30.0, 0.05, 10.0, None], "g1_sdpa_elementwise": [20.0, 0.30, 2.0, 0.4],
               "g1_sdpa_headwise": [25.0, 0.20, 3.0, 0.3],
               "g2_value_elementwise": [27.0, 0.10, 1.0, 0.2]}
    setenv(FAKE_METRICS=json.dumps(metrics), FAIL_VARIANTS="g1_sdpa_headwise")
    py = sys.executable
    argv = [str(_grid_file(tmp_path)), "--root", str(root), "--seeds", "0,1", "--parallel", "2",
            "--set", "train.steps=20",
            "--command", f"{py} {fake} train --workdir={{workdir}} --variant={{variant}} "
                         "{overrides}",
            "--analyze_command", f"{py} {fake} analyze --workdir={{workdir}} "
                                 "--variant={variant}"]
    assert run_grid.main(argv) == 1  # one variant fails, both its seeds; the rest finish
    status = {p.stem: json.loads(p.read_text()) for p in (root / "_status").glob("*.json")}
    assert len(status) == 8
    failed = {n for n, s in status.items() if s["state"] == "failed"}
    assert failed == {"tiny-g1_sdpa_headwise-s0", "tiny-g1_sdpa_headwise-s1"}
    assert status["tiny-g1_sdpa_headwise-s0"]["error"] == "training exited with 3"
    done = status["tiny-baseline-s1"]
    assert done["state"] == "done" and "--config.train.steps=20" in done["train_command"]
    assert "--config.seed=1" in done["train_command"]
    manifest = json.loads((root / "runs.json").read_text())
    assert manifest["runs"]["tiny-baseline-s0"]["overrides"]["train.steps"] == 20

    # Interrupt one finished run's analysis; fix the failing variant; run again.
    status_file = root / "_status" / "tiny-baseline-s0.json"
    interrupted = {**done, "name": "tiny-baseline-s0", "state": "analysing", "trained": True}
    interrupted["train_command"] = status["tiny-baseline-s0"]["train_command"]
    status_file.write_text(json.dumps(interrupted))
    setenv(FAKE_METRICS=json.dumps(metrics), FAIL_VARIANTS="")
    (root / "calls.txt").unlink()
    assert run_grid.main(argv) == 0
    calls = sorted((root / "calls.txt").read_text().splitlines())
    assert calls == sorted(["analyze tiny-baseline-s0",  # trained already: analysis only
                            "train tiny-g1_sdpa_headwise-s0", "analyze tiny-g1_sdpa_headwise-s0",
                            "train tiny-g1_sdpa_headwise-s1", "analyze tiny-g1_sdpa_headwise-s1"])
    (root / "calls.txt").unlink()
    assert run_grid.main(argv) == 0 and not (root / "calls.txt").exists()  # all done: skip
    # A run directory never silently changes config.
    with pytest.raises(grid_lib.GridError, match="different command"):
        run_grid.main(argv[:-4] + ["--set", "train.steps=30"] + argv[-4:])

    capsys.readouterr()
    result = summarize.summarize(root)
    groups = {g["variant"]: g for g in result["groups"]}
    assert groups["g1_sdpa_elementwise"]["seeds"] == 2
    assert groups["g1_sdpa_elementwise"]["ppl"] == 20.0
    assert groups["g1_sdpa_elementwise"]["paper_f_attn"] == 0.048  # Table 4
    assert groups["baseline"]["paper_m_act"] == 1053
    ranks = {r["metric"]: r for r in result["rankings"]}
    assert ranks["PPL"]["spearman"] == pytest.approx(1.0)  # same order as the paper
    # Paper F-Attn order: elementwise .048 < headwise .073 < value .297 < baseline .467 — ours
    # is exactly reversed.
    assert ranks["F-Attn"]["spearman"] == pytest.approx(-1.0)
    assert ranks["M-Act"]["spearman"] == pytest.approx(0.4)  # 1 - 6*6/(4*15): one far swap
    assert ranks["gate score"]["shared"] == 3
    text = (root / "summary.md").read_text()
    assert "Spearman rho = 1.00 over 4 rows" in text and "g1_sdpa_headwise" in text
    with open(root / "summary.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    with open(root / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 8


def test_a_log_copy_appends_each_byte_once(tmp_path, fake_bucket):
    """A command's log goes to the root while it runs (whole lines) and at its end (the rest);
    a second attempt's log is appended after the first's, never over it."""
    from experiments.ray_grid import LogCopy

    remote_file = fake_bucket / "bucket" / "l" / "r.log"
    remote_file.parent.mkdir(parents=True)
    remote_file.write_text("attempt 1\nsaved\n")  # an earlier attempt's log
    local = tmp_path / "spool" / "r.log"
    local.parent.mkdir()
    copy = LogCopy(local, "gs://bucket/l/r.log")
    local.write_text("attempt 2\npart")
    copy.copy(final=False)  # while running: whole lines only
    assert remote_file.read_text() == "attempt 1\nsaved\nattempt 2\n"
    copy.copy()
    copy.copy()  # nothing new: nothing copied
    with open(local, "a") as f:
        f.write("ial\n")
    copy.copy()
    assert remote_file.read_text() == "attempt 1\nsaved\nattempt 2\npartial\n"


def test_config_paths_are_recorded_relative_to_the_repository(tmp_path):
    run = run_grid.grid_lib.grid_runs("experiments/grids/smoke.py", "tiny", [0])[0]
    train_cmd, _ = run_grid.commands(run, tmp_path, "tiny", {})
    (config,) = [a for a in train_cmd if a.startswith("--config=")]
    assert config.startswith("--config=configs/ablation.py:arch=")
    # a grid recorded by an older version (absolute path of another checkout) is the same
    old = {"train_command": [a.replace("--config=configs/", "--config=/elsewhere/configs/")
                             for a in train_cmd]}
    run_grid.check_unchanged(tmp_path, run, train_cmd, old)


def test_summary_of_a_bucket_root(tmp_path, fake_bucket, capsys):
    bucket = fake_bucket / "bucket" / "s"
    # (PPL, F-Attn, M-Act): PPL and F-Attn in the paper's order, M-Act with one swap.
    metrics = {"baseline": (30.0, 0.4, 50.0), "g1_sdpa_elementwise": (20.0, 0.05, 7.0),
               "g1_sdpa_headwise": (25.0, 0.07, 5.0)}
    runs = {}
    for variant, (ppl, f_attn, m_act) in metrics.items():
        for seed, delta in [(0, -1.0), (1, 1.0)]:
            name = f"tiny-{variant}-s{seed}"
            runs[name] = {"name": name, "arch": "tiny", "variant": variant, "seed": seed,
                          "overrides": {}, "table": "table4_sink_and_activation", "paper": {},
                          "label": variant}
            (bucket / name / "analysis").mkdir(parents=True)
            (bucket / name / "analysis" / "analysis.json").write_text(json.dumps({
                "perplexity": ppl + delta, "first_token_attention": f_attn,
                "massive_activation": m_act, "gate_score_mean": None, "sink_rate": 0.0,
                "step": 20, "params": {"params_added_vs_baseline": 0},
                "stability": {"train": {"spikes": 0, "diverged": False}}}))
    (bucket / "runs.json").write_text(json.dumps({"grid": "g.py", "scale": "tiny",
                                                  "runs": runs}))
    assert summarize.main(["gs://bucket/s"]) == 0
    assert "# Grid summary: s" in capsys.readouterr().out
    with open(bucket / "summary.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert float(rows["g1_sdpa_headwise"]["ppl"]) == 25.0  # (24 + 26) / 2
    assert float(rows["g1_sdpa_headwise"]["ppl_std"]) == pytest.approx(2 ** 0.5)
    assert float(rows["baseline"]["paper_f_attn"]) == 0.467  # Table 4
    text = (bucket / "summary.md").read_text()
    # Paper PPL order elementwise < headwise < baseline is ours too (Table 4: 5.761 / 5.792 /
    # 6.026), and F-Attn's (.048 / .073 / .467); M-Act (paper 94 / 98 / 1053) swaps the two
    # gated rows: 1 - 6 * 2 / (3 * 8) = 0.5. Each row is off by the same amount at both seeds:
    # the exact sign-flip p of two equal differences is 2 / 2^2 = 0.5, so no row is ranked
    # above another (ties, within the noise).
    assert "- **PPL** ours: g1_sdpa_elementwise ≈ g1_sdpa_headwise ≈ baseline" in text
    assert text.count("Spearman rho = 1.00 over 3 rows") == 2
    assert "Spearman rho = 0.50 over 3 rows" in text
    with open(bucket / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 6


def test_every_tiny_run_is_a_valid_config():
    """Every (arch, variant) of every grid at tiny scale resolves to a valid model config, with
    the grid's overrides applied (FFN narrowing, which traces the model, is left out)."""
    from gated_attention.config import run_config

    seen = set()
    for grid in GRIDS:
        for run in grid_lib.grid_runs(grid, "tiny", (0,)):
            if (run.arch, run.variant) in seen:
                continue
            seen.add((run.arch, run.variant))
            overrides = grid_lib.run_overrides(run, "tiny")
            overrides["model.narrow_ffn_to_match_baseline"] = False
            config = run_config.base_config(run.arch, run.variant)
            config.update_from_flattened_dict(overrides)
            cfg = run_config.model_config(config)
            assert cfg.variant.name == run.variant and cfg.mlp_dim > 0


def test_a_running_run_is_counted_as_not_done_and_a_failed_one_as_failed(tmp_path):
    """The summary's seed count: done runs, then "(N failed)" for runs whose status is
    failed and "(N not done)" for those still pending or training (it had called a training
    run failed)."""
    runs = {}
    for seed, state in enumerate(("done", "failed", "training")):
        name = f"tiny-baseline-s{seed}"
        runs[name] = {"name": name, "arch": "tiny", "variant": "baseline", "seed": seed,
                      "overrides": {}, "table": "", "paper": {}, "label": "baseline"}
        (tmp_path / "_status").mkdir(exist_ok=True)
        (tmp_path / "_status" / f"{name}.json").write_text(json.dumps({"state": state}))
    (tmp_path / "tiny-baseline-s0" / "analysis").mkdir(parents=True)
    (tmp_path / "tiny-baseline-s0" / "analysis" / "analysis.json").write_text(json.dumps({
        "perplexity": 30.0, "first_token_attention": 0.4, "massive_activation": 50.0,
        "gate_score_mean": None, "sink_rate": 0.0, "step": 20,
        "params": {"params_added_vs_baseline": 0},
        "stability": {"train": {"spikes": 0, "diverged": False}}}))
    (tmp_path / "runs.json").write_text(json.dumps({"grid": "g.py", "scale": "tiny",
                                                    "runs": runs}))
    assert summarize.main([str(tmp_path)]) == 0
    text = (tmp_path / "summary.md").read_text()
    assert "| baseline (`tiny-baseline`) | 1 (1 failed) (1 not done) |" in text


def test_runs_without_analysis_take_their_sink_numbers_from_the_records_telemetry(tmp_path):
    """A grid run with --no_analyze (or whose analysis failed) still gets the baseline's sink
    check, from the last telemetry point of its record.json, and the summary says so."""
    from tests import grid_fixtures

    def telemetry(f_attn: float, step: int = 40) -> dict:  # as loop.write_record stores it
        return {"step": step, "kind": "telemetry", "f_attn": f_attn, "sink_rate": 0.25,
                "m_act": 12.0, "gate_mean": 0.3, "f_attn_per_layer": [2 * f_attn, f_attn / 2]}

    # Baseline seed 0 was analysed (0.40; its record's telemetry, 0.05, must not be used);
    # seeds 1 and 2 were not: telemetry 0.30 and 0.12 (below 3x the uniform 0.0594).
    # G1: telemetry only.
    f_attn = {"baseline": [0.40, 0.30, 0.12], "g1_sdpa_elementwise": [0.06, 0.05, 0.04]}
    runs = {}
    for variant, values in f_attn.items():
        for seed, value in enumerate(values):
            name = f"tiny-{variant}-s{seed}"
            analysed = variant == "baseline" and seed == 0
            runs[name] = grid_fixtures.write_run(
                tmp_path, name, variant=variant, seed=seed, eval_loss=3.0,
                analysis={"perplexity": 20.0, "first_token_attention": value, "sink_rate": 0.5,
                          "massive_activation": 50.0, "gate_score_mean": None, "step": 30,
                          "params": {"params_added_vs_baseline": 0}} if analysed else None)
            record_file = tmp_path / name / "record.json"
            record = json.loads(record_file.read_text())
            record["telemetry"] = telemetry(0.05 if analysed else value)
            record_file.write_text(json.dumps(record))
    grid_fixtures.write_manifest(tmp_path, runs)
    result = summarize.summarize(tmp_path)
    rows = {r["run"]: r for r in result["runs"]}
    assert rows["tiny-baseline-s0"]["f_attn"] == 0.40
    assert rows["tiny-baseline-s0"]["sink_source"] == "analysis"
    assert rows["tiny-baseline-s2"]["f_attn"] == 0.12
    assert rows["tiny-baseline-s2"]["sink_source"] == "telemetry"
    assert (rows["tiny-baseline-s2"]["sink_rate"], rows["tiny-baseline-s2"]["m_act"],
            rows["tiny-baseline-s2"]["gate"]) == (0.25, 12.0, 0.3)
    groups = {g["variant"]: g for g in result["groups"]}
    assert groups["baseline"]["f_attn"] == pytest.approx((0.40 + 0.30 + 0.12) / 3)
    assert groups["baseline"]["sink_source"] == "analysis 1, telemetry 2"
    assert groups["g1_sdpa_elementwise"]["sink_source"] == "telemetry"
    text = (tmp_path / "summary.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0].endswith("| sink from |")
    assert next(line for line in table if line.startswith("| baseline (")).endswith(
        "| analysis 1, telemetry 2 |")
    assert next(line for line in table if line.startswith("| g1_sdpa_elementwise (")).endswith(
        "| telemetry |")
    assert ("Sink numbers from training telemetry (no analysis.json): `tiny-baseline-s1` "
            "(step 40), `tiny-baseline-s2` (step 40)") in text
    # The sink check (3x uniform over 64-token rows: 3 x 0.0594 = 0.178) catches seed 2.
    assert result["sink_check"]["checked"] == 3 and result["sink_check"]["no_sink"] == [
        "tiny-baseline-s2"]
    assert "**The baseline formed no sink in 1 of 3 runs** (`tiny-baseline-s2`)" in text
    assert "`tiny-baseline-s2` 2.0x (telemetry, step 40)" in text  # 0.12 / 0.0594
    # Pairs are formed from runs measured the same way: seeds 1 and 2, not seed 0.
    paired = next(e for e in result["paired"] if e["metric"] == "f_attn")
    assert paired["seeds"] == [1, 2]
    assert paired["diff"] == pytest.approx(((0.05 - 0.30) + (0.04 - 0.12)) / 2)
    # The top layer's F-Attn (the largest per-layer value: here twice the mean) pairs alike.
    top = next(e for e in result["paired"] if e["metric"] == "f_attn_top")
    assert top["seeds"] == [1, 2]
    assert top["diff"] == pytest.approx(2 * ((0.05 - 0.30) + (0.04 - 0.12)) / 2)
    assert groups["g1_sdpa_elementwise"]["f_attn_top"] == pytest.approx(
        2 * (0.06 + 0.05 + 0.04) / 3)


def test_sink_check_judges_a_telemetry_point_against_its_own_batchs_uniform_level():
    """Packed documents restart causal rows, so the uniform level of a training batch is above
    one unbroken row's: a telemetry point carries its own (f_attn_uniform) and is judged by it.
    Hand-computed: a 64-token row's level is the mean of 1/(i+1) over queries 1..63,
    (H_64 - 1) / 63 = 0.05943."""
    from experiments import comparisons

    def row(run: str, f_attn: float, **extra) -> dict:
        return {"run": run, "state": "done", "variant": "baseline", "f_attn": f_attn, **extra}

    rows = [row("s0", 0.07, sink_source="telemetry", sink_step=1000, f_attn_uniform=0.020),
            row("s1", 0.05, sink_source="telemetry", sink_step=1000, f_attn_uniform=0.020),
            row("s2", 0.15, sink_source="analysis")]
    check = comparisons.sink_check(rows, seq_len=64)
    assert check["uniform"] == pytest.approx((sum(1 / k for k in range(1, 65)) - 1) / 63)
    assert check["ratios"]["s0"] == pytest.approx(3.5)
    assert check["ratios"]["s2"] == pytest.approx(0.15 / 0.059427, rel=1e-4)
    assert check["no_sink"] == ["s1", "s2"] and check["formed"] == 1
    text = "\n".join(comparisons.sink_check_markdown(check))
    assert "`s0` 3.5x (telemetry, step 1000, uniform 0.020)" in text
    assert "`s2` 2.5x." in text
    # Without a sequence length, runs that all carry their own level are still checked.
    assert comparisons.sink_check(rows[:2], seq_len=None)["formed"] == 1
    assert comparisons.sink_check(rows, seq_len=None) == {"checked": 0}
    # The largest layer is judged against the same level: s1's 0.05 mean hides a 0.08 layer
    # (4.0x); s0's largest is 0.05 (2.5x); s2 measured no layers and is left out.
    rows[0]["f_attn_top"], rows[1]["f_attn_top"] = 0.05, 0.08
    check = comparisons.sink_check(rows, seq_len=64)
    assert (check["checked_top"], check["formed_top"], check["no_sink_top"]) == (2, 1, ["s0"])
    assert check["ratios_top"] == {"s0": pytest.approx(2.5), "s1": pytest.approx(4.0)}
    assert ("In its largest layer (that layer's F-Attn against the same level) the baseline "
            "formed a sink in 1 of 2 runs (`s0` 2.5x, `s1` 4.0x).") in "\n".join(
                comparisons.sink_check_markdown(check))
