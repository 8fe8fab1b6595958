"""Run records (gated_attention/training/run_record.py) and the tables rebuilt from them
(experiments/make_tables.py). A real run's record.json: tests/test_telemetry.py; its wall
time over a stopped and resumed run: here."""

import json
import pathlib
import subprocess
import time

import jax
import ml_collections
import numpy as np
import pytest
from scipy import stats as scipy_stats

from experiments import make_tables, summarize
from gated_attention.training import run_record
from tests import grid_fixtures


def test_code_version_is_the_checkouts_commit_and_none_outside_git(tmp_path):
    repo = pathlib.Path(__file__).resolve().parents[1]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True,
                          text=True)
    version = run_record.code_version(repo)
    if head.returncode == 0:
        assert version["commit"] == head.stdout.strip()
        assert isinstance(version["dirty"], bool)
    assert run_record.code_version(tmp_path) == {"commit": None, "dirty": None}


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t",
                           *args], capture_output=True, text=True, check=True).stdout


def _commit(repo: pathlib.Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "c")
    return _git(repo, "rev-parse", "HEAD").strip()


def _tree_of(repo: pathlib.Path, commit: str, folder: str) -> str:
    # git ls-tree's listing of the commit's root: "<mode> tree <sha>\t<name>".
    for line in _git(repo, "ls-tree", commit).splitlines():
        meta, name = line.split("\t")
        if name == folder:
            return meta.split()[2]
    raise AssertionError(folder)


@pytest.fixture
def code_repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    return repo


def test_code_version_names_the_dirty_files_and_the_training_codes_trees(code_repo):
    first = _commit(code_repo, {"gated_attention/model.py": "a = 1\n",
                                "configs/ablation.py": "b = 2\n", "docs/x.md": "x\n"})
    version = run_record.code_version(code_repo)
    assert version == {"commit": first, "dirty": False, "dirty_paths": [], "training_code": {
        "gated_attention": _tree_of(code_repo, first, "gated_attention"),
        "configs": _tree_of(code_repo, first, "configs")}}
    (code_repo / "docs" / "x.md").write_text("y\n")
    (code_repo / "configs" / "ablation.py").write_text("b = 3\n")
    (code_repo / "untracked.py").write_text("")
    version = run_record.code_version(code_repo)
    assert version["dirty"] is True
    assert version["dirty_paths"] == ["configs/ablation.py", "docs/x.md"]
    # A docs-only commit keeps both trees; a change in the package changes its tree only.
    _git(code_repo, "checkout", "-q", "--", "configs")
    docs_only = _commit(code_repo, {"docs/x.md": "z\n"})
    package = _commit(code_repo, {"gated_attention/model.py": "a = 2\n"})
    trees = [run_record.training_code_trees(c, code_repo) for c in (first, docs_only, package)]
    assert trees[0] == trees[1] and trees[2]["configs"] == trees[0]["configs"]
    assert trees[2]["gated_attention"] != trees[0]["gated_attention"]
    assert run_record.training_code_trees("0" * 40, code_repo) is None


@pytest.mark.parametrize("case, expect_one_code", [
    ("docs-only commit between the runs", True),
    ("the package changed between the runs", False),
    ("uncommitted change outside the training code", True),
    ("uncommitted change in the package", False),
    ("uncommitted change, files not recorded", None),
])
def test_runs_at_two_commits_are_one_training_code_only_where_its_trees_agree(
        code_repo, tmp_path, monkeypatch, case, expect_one_code):
    first = _commit(code_repo, {"gated_attention/model.py": "a = 1\n", "configs/c.py": "b\n",
                                "docs/x.md": "x\n"})
    files = ({"gated_attention/model.py": "a = 2\n"} if "package changed" in case
             else {"docs/x.md": "y\n"})
    second = _commit(code_repo, files)
    monkeypatch.setattr(run_record, "REPO_ROOT", code_repo)  # summarize asks git of this repo
    root = tmp_path / "grid"
    runs = {}
    for variant in ("baseline", "g1_sdpa_elementwise"):
        for seed, commit in ((0, first), (1, second)):
            name = f"sink_tiny-h2-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(root, name, variant=variant, seed=seed,
                                                 eval_loss=3.0 - 0.1 * seed)
            record_path = root / name / "record.json"
            record = json.loads(record_path.read_text())
            record["code"] = {"commit": commit, "dirty": False}  # a record without trees
            if seed == 1 and "uncommitted" in case:
                record["code"] = {"commit": commit, "dirty": True, "dirty_paths": (
                    ["gated_attention/model.py"] if "in the package" in case
                    else ["experiments/ray_grid.py"] if "outside" in case else None)}
                if record["code"]["dirty_paths"] is None:
                    del record["code"]["dirty_paths"]
            record_path.write_text(json.dumps(record))
    grid_fixtures.write_manifest(root, runs)
    block = make_tables.table_block("sinks_cpu", summarize.summarize(root), "make tables")
    assert f"at commits `{min(first, second)[:10]}`, `{max(first, second)[:10]}`" in block
    if expect_one_code:
        assert "one training code: `gated_attention/`, `configs/` the same trees at each" in block
        assert "**The runs mix" not in block
    else:
        assert "**The runs mix commits**" in block and "one training code" not in block
    if expect_one_code is None:
        assert "a record with uncommitted changes does not say which files" in block


