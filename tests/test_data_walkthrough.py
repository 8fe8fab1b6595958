"""docs/c4_on_v5p.md, run block by block as a user would, with stand-ins where a cloud is
needed: `gcloud` (records its arguments; `storage cp` copies into a local bucket folder),
`gcsfuse` (links the mount point to that folder), `tfds` (builds a tiny dataset instead of C4),
`xpk` and `docker` (record their arguments; tests/test_gke_launch.py runs xpk's own dry run)
and `jupyter` (records what it was asked to execute; test_notebooks executes that notebook on
a real grid). The settings block gets local values for the mount, tokenizer and dataset; all
other blocks run verbatim. The real gcloud, xpk and docker are never called."""

import json
import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from data_fixtures import texts, train_bpe, write_jsonl

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "c4_on_v5p.md"
TESTS = Path(__file__).resolve().parent
RUNS = ("dense_1p7b_28l-baseline-lr0.004-s0",
        "dense_1p7b_28l-g1_sdpa_elementwise-lr0.004-narrowffn-s0")

GCLOUD = """#!/usr/bin/env bash
printf '%q ' gcloud "$@" >> "$STANDIN_LOG"; echo >> "$STANDIN_LOG"
if [[ "$1 $2" == "storage cp" ]]; then
  dest="$STORE/${4#gs://}"; mkdir -p "$(dirname "$dest")"; cp "$3" "$dest"
fi
"""
GCSFUSE = """#!/usr/bin/env bash
printf '%q ' gcsfuse "$@" >> "$STANDIN_LOG"; echo >> "$STANDIN_LOG"
bucket="${@: -2:1}" mount="${@: -1}"
mkdir -p "$STORE/$bucket"; rmdir "$mount"; ln -s "$STORE/$bucket" "$mount"
"""
TFDS = """#!/usr/bin/env bash
printf '%q ' tfds "$@" >> "$STANDIN_LOG"; echo >> "$STANDIN_LOG"
for arg in "$@"; do [[ "$arg" == --data_dir=* ]] && data_dir="${arg#--data_dir=}"; done
exec "$PYTHON" - "$STORE/${data_dir#gs://}" <<'EOF'
import sys
sys.path.insert(0, sys.argv[0] if False else __import__("os").environ["TESTS"])
from data_fixtures import texts, tiny_tfds_builder
tiny_tfds_builder(texts(60))(data_dir=sys.argv[1], file_format="array_record"
                             ).download_and_prepare()
EOF
"""
# The machine set-up lines (gcsfuse's package source, apt): recorded, never run here.
RECORDED = """#!/usr/bin/env bash
printf '%q ' "$(basename "$0")" "$@" >> "$STANDIN_LOG"; echo >> "$STANDIN_LOG"
[[ "$(basename "$0")" == lsb_release ]] && echo bookworm
[[ "$1" == tee ]] && cat > /dev/null  # `... | sudo tee FILE`: take the pipe, write nothing
exit 0
"""
JUPYTER = """#!/usr/bin/env bash
printf '%q ' jupyter "$@" >> "$STANDIN_LOG"; echo "GRID_ROOT=$GRID_ROOT" >> "$STANDIN_LOG"
"""


def blocks(text: str) -> list[str]:
    return re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M)


def _stand_ins(folder: Path) -> None:
    folder.mkdir()
    # The venv's python under its own name, except the pre-flight: compiling the 1.7B model
    # for v5p-64 takes minutes, so its calls are recorded here (tests/test_preflight.py
    # compiles for real).
    python = ('#!/usr/bin/env bash\n'
              'if [[ "$1 $2" == "-m gated_attention.preflight" ]]; then\n'
              '  printf \'%q \' preflight "$@" >> "$STANDIN_LOG"; echo >> "$STANDIN_LOG"; exit 0\n'
              'fi\nexec "$PYTHON" "$@"\n')
    for name, body in (("gcloud", GCLOUD), ("gcsfuse", GCSFUSE), ("tfds", TFDS),
                       ("jupyter", JUPYTER), ("python", python), ("sudo", RECORDED),
                       ("curl", RECORDED), ("lsb_release", RECORDED), ("xpk", RECORDED),
                       ("docker", RECORDED)):
        path = folder / name
        path.write_text(body)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _finished_grid(root: Path) -> None:
    """What worker 0 leaves in the bucket when both runs are trained and analysed."""
    from experiments import grid_lib, run_grid
    from gated_attention.core import paths

    runs = [r for r in grid_lib.grid_runs(REPO / "experiments/grids/table2_lr.py", "paper", (0,))
            if r.name in RUNS]
    run_grid.write_manifest(paths.resolve(root), "experiments/grids/table2_lr.py", "paper",
                            runs, {})
    for run, (ppl, f_attn, m_act, gate) in zip(runs, [(12.0, 0.45, 900.0, None),
                                                     (11.5, 0.05, 90.0, 0.12)]):
        (root / run.name / "analysis").mkdir(parents=True)
        (root / run.name / "analysis" / "analysis.json").write_text(json.dumps({
            "perplexity": ppl, "first_token_attention": f_attn, "massive_activation": m_act,
            "gate_score_mean": gate, "sink_rate": 0.0, "step": 24000,
            "params": {"params_added_vs_baseline": 0},
            "stability": {"train": {"spikes": 0, "diverged": False}}}))


