"""The Table 5 grid (short run, then continued training from it) and its summary, on a
hand-made result with known means and the paper's numbers at known places."""

import csv
import json

import pytest

from experiments import grid_lib, run_grid, summarize
from experiments.grids import table5

LENGTHS = (128, 256, 512, 1024, 2048, 4096, 8192)
# Hand-made retrieval scores per (variant, scaling) and seed: means 60, 80, 30, 50 (x100).
SCORES = {("baseline", "none"): (0.5, 0.7), ("g1_sdpa_elementwise", "none"): (0.8, 0.8),
          ("baseline", "yarn"): (0.2, 0.4), ("g1_sdpa_elementwise", "yarn"): (0.5, 0.5)}


def test_grid_continues_each_short_run_from_its_checkpoint(tmp_path):
    runs = table5.runs("tiny", (0, 1))
    assert len(runs) == 8
    short = {r.name: r for r in runs if "train.init_from" not in dict(r.overrides)}
    for run in runs:
        overrides = dict(run.overrides)
        if run.name in short:
            assert overrides["data.seq_len"] == 256 and overrides["model.rope_base"] == 1e4
            continue
        assert overrides["data.seq_len"] == 1024 and overrides["model.rope_base"] == 1e6
        source = overrides["train.init_from"].removeprefix("{root}/")
        assert (short[source].variant, short[source].seed) == (run.variant, run.seed)
        train_cmd, eval_cmd = run_grid.commands(run, tmp_path / "grid", "tiny", {},
                                                analyze_template=table5.eval_command("tiny"))
        assert f"--config.train.init_from={tmp_path / 'grid'}/{source}" in train_cmd
        assert "--lengths=128,256,512,1024,2048,4096,8192" in eval_cmd
    assert {r.arch for r in table5.runs("paper", (0,))} == {"dense_1p7b_28l"}


def _write_eval(run_dir, variant, seed):
    results = {}
    for scaling in ("none", "yarn"):
        score = SCORES[(variant, scaling)][seed]
        results[scaling] = {str(n): {"retrieval_score": score,
                                     "perplexity": {"perplexity": 10.0 + seed + n / 1024},
                                     "tasks": {}} for n in LENGTHS}
    run_dir.mkdir(parents=True)
    (run_dir / "length_eval").mkdir()
    (run_dir / "length_eval" / "length_eval.json").write_text(json.dumps({
        "settings": {"train_length": 1024, "lengths": list(LENGTHS),
                     "tasks": ["passkey", "common_words"]}, "results": results}))


def test_summary_prints_table5_beside_the_paper(tmp_path):
    root = tmp_path / "grid"
    root.mkdir()
    runs = table5.runs("tiny", (0, 1))
    run_grid.write_manifest(root, "table5.py", "tiny", runs, {})
    for run in runs:
        if "train.init_from" in dict(run.overrides):
            _write_eval(root / run.name, run.variant, run.seed)
    result = summarize.summarize(root)["table5"]
    rows = {r["method"]: r for r in result["rows"]}
    assert result["train_length"] == 1024 and not result["missing"]
    assert rows["baseline"]["score_1024"] == pytest.approx(60.0)
    assert rows["G1 gate + YaRN"]["score_8192"] == pytest.approx(50.0)
    assert rows["baseline"]["ppl_2048"] == pytest.approx(12.5)  # (12 + 13) / 2
    # The paper's columns sit at the same multiple of the training length (32k there).
    assert rows["baseline"]["paper_128"] == 88.89        # 1/8x: 4k
    assert rows["G1 gate"]["paper_1024"] == 79.77        # 1x: 32k
    assert rows["baseline + YaRN"]["paper_4096"] == 31.65  # 4x: 128k
    assert rows["G1 gate"]["paper_2048"] is None          # not measured in the paper
    assert rows["G1 gate + YaRN"]["paper_8192"] is None   # beyond the paper's lengths
    text = (root / "summary.md").read_text()
    assert "## Table 5: long context" in text
    assert "over the synthetic tasks (common_words, passkey)" in text  # the tasks evaluated
    assert "| baseline | 2 | 60.0 / 88.89 |" in text
    assert "2048 (2x): ours 20.0, paper 29.1" in text  # 66.60 - 37.51
    with open(root / "table5.csv") as f:
        assert len(list(csv.DictReader(f))) == 4


def test_every_scale_is_defined():
    for scale in grid_lib.SCALES:
        assert table5.SETTINGS[scale]["short"][0] < table5.SETTINGS[scale]["long"][0]
        assert table5.eval_command(scale).startswith("{python} -m gated_attention.evaluate_length")


def test_run_names_fit_a_file_name_and_tell_the_runs_apart():
    for scale in grid_lib.SCALES:
        runs = table5.runs(scale, (0, 1))
        assert len({r.name for r in runs}) == len(runs)
        # The status file is ".<name>.json.tmp-<8 hex>" while written: 255 bytes at most.
        assert max(len(f".{r.name}.json.tmp-12345678") for r in runs) <= 255
        for run in runs:
            assert "init_from" not in run.name
    short, continued = table5.runs("tiny", (0,))[:2]
    assert dict(continued.overrides)["train.init_from"] == "{root}/" + short.name
    assert continued.name == ("tiny-baseline-num_layers2-d_model64-num_heads2-num_kv_heads1-"
                              "mlp_dim192-seq_len1024-rope_base1e+06-steps150-batch_size4-"
                              "warmup_steps15-s0")


def test_the_pass_key_grid_trains_and_scores_pass_keys(tmp_path):
    from experiments.grids import table5_passkey

    runs = table5_passkey.runs("tiny", (0, 1))
    assert len(runs) == 8 and {r.arch for r in runs} == {"passkey_tiny"}
    assert all(len(r.name) < 200 for r in runs)
    continued = [r for r in runs if "train.init_from" in dict(r.overrides)]
    assert len(continued) == 4
    for run in continued:
        overrides = dict(run.overrides)
        assert (overrides["data.seq_len"], overrides["model.rope_base"]) == (1024, 1e6)
        assert overrides["data.passkey.digits"] == 4
        _, eval_cmd = run_grid.commands(
            run, tmp_path / "grid", "tiny", {},
            analyze_template=table5.eval_command("tiny", table5_passkey.SETTINGS))
        assert "--lengths=256,512,1024,2048,4096" in eval_cmd
        assert "--tasks=marked_passkey" in eval_cmd and "--ppl_rows=0" in eval_cmd