@pytest.mark.reference("golden")
def test_host_cpu_names_the_model_and_vector_extensions_of_the_first_processor():
    cpuinfo = ("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\n"
               "model name\t: Intel(R) Xeon(R) Processor\n"
               "flags\t\t: fpu sse sse2 sse4_1 sse4_2 fma avx avx2 avx512f avx512bw amx_tile\n\n"
               "processor\t: 1\nmodel name\t: another\nflags\t\t: avx10\n")
    cpu = run_record.host_cpu(cpuinfo)
    assert cpu["model_name"] == "Intel(R) Xeon(R) Processor"
    assert (cpu["family"], cpu["model"]) == ("6", "207")
    assert cpu["vector_isa"] == ["amx_tile", "avx", "avx2", "avx512bw", "avx512f", "fma",
                                 "sse4_1", "sse4_2"]


def test_tables_are_rebuilt_from_records_with_command_commit_and_seeds(tmp_path):
    base, gated = [3.10, 3.00, 3.20], [3.00, 2.95, 3.05]
    runs = {}
    for variant, values in (("baseline", base), ("g1_sdpa_elementwise", gated)):
        for seed, value in enumerate(values):
            name = f"sink_tiny-h2-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=value)
    grid_fixtures.write_manifest(tmp_path, runs)
    result = summarize.summarize(tmp_path)
    block = make_tables.table_block("sinks_cpu", result, "make tables")
    assert "Produced by `make tables`" in block and "commit `abc`" in block
    assert "seeds 0, 1, 2" in block
    row = next(line for line in block.splitlines() if line.startswith("| g1_sdpa_elementwise"))
    assert "3.000 ± 0.029" in row  # mean (3.00, 2.95, 3.05) and its standard error
    assert "-0.100 [" in row  # paired difference to the baseline
    # diffs (-0.10, -0.05, -0.15): t = -0.1 / (0.05 / sqrt 3) = -3.464, 2 df -> p 0.074
    assert scipy_stats.ttest_rel(gated, base).pvalue == pytest.approx(0.0742, abs=1e-4)
    assert ", p 0.07" in row and "**\\***" not in row
    # effect 0.1 / 0.05 = 2: a paired t-test at 5% reaches 80% power at 5 pairs (noncentral t);
    # the sd's 95% chi-square interval with 2 df, 0.05 x sqrt(2 / 7.378) to 0.05 x sqrt(2 /
    # 0.05064) = 0.026 to 0.314, gives effects 3.84 and 0.318: 3 and 80 pairs.
    assert "g1_sdpa_elementwise held-out loss (-0.100): 5 (3 to 80)" in block
    page = "intro\n<!-- table:sinks_cpu begin -->\nold\n<!-- table:sinks_cpu end -->\nrest\n"
    new = make_tables.replace_block(page, "sinks_cpu", block)
    assert new.startswith("intro\n<!-- table:sinks_cpu begin -->\nProduced by")
    assert new.endswith("<!-- table:sinks_cpu end -->\nrest\n") and "old" not in new
    with pytest.raises(ValueError, match="table:other"):
        make_tables.replace_block(page, "other", block)