def test_every_command_of_the_walkthrough_runs(tmp_path):
    page = PAGE.read_text()
    found = blocks(page)
    assert found[0].startswith("# Settings") and len(found) >= 10
    bins, store, home = tmp_path / "bin", tmp_path / "store", tmp_path / "home"
    _stand_ins(bins)
    home.mkdir()
    corpus = texts(60)
    tokenizer_json = train_bpe(tmp_path / "tokenizer.json", corpus, 320)
    settings = found[0] + (
        f"export MOUNT={tmp_path}/mnt/$BUCKET_NAME DATA={tmp_path}/mnt/$BUCKET_NAME/"
        f"gated_attention\nexport TOKENIZER_JSON={tokenizer_json} TFDS_NAME=ga_tiny_text:1.0.0"
        f" POD_ENV={tmp_path}/pod.env\n")
    log = tmp_path / "stand_ins.log"
    env = {**os.environ, "PATH": f"{bins}:{os.environ['PATH']}", "STORE": str(store),
           "STANDIN_LOG": str(log), "PYTHON": sys.executable, "TESTS": str(TESTS),
           "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path), "HOME": str(home),
           "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "GATED_ATTENTION_PYTHON": str(bins / "python"),
           "GATED_ATTENTION_BUILD_ROOT": str(tmp_path / "build")}
    data = store / "my-bucket" / "gated_attention"
    for i, block in enumerate(found[1:], start=1):
        if "experiments.summarize" in block:
            _finished_grid(data / "grids" / "c4")
        result = subprocess.run(["bash", "-euo", "pipefail", "-c", settings + block],
                                cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, f"block {i}:\n{block}\n{result.stdout}\n{result.stderr}"

    manifest = json.loads((data / "c4_shards" / "manifest.json").read_text())
    assert manifest["tokenizer"]["kind"] == "hf" and len(manifest["splits"]["train"]["shards"]) \
        == 64 and manifest["splits"]["train"]["documents"] == len(corpus)
    assert (data / "tokenizer" / "tokenizer.json").read_text() == Path(tokenizer_json).read_text()
    calls = log.read_text()
    assert "xpk cluster create --cluster=ga-c4" in calls
    assert f"--mount-point={tmp_path}/mnt/my-bucket" in calls  # the bucket in every pod
    # one workload per run, each its run's own workdir under the grid's root, from one image
    launch = [line for line in calls.splitlines() if line.startswith("xpk workload create")]
    assert len(launch) == 2 and all("--config.data.source=array_record" in line
                                    for line in launch)
    for run, line in zip(RUNS, launch, strict=True):
        assert f"--workdir=gs://my-bucket/gated_attention/grids/c4/{run}" in line
        assert f"data.paths={tmp_path}/mnt/my-bucket/gated_attention/c4_shards" in line
    images = {word for line in launch for word in line.split() if "--docker-image=" in word}
    assert len(images) == 1 and "docker push" in calls
    assert "xpk cluster delete --cluster=ga-c4" in calls
    assert "sudo apt-get install -y fuse gcsfuse" in calls  # the mount's set-up, recorded
    preflights = [line for line in calls.splitlines() if line.startswith("preflight")]
    assert len(preflights) >= 4  # the page's two, then gke_launch's own before the launch
    assert all("--accelerator=v5p-64" in line or "v5p-64" in line for line in preflights)
    assert all("fsdp=32" in line for line in preflights), preflights
    assert f"jupyter execute notebooks/compare_variants.ipynb GRID_ROOT={tmp_path}/mnt/" \
           "my-bucket/gated_attention/grids/c4" in calls
    summary = (data / "grids" / "c4" / "summary.md").read_text()
    assert "g1_sdpa_elementwise" in summary and "baseline" in summary


@pytest.mark.parametrize("variant", ["baseline", "g1_sdpa_elementwise"])
def test_the_launched_runs_are_valid_configs_on_the_prepared_shards(tmp_path, variant):
    """The launch block's settings, on shards written as step 4 writes them, pass the run's
    config validation (tokenizer fingerprint, vocabulary, epoch budget)."""
    from gated_attention.config import run_config
    from gated_attention.data import prepare

    corpus = texts(30)
    write_jsonl(tmp_path / "c.jsonl", corpus)
    train_bpe(tmp_path / "tokenizer.json", corpus, 320)
    prep = run_config.base_config("dense_1p7b_28l", "baseline")
    prep.data.update(dict(source="files", paths=str(tmp_path / "c.jsonl"), tokenizer="hf",
                          tokenizer_path=str(tmp_path / "tokenizer.json"), eval_fraction=0.3))
    prepare.prepare(prep, str(tmp_path / "shards"), num_shards=2)
    block = next(b for b in blocks(PAGE.read_text()) if "gke_launch.sh" in b)
    sets = dict(s.split("=", 1) for s in re.findall(r"--config\.(\S+)", block))
    config = run_config.base_config("dense_1p7b_28l", variant)
    for key, value in sets.items():
        section, field = key.split(".")
        value = value.replace('"$DATA/c4_shards"', str(tmp_path / "shards"))
        config[section][field] = type(config[section][field])(value)
    run_config.validate_run_config(config)
    # The page's budget against C4's English training split (about 150B tokens).
    from gated_attention.data import epochs

    assert epochs.check(config, {"train": {"tokens": 150e9}}) < 0.5
