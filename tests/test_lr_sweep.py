"""The learning-rate axis of a grid (--lr_multipliers) and the summary's sweep section."""

import pytest

from experiments import grid_lib, run_grid, summarize
from tests import grid_fixtures

SINKS_CPU = grid_lib.pathlib.Path(grid_lib.__file__).parent / "grids" / "sinks_cpu.py"


def test_multipliers_expand_every_run_and_scale_its_schedule():
    runs = [r for r in grid_lib.grid_runs(SINKS_CPU, "tiny", (0, 1))
            if r.variant in ("baseline", "g1_sdpa_elementwise")]
    swept = grid_lib.with_lr_multipliers(runs, grid_lib.parse_multipliers("0.5,1,4"))
    assert len(swept) == 2 * 2 * 3
    names = [r.name for r in swept]
    assert len(set(names)) == len(names)
    first = swept[0]
    assert first.label == "baseline lr x0.5" and first.lr_multiplier == 0.5
    overrides = grid_lib.run_overrides(first, "tiny")
    # The sinks recipe: peak 1e-2, final 1e-4; both scaled by 0.5.
    assert overrides["optimizer.peak_lr"] == pytest.approx(5e-3)
    assert overrides["optimizer.final_lr"] == pytest.approx(5e-5)
    assert "lr_multiplier" not in overrides
    # A run whose recipe sets no learning rate scales the config default (3e-3, 3e-5).
    plain = grid_lib.with_lr_multipliers([grid_lib.Run(arch="tiny", variant="baseline")], (2.0,))
    assert grid_lib.run_overrides(plain[0], "tiny")["optimizer.peak_lr"] == pytest.approx(6e-3)
    assert plain[0].name == "tiny-baseline-lrx2-s0"


@pytest.mark.parametrize("text", ["0,1", "a,b", "", "-1"])
def test_bad_multipliers_are_refused_naming_the_flag(text):
    with pytest.raises(grid_lib.GridError, match="--lr_multipliers="):
        grid_lib.parse_multipliers(text)


def test_run_grid_dry_run_lists_the_swept_runs(tmp_path, capsys):
    assert run_grid.main([str(SINKS_CPU), "--root", str(tmp_path), "--lr_multipliers", "1,2",
                          "--only", "sink_tiny-h2-baseline-lrx2-s0", "--dry_run"]) == 0
    out = capsys.readouterr().out
    assert "--config.optimizer.peak_lr=0.02" in out and "--config.data.shuffle_seed=0" in out
    with pytest.raises(SystemExit):
        run_grid.main([str(SINKS_CPU), "--root", str(tmp_path), "--lr_multipliers", "0",
                       "--dry_run"])
    assert "--lr_multipliers='0' must be numbers > 0, e.g. 0.5,1,2,4,8" in capsys.readouterr().err


def test_summary_names_best_and_largest_stable_rate(tmp_path):
    # (multiplier, seed 0 loss, seed 1 loss, skipped steps, state)
    plan = {"baseline": [(1, 2.00, 2.02, (), "done"), (2, 1.98, 1.99, (), "done"),
                         (4, 2.10, 2.20, (), "done"), (8, None, None, (), "failed")],
            "g1_sdpa_elementwise": [(1, 2.00, 2.00, (), "done"), (2, 1.95, 1.97, (), "done"),
                                    (4, 1.96, 1.98, (1,), "done"), (8, 1.97, 1.99, (), "done")]}
    runs = {}
    for variant, points in plan.items():
        for m, a, b, skipped, state in points:
            for seed, loss in ((0, a), (1, b)):
                name = f"tiny-{variant}-lrx{m}-s{seed}"
                runs[name] = grid_fixtures.write_run(
                    tmp_path, name, variant=variant, seed=seed, eval_loss=loss,
                    label=f"{variant} lr x{m}", lr_multiplier=float(m), peak_lr=1e-2 * m,
                    skipped=skipped, state=state,
                    losses=(3.0, 2.0, 9.0, 2.0) if m == 4 else (3.0, 2.5, 2.0))
    grid_fixtures.write_manifest(tmp_path, runs)
    sweeps = {s["variant"]: s for s in summarize.summarize(tmp_path)["lr_sweep"]}
    base, gated = sweeps["baseline"], sweeps["g1_sdpa_elementwise"]
    assert base["best"]["multiplier"] == 2 and base["best"]["loss"] == pytest.approx(1.985)
    # x4 is 2.15 > 1.985 * 1.02 and x8 failed: the largest stable rate is x2.
    assert base["largest_stable"]["multiplier"] == 2
    # G1: best x2 (1.96); x4 had a non-finite step; x8 (1.98) is within 2% of the best.
    assert gated["best"]["multiplier"] == 2 and gated["largest_stable"]["multiplier"] == 8
    x4 = next(p for p in base["points"] if p["multiplier"] == 4)
    assert x4["spikes"] == [1, 1]  # the 9.0 after 2.0 (EMA 0.9) is one spike per run
    text = (tmp_path / "summary.md").read_text()
    assert "## Learning-rate sweep" in text
    assert "| baseline | 1.9850 (x2 = 0.020) | x2 = 0.020 |" in text
    # Paired with the baseline: its failed x8 runs fail both pairs, counted, not dropped;
    # x1: G1 2.00, 2.00 against 2.00, 2.02 gives differences 0.00, -0.02.
    assert ("| g1_sdpa_elementwise | 8 | 0, 1 | - (no finite pair), 2 of 2 pairs failed |"
            in text)
    assert "| g1_sdpa_elementwise | 1 | 0, 1 | -0.0100 [" in text