def test_a_difference_significant_only_before_holm_gets_the_seeds_holm_needs(tmp_path):
    # Two rows, each with diffs (-0.10, -0.07, -0.13) to the baseline: paired t p 0.029 each
    # (scipy), Holm over 2 rows -> 0.057, so neither is marked. The seeds to resolve them are
    # those a t-test at 5% / 2 needs for 80% power at effect 0.1 / 0.03.
    base = [3.00, 3.10, 3.20]
    runs = {}
    for variant in ("baseline", "g1_sdpa_elementwise", "g1_sdpa_headwise"):
        shift = (0.0, 0.0, 0.0) if variant == "baseline" else (-0.10, -0.07, -0.13)
        for seed, (value, d) in enumerate(zip(base, shift)):
            name = f"sink_tiny-h2-{variant}-s{seed}"
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=value + d)
    grid_fixtures.write_manifest(tmp_path, runs)
    diffs = np.array([-0.10, -0.07, -0.13])
    assert scipy_stats.ttest_1samp(diffs, 0.0).pvalue == pytest.approx(0.0287, abs=1e-4)
    block = make_tables.table_block("sinks_cpu", summarize.summarize(tmp_path), "make tables")
    rows = [line for line in block.splitlines() if line.startswith("| g1_")]
    assert len(rows) == 2 and all("p 0.03" in r and "**\\***" not in r for r in rows)
    # Independent reference: Monte Carlo power of the two-sided t-test at alpha 0.025 for
    # normal diffs of standardised effect 0.1 / 0.03: n = 3 falls short of 80%, n = 4 passes.
    rng = np.random.default_rng(0)
    effect = 0.1 / 0.03
    for n, below in ((3, True), (4, False)):
        sample = rng.normal(effect, 1.0, size=(20000, n))
        power = float(np.mean(scipy_stats.ttest_1samp(sample, 0.0, axis=1).pvalue < 0.025))
        assert (power < 0.8) == below, (n, power)
    # The spread's interval (sd 0.03 x 0.521 to x 6.28) moves it from 3 to 37 pairs.
    assert ("g1_sdpa_elementwise held-out loss (-0.100): p < 0.05 before the correction; "
            "4 (3 to 37) at 5%/2") in block
    assert "no spread to go on" not in block


