"""Grid definitions, the resumable grid runner (with stand-in commands) and the summary."""

from __future__ import annotations

import csv
import json
import pathlib
import sys

import pytest

from experiments import grid_lib, run_grid, summarize
from gated_attention.variants import VARIANTS

GRIDS = sorted(p for p in pathlib.Path(grid_lib.__file__).parent.glob("grids/*.py")
               if p.name != "__init__.py")
TABLES = grid_lib.paper_tables()

# Stand-in for gated_attention.main / analyze: records each call, fails on request, writes the
# files the real commands write (config.json; analysis/analysis.json with chosen metrics).
FAKE = r'''
import json, os, pathlib, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
workdir = pathlib.Path(args["workdir"])
with open(workdir.parent / "calls.txt", "a") as f:
    f.write(f"{sys.argv[1]} {workdir.name}\n")
if args["variant"] in os.environ.get("FAIL_VARIANTS", "").split(","):
    sys.exit(3)
workdir.mkdir(parents=True, exist_ok=True)
if sys.argv[1] == "train":
    (workdir / "config.json").write_text(json.dumps({"variant": args["variant"]}))
else:
    m = json.loads(os.environ["FAKE_METRICS"])[args["variant"]]
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


def test_runner_resumes_skips_and_survives_failures(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "fake.py"
    fake.write_text(FAKE)
    root = tmp_path / "root"
    # Ours: PPL in the paper's order; F-Attn reversed; M-Act one swap.
    metrics = {"baseline": [30.0, 0.05, 10.0, None], "g1_sdpa_elementwise": [20.0, 0.30, 2.0, 0.4],
               "g1_sdpa_headwise": [25.0, 0.20, 3.0, 0.3],
               "g2_value_elementwise": [27.0, 0.10, 1.0, 0.2]}
    monkeypatch.setenv("FAKE_METRICS", json.dumps(metrics))
    monkeypatch.setenv("FAIL_VARIANTS", "g1_sdpa_headwise")
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
    monkeypatch.setenv("FAIL_VARIANTS", "")
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


# Stand-in for main / analyze on a bucket root: the subprocess cannot see the test's fake
# bucket, so it only records the workdir it was given (in $CALLS, a local file) and prints.
FAKE_REMOTE = r"""
import os, sys
args = dict(a[2:].split("=", 1) for a in sys.argv[2:] if a.startswith("--") and "=" in a)
with open(os.environ["CALLS"], "a") as f:
    f.write(f"{sys.argv[1]} {args['workdir']}\n")
print(f"{sys.argv[1]} output of {args['variant']}")
if args["variant"] in os.environ.get("FAIL_VARIANTS", "").split(","):
    print(f"boom in {args['variant']}", file=sys.stderr)
    sys.exit(3)
"""


def _tree(folder: pathlib.Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def test_runner_on_a_bucket_root_writes_only_from_worker_0(tmp_path, fake_bucket, monkeypatch,
                                                           capsys):
    fake = tmp_path / "fake_remote.py"
    fake.write_text(FAKE_REMOTE)
    calls, spool = tmp_path / "calls.txt", tmp_path / "spool"
    monkeypatch.setenv("CALLS", str(calls))
    monkeypatch.setenv("FAIL_VARIANTS", "g1_sdpa_headwise")
    monkeypatch.delenv("GATED_ATTENTION_WORKER_ID", raising=False)
    monkeypatch.delenv("GATED_ATTENTION_MULTIHOST", raising=False)
    py = sys.executable
    argv = [str(_grid_file(tmp_path)), "--root", "gs://bucket/g", "--local_logs", str(spool),
            "--set", "train.steps=20",
            "--command", f"{py} {fake} train --workdir={{workdir}} --variant={{variant}}",
            "--analyze_command", f"{py} {fake} analyze --workdir={{workdir}} "
                                 "--variant={variant}"]
    names = ["tiny-baseline-s0", "tiny-g1_sdpa_elementwise-s0", "tiny-g1_sdpa_headwise-s0",
             "tiny-g2_value_elementwise-s0"]
    bucket = fake_bucket / "bucket" / "g"

    assert run_grid.main(argv) == 1
    # Every command got the gs:// workdir as given, in grid order (one at a time).
    expected = []
    for name in names:
        expected.append(f"train gs://bucket/g/{name}")
        if name != "tiny-g1_sdpa_headwise-s0":
            expected.append(f"analyze gs://bucket/g/{name}")
    assert calls.read_text().splitlines() == expected
    status = {p.stem: json.loads(p.read_text()) for p in (bucket / "_status").glob("*.json")}
    assert sorted(status) == names
    assert {n: s["state"] for n, s in status.items()} == {
        "tiny-baseline-s0": "done", "tiny-g1_sdpa_elementwise-s0": "done",
        "tiny-g1_sdpa_headwise-s0": "failed", "tiny-g2_value_elementwise-s0": "done"}
    failed = status["tiny-g1_sdpa_headwise-s0"]
    assert failed["error"] == "training exited with 3"
    assert failed["log_tail"].splitlines()[-2:] == ["train output of g1_sdpa_headwise",
                                                    "boom in g1_sdpa_headwise"]
    assert "--workdir=gs://bucket/g/tiny-baseline-s0" in status["tiny-baseline-s0"][
        "train_command"]
    assert sorted(json.loads((bucket / "runs.json").read_text())["runs"]) == names
    # Logs: written to the local spool while running, copied into the bucket at the end.
    logs = bucket / "_logs"
    assert sorted(p.name for p in logs.iterdir()) == sorted(
        [f"{n}.train.log" for n in names]
        + [f"{n}.analyze.log" for n in names if n != "tiny-g1_sdpa_headwise-s0"])
    log = (logs / "tiny-baseline-s0.analyze.log").read_text()
    assert log.startswith("\n### ") and log.endswith("\nanalyze output of baseline\n")
    assert log.count("### ") == 1
    local = spool / "gs_bucket_g" / "tiny-baseline-s0.analyze.log"
    assert local.read_text() == log

    # Worker 1 (from the environment, as on a pod) plans from the status files and runs
    # exactly the training commands worker 0 will run (analysis is worker 0's alone),
    # writing nothing into the root.
    before = _tree(fake_bucket)
    monkeypatch.setenv("FAIL_VARIANTS", "")
    monkeypatch.setenv("GATED_ATTENTION_WORKER_ID", "1")
    calls.unlink()
    assert run_grid.main(argv) == 0
    worker1_calls = calls.read_text().splitlines()
    assert worker1_calls == ["train gs://bucket/g/tiny-g1_sdpa_headwise-s0"]
    assert _tree(fake_bucket) == before
    assert (spool / "gs_bucket_g" / "worker1" / "tiny-g1_sdpa_headwise-s0.train.log"
            ).read_text().endswith("train output of g1_sdpa_headwise\n")
    assert "worker 1: running the same commands" in capsys.readouterr().out

    # Worker 0 again: the same training, then the analysis; the failed attempt's log is kept
    # above the new one.
    monkeypatch.delenv("GATED_ATTENTION_WORKER_ID")
    calls.unlink()
    assert run_grid.main(argv) == 0
    assert calls.read_text().splitlines() == worker1_calls + [
        "analyze gs://bucket/g/tiny-g1_sdpa_headwise-s0"]
    assert all(json.loads((bucket / "_status" / f"{n}.json").read_text())["state"] == "done"
               for n in names)
    log = (logs / "tiny-g1_sdpa_headwise-s0.train.log").read_text()
    assert log.count("### ") == 2 and log.count("train output of g1_sdpa_headwise") == 2
    assert log.index("boom in g1_sdpa_headwise") < log.rindex("### ")
    calls.unlink()
    assert run_grid.main(argv) == 0 and not calls.exists()  # all done: nothing runs

    # A pod's runs go one at a time: --parallel > 1 is refused on worker != 0 or multi-host.
    for extra, env in [(["--worker", "2"], None), ([], "1")]:
        if env:
            monkeypatch.setenv("GATED_ATTENTION_MULTIHOST", env)
        with pytest.raises(SystemExit) as exit_info:
            run_grid.main(argv + ["--parallel", "2", *extra])
        assert exit_info.value.code == 2
        assert "must run one at a time" in capsys.readouterr().err
    assert not calls.exists()


def test_log_sync_copies_each_byte_once(tmp_path, fake_bucket):
    local, remote = tmp_path / "spool" / "r.log", run_grid.paths.resolve("gs://bucket/l/r.log")
    local.parent.mkdir()
    remote_file = fake_bucket / "bucket" / "l" / "r.log"
    local.write_text("attempt 1\npart")
    run_grid._sync_log(local, remote, final=False)  # while running: whole lines only
    assert remote_file.read_text() == "attempt 1\n"
    run_grid._sync_log(local, remote)
    assert remote_file.read_text() == "attempt 1\npart"
    run_grid._sync_log(local, remote)  # nothing new: nothing copied
    with open(local, "a") as f:
        f.write("ial\nattempt 2\n")
    run_grid._sync_log(local, remote)
    assert remote_file.read_text() == "attempt 1\npartial\nattempt 2\n"
    local.write_text("new spool\n")  # spool lost (a fresh machine): appended, not replaced
    run_grid._sync_log(local, remote)
    assert remote_file.read_text() == "attempt 1\npartial\nattempt 2\nnew spool\n"


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
    # gated rows: 1 - 6 * 2 / (3 * 8) = 0.5.
    assert "- **PPL** ours: g1_sdpa_elementwise < g1_sdpa_headwise < baseline" in text
    assert text.count("Spearman rho = 1.00 over 3 rows") == 2
    assert "Spearman rho = 0.50 over 3 rows" in text
    with open(bucket / "runs.csv") as f:
        assert len(list(csv.DictReader(f))) == 6


def test_every_tiny_run_is_a_valid_config():
    """Every (arch, variant) of every grid at tiny scale resolves to a valid model config, with
    the grid's overrides applied (FFN narrowing, which traces the model, is left out)."""
    from gated_attention import config_lib

    seen = set()
    for grid in GRIDS:
        for run in grid_lib.grid_runs(grid, "tiny", (0,)):
            if (run.arch, run.variant) in seen:
                continue
            seen.add((run.arch, run.variant))
            overrides = grid_lib.run_overrides(run, "tiny")
            overrides["model.narrow_ffn_to_match_baseline"] = False
            config = config_lib.base_config(run.arch, run.variant)
            config.update_from_flattened_dict(overrides)
            cfg = config_lib.model_config(config)
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

    def telemetry(f_attn: float, step: int = 40) -> dict:  # as train.write_record stores it
        return {"step": step, "kind": "telemetry", "f_attn": f_attn, "sink_rate": 0.25,
                "m_act": 12.0, "gate_mean": 0.3, "f_attn_per_layer": [f_attn, f_attn]}

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