@pytest.mark.reference("independent")
def test_the_lr_sweep_table_is_rewritten_in_its_page_from_records(tmp_path, monkeypatch):
    # Every table of make_tables has its marked block in its page.
    repo = pathlib.Path(__file__).resolve().parents[1]
    for name, spec in make_tables.TABLES.items():
        text = (repo / spec["page"]).read_text()
        assert f"<!-- table:{name} begin -->\n" in text and f"\n<!-- table:{name} end -->" in text
    # lr_cpu on fake records of 12 of its 40 runs (a root partly run: the table holds the
    # seeds found): (variant, lr x, seed) -> final held-out loss.
    # Baseline x128 seed 0 spikes once (losses 3.0, 2.5, 6.0: EMA 2.95 after 2.5, and
    # 6.0 > 1.5 x 2.95); the x128 seed-1 runs each skip one non-finite step.
    losses = {("baseline", 1, 0): 5.50, ("baseline", 8, 0): 5.40,
              ("baseline", 32, 0): 5.80, ("baseline", 32, 1): 5.90,
              ("baseline", 128, 0): 6.00, ("baseline", 128, 1): 6.10,
              ("g1_sdpa_elementwise", 1, 0): 5.45, ("g1_sdpa_elementwise", 8, 0): 5.30,
              ("g1_sdpa_elementwise", 32, 0): 5.36, ("g1_sdpa_elementwise", 32, 1): 5.38,
              ("g1_sdpa_elementwise", 128, 0): 5.35, ("g1_sdpa_elementwise", 128, 1): 5.33}
    names = {key: f"tiny-l12-{key[0]}-lrx{key[1]}-s{key[2]}" for key in losses}
    assert sorted(make_tables.TABLES["lr_cpu"]["only"]) == sorted(
        f"tiny-l12-{v}-lrx{m}-s{s}" for v in ("baseline", "g1_sdpa_elementwise")
        for m in (1, 8, 32, 128) for s in range(5))
    root = tmp_path / "runs" / "lr_cpu"
    runs = {}
    for (variant, m, seed), value in losses.items():
        runs[names[variant, m, seed]] = grid_fixtures.write_run(
            root, names[variant, m, seed], variant=variant, seed=seed, eval_loss=value,
            label=f"{variant} lr x{m}", lr_multiplier=float(m), peak_lr=0.03 * m,
            losses=(3.0, 2.5, 6.0) if (variant, m, seed) == ("baseline", 128, 0)
            else (3.0, 2.5, 2.0), skipped=(1,) if (m, seed) == (128, 1) else ())
    grid_fixtures.write_manifest(root, runs)
    page = tmp_path / "docs" / "analysis.md"
    page.parent.mkdir()
    page.write_text("intro\n<!-- table:lr_cpu begin -->\nold\n<!-- table:lr_cpu end -->\nrest\n")
    monkeypatch.setattr(make_tables, "REPO", tmp_path)
    make_tables.make("lr_cpu", tmp_path / "runs", run=False)
    text = page.read_text()
    assert text.startswith("intro\n<!-- table:lr_cpu begin -->\nSummarised by `make tables "
                           "--no_run` from the runs found under the grid's root (the command "
                           "that makes them: `make tables "
                           f"(python -m experiments.run_grid experiments/grids/lr_cpu.py --root "
                           f"{root} --seeds 0,1,2,3,4 --lr_multipliers 1,8,32,128 --no_analyze "
                           "--set train.batch_size=4 --set train.steps=200 --set "
                           "train.eval_every=200 --set train.checkpoint_every=200 --only "
                           "<baseline and G1 elementwise at lr x1, x8, x32, x128, seeds 0-4>)`), "
                           "at commit `abc`, seeds 0, 1, host not recorded, XLA settings "
                           "not recorded.\n")
    assert text.endswith("\n<!-- table:lr_cpu end -->\nrest\n") and "old" not in text
    # Best: the lowest mean loss. Stable: no non-finite step and within 2% of the best
    # (baseline 5.40 x 1.02 = 5.508: x1 and x8; G1 5.30 x 1.02 = 5.406: x8, x32, and x128
    # but for its skipped step). Two seeds: mean ± std, e.g. stdev(5.80, 5.90) = 0.0707.
    assert [line for line in text.splitlines() if line.startswith("| ")] == [
        "| variant | best loss (at lr) | largest stable lr |",
        "| baseline | 5.4000 (x8 = 0.240) | x8 = 0.240 |",
        "| g1_sdpa_elementwise | 5.3000 (x8 = 0.240) | x32 = 0.960 |",
        "| variant | lr x | peak lr | runs done (seeds) | non-finite steps | spikes per run "
        "| loss |",
        "| baseline | 1 | 0.030 | 1/1 (0) | 0 | 0 | 5.5000 |",
        "| baseline | 8 | 0.240 | 1/1 (0) | 0 | 0 | 5.4000 |",
        "| baseline | 32 | 0.960 | 2/2 (0, 1) | 0 | 0, 0 | 5.8500 ± 0.071 |",
        "| baseline | 128 | 3.840 | 2/2 (0, 1) | 1 | 1, 0 | 6.0500 ± 0.071 |",
        "| g1_sdpa_elementwise | 1 | 0.030 | 1/1 (0) | 0 | 0 | 5.4500 |",
        "| g1_sdpa_elementwise | 8 | 0.240 | 1/1 (0) | 0 | 0 | 5.3000 |",
        "| g1_sdpa_elementwise | 32 | 0.960 | 2/2 (0, 1) | 0 | 0, 0 | 5.3700 ± 0.014 |",
        "| g1_sdpa_elementwise | 128 | 3.840 | 2/2 (0, 1) | 1 | 0, 0 | 5.3400 ± 0.014 |",
        # G1 minus baseline at each rate, paired by seed, by hand: x32 differences -0.44,
        # -0.52 (mean -0.48, se 0.04, t 12.706 at 1 df: half-width 0.5082; p of t = -12 at 1
        # df, a Cauchy: 1 - 2 atan(12) / pi = 0.0529); x128 -0.65, -0.77 (se 0.06, half-width
        # 0.7624, t -11.83: p 0.0536).
        "| variant | lr x | seeds | loss minus baseline [95% CI], p |",
        "| g1_sdpa_elementwise | 1 | 0 | -0.0500 (one seed: no interval, no test) |",
        "| g1_sdpa_elementwise | 8 | 0 | -0.1000 (one seed: no interval, no test) |",
        "| g1_sdpa_elementwise | 32 | 0, 1 | -0.4800 [-0.9882, +0.0282], p 0.053 |",
        "| g1_sdpa_elementwise | 128 | 0, 1 | -0.7100 [-1.4724, +0.0524], p 0.054 |"]


def _record(*, steps, wall_seconds, calls):
    config = ml_collections.ConfigDict({"train": {"batch_size": 2}, "data": {"seq_len": 8}})
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("data",))
    return run_record.build(config, mesh=mesh, steps=steps, train={"loss": 1.0},
                            eval_metrics=None, telemetry=None, wall_seconds=wall_seconds,
                            flops_per_token=None, code={"commit": None, "dirty": None},
                            calls=calls)


def test_record_wall_time_is_the_sum_of_the_runs_training_calls(tmp_path):
    # Three calls: 0 -> 7 (stopped; its last checkpoint was step 5), 5 -> 20 (finished), then
    # 20 -> 30 (train.steps grown). The record, written by the last, holds all three.
    run_record.add_call(tmp_path, start_step=0, end_step=7, wall_seconds=1.5)
    run_record.add_call(tmp_path, start_step=5, end_step=20, wall_seconds=2.25)
    calls = run_record.add_call(tmp_path, start_step=20, end_step=30, wall_seconds=0.5)
    assert run_record.read_calls(tmp_path) == calls  # what is on disk
    record = _record(steps=30, wall_seconds=0.5, calls=calls)
    assert record["wall_seconds"] == pytest.approx(1.5 + 2.25 + 0.5)
    assert record["wall_seconds_last_call"] == 0.5
    assert record["wall_seconds_complete"] is True
    assert [(c["start_step"], c["end_step"]) for c in record["train_calls"]] == [
        (0, 7), (5, 20), (20, 30)]
    # A call killed outright leaves no entry: 0 -> 7, then one resumed from 5 reached 12 and
    # died, then 10 -> 30. The sum is a lower bound, and the record says so.
    (tmp_path / "gap").mkdir()
    run_record.add_call(tmp_path / "gap", start_step=0, end_step=7, wall_seconds=1.0)
    gap = run_record.add_call(tmp_path / "gap", start_step=10, end_step=30, wall_seconds=2.0)
    record = _record(steps=30, wall_seconds=2.0, calls=gap)
    assert record["wall_seconds"] == pytest.approx(3.0)
    assert record["wall_seconds_complete"] is False
    # A call from step 0 starts over: the earlier calls' work was thrown away.
    fresh = run_record.add_call(tmp_path, start_step=0, end_step=30, wall_seconds=4.0)
    assert fresh == [{"start_step": 0, "end_step": 30, "wall_seconds": 4.0}]
    assert _record(steps=30, wall_seconds=4.0, calls=fresh)["wall_seconds"] == 4.0
    # No ledger (a record written before ledgers): this call's time alone, completeness unknown.
    old = _record(steps=30, wall_seconds=0.5, calls=None)
    assert old["wall_seconds"] == 0.5 and old["wall_seconds_complete"] is None
    assert old["train_calls"] == []


def _telemetry_config(steps):
    from configs import sinks

    config = sinks.get_config("variant=g1_sdpa_elementwise")
    config.update_from_flattened_dict({
        "train.steps": steps, "train.batch_size": 2, "data.seq_len": 16, "train.eval_every": 0,
        "train.log_every": 1, "train.checkpoint_every": 2, "optimizer.warmup_steps": 1,
        # one layer: the record's claim holds for any model, and a layer less compiles faster
        "train.async_checkpoint": False, "model.num_layers": 1})
    return config


@pytest.fixture
def compiled_once(tmp_path):
    """jax's persistent compilation cache on, in a folder of this test: the resumed call
    compiles the same train step as the first, and loads it instead. tests/conftest.py turns
    it off again after the module. With _telemetry_config's one-layer model, 2026-12-02, this
    file alone on one process, measured back to back: 15.7 against 23.8 CPU-s."""
    from jax.experimental.compilation_cache import compilation_cache

    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "jax_cache"))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    compilation_cache.reset_cache()


@pytest.mark.slow
def test_a_resumed_run_records_the_wall_time_of_both_calls(tmp_path, compiled_once):
    from gated_attention.training import loop

    workdir = tmp_path / "run"
    config = _telemetry_config(6)
    spent = []
    for stop_after in (3, None):  # "killed" after step 3 (checkpoint at 2), then resumed
        start = time.perf_counter()
        loop.run(config, workdir, progress=False, devices=jax.devices()[:1],
                  stop_after=stop_after)
        spent.append(time.perf_counter() - start)
    record = json.loads((workdir / "record.json").read_text())
    calls = record["train_calls"]
    assert [(c["start_step"], c["end_step"]) for c in calls] == [(0, 3), (2, 6)]
    assert record["wall_seconds_complete"] is True
    assert record["wall_seconds"] == pytest.approx(sum(c["wall_seconds"] for c in calls))
    # Each call's loop time lies within the time the test measured around that call, so the
    # record's sum is above either call's own time and below both calls together.
    for call, outer in zip(calls, spent):
        assert 0 < call["wall_seconds"] <= outer
    assert max(c["wall_seconds"] for c in calls) < record["wall_seconds"] <= sum(spent)
    assert record["wall_seconds_last_call"] == calls[-1]["wall_seconds"]


def test_a_table_says_which_seeds_and_commits_it_holds_and_marks_equal_differences(tmp_path):
    # Seed 0 only, under --no_run: the block must not claim the command's seeds 0, 1, 2.
    # G1's sink rate is 0.25 below the baseline's at seeds 0 and 1 (then at seed 0 alone).
    runs = {}
    for variant, rates in (("baseline", (0.5, 0.75)), ("g1_sdpa_elementwise", (0.25, 0.5))):
        for seed, rate in enumerate(rates):
            name = f"sink_tiny-h2-{variant}-s{seed}"
            analysis = {"perplexity": 20.0, "first_token_attention": 0.3, "sink_rate": rate,
                        "massive_activation": 2.0, "gate_score_mean": None, "step": 10,
                        "params": {"params_added_vs_baseline": 0}}
            runs[name] = grid_fixtures.write_run(tmp_path, name, variant=variant, seed=seed,
                                                 eval_loss=3.0, analysis=analysis)
    grid_fixtures.write_manifest(tmp_path, runs)
    block = make_tables.table_block("sinks_cpu", summarize.summarize(tmp_path), "make tables",
                                    ran=False)
    assert block.startswith("Summarised by `make tables --no_run` from the runs found")
    assert ", seeds 0, 1, host not recorded" in block
    row = next(line for line in block.splitlines() if line.startswith("| g1_sdpa_elementwise"))
    assert row.startswith("| g1_sdpa_elementwise | 2 (0, 1) | ")
    # Equal differences: no interval, the exact sign-flip p 2 / 2^2 = 0.5, not p 0.
    assert "-0.250 (all 2 seeds equal: no interval), p (exact sign-flip) 0.50" in row
    assert "**\\***" not in row
    assert "g1_sdpa_elementwise sink rate (-0.250 at each of 2 seeds, exact sign-flip p 0.50)" \
        in block
    # Seed 1 trained at another commit, on another host: the block says the runs mix them.
    record_path = tmp_path / "sink_tiny-h2-g1_sdpa_elementwise-s1" / "record.json"
    record = json.loads(record_path.read_text())
    record["code"]["commit"] = "def"
    record["hardware"] = {"host_cpu": {"model_name": "AMD EPYC", "vector_isa": ["avx", "avx2"]},
                          "xla_flags": "--xla_cpu_max_isa=AVX2", "cpu_threads": 1}
    record_path.write_text(json.dumps(record))
    block = make_tables.table_block("sinks_cpu", summarize.summarize(tmp_path), "make tables")
    assert "at commits `abc`, `def`" in block and "on AMD EPYC (avx2)" in block
    assert "XLA_FLAGS `--xla_cpu_max_isa=AVX2` (1 core)" in block
    assert "**The runs mix commits**" in block
    # One seed of each: a difference, and no interval or test beside it.
    for seed in (1,):
        for variant in ("baseline", "g1_sdpa_elementwise"):
            (tmp_path / "_status" / f"sink_tiny-h2-{variant}-s{seed}.json").write_text(
                json.dumps({"state": "pending"}))
    block = make_tables.table_block("sinks_cpu", summarize.summarize(tmp_path), "make tables")
    assert "-0.250 (one seed: no interval, no test)" in block


def test_the_record_names_the_xla_settings_and_cores_a_cpu_run_used():
    import os

    settings = run_record.cpu_settings(
        {"XLA_FLAGS": "--xla_cpu_max_isa=AVX --xla_cpu_max_isa=AVX2 --xla_foo=1"})
    assert settings["max_isa"] == "AVX2"  # the last one given wins, as in XLA's parser
    assert settings["xla_flags"] == "--xla_cpu_max_isa=AVX --xla_cpu_max_isa=AVX2 --xla_foo=1"
    assert settings["cpu_threads"] == len(os.sched_getaffinity(0))
    assert run_record.cpu_settings({}) == {"xla_flags": "", "max_isa": None,
                                           "cpu_threads": len(os.sched_getaffinity(0))}


def test_pinning_comparison_groups_runs_equal_in_every_bit():
    from experiments import cpu_pinning

    def run(losses, weights):
        return {"losses": dict(enumerate(losses, 1)), "fingerprints": {"w": weights},
                "record": {"hardware": {"cpu_threads": 2}}}

    runs = {"default": run([3.0, 2.5, 2.0], 7), "default-1core": run([3.0, 2.5, 2.0], 7),
            "avx2": run([3.0, 2.5000002, 2.0], 7), "avx": run([3.0, 2.5, 2.0], 8),
            "sse4_2": None}
    rows = {r["setting"]: r for r in cpu_pinning.compare(runs)}
    assert [rows[n]["group"] for n in runs] == ["A", "A", "B", "C", "failed"]
    assert rows["avx2"]["first_difference"] == 2  # the loss differs at step 2
    assert rows["avx"]["first_difference"] is None  # same losses, other weights: group C
    assert rows["avx2"]["largest_difference"] == pytest.approx(2e-7)
    assert not rows["avx"]["same_weights"] and rows["default-1core"]["same_weights"]
    text = cpu_pinning.markdown(list(rows.values()), "default")
    assert "| avx2 | `--xla_cpu_max_isa=AVX2` | all | 2.0000000000 | B | 2 | 2.0e-07 |" in text
    assert "| default-1core | `(none)` | 1 | 2.0000000000 | A | - | 0 |" in text


def test_make_tables_trains_its_grids_pinned_and_the_pin_holds_in_the_child(tmp_path,
                                                                             monkeypatch):
    import os
    import sys

    from experiments import cpu_pinning

    # The pin as the kernel sees it: a child started within on_cores(1) may run on one core,
    # and the parent's own affinity comes back after it.
    before = os.sched_getaffinity(0)
    with cpu_pinning.on_cores(1):
        child = subprocess.run([sys.executable, "-c",
                                "import os; print(len(os.sched_getaffinity(0)))"],
                               capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "1" and os.sched_getaffinity(0) == before
    # make() hands run_grid the pinned XLA_FLAGS and starts it on one core.
    calls = []
    monkeypatch.setattr(make_tables.subprocess, "run", lambda argv, **kw: calls.append(
        (argv, kw, len(os.sched_getaffinity(0)))))
    monkeypatch.setattr(make_tables.summarize, "summarize", lambda root: {"lr_sweep": [],
                                                                          "runs": []})
    page = tmp_path / "docs" / "analysis.md"
    page.parent.mkdir()
    page.write_text("<!-- table:lr_cpu begin -->\nold\n<!-- table:lr_cpu end -->\n")
    monkeypatch.setattr(make_tables, "REPO", tmp_path)
    make_tables.make("lr_cpu", tmp_path / "runs", run=True)
    ((argv, kw, cores),) = calls
    assert argv[1:3] == ["-m", "experiments.run_grid"]
    assert kw["env"]["XLA_FLAGS"] == cpu_pinning.PINNED == (
        "--xla_cpu_max_isa=AVX2 --xla_cpu_experimental_ynn_fusion_type=")
    assert cores == cpu_pinning.PINNED_CORES == 1 and os.sched_getaffinity(0) == before
