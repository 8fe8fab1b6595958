"""End to end: train a tiny grid with the real CLI, analyse it, summarise it, and execute the
notebooks against it (nbclient, the venv's python kernel). One grid for the whole test run."""

from __future__ import annotations

import csv
import json
import math
import os
import pathlib

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from experiments import run_grid, summarize
from gated_attention.analysis import stability
from gated_attention.ops import cpu_compile

REPO = pathlib.Path(__file__).resolve().parents[1]
# One CPU device and cheap XLA compiles for the training subprocesses and the kernels.
ENV = {"XLA_FLAGS": cpu_compile.xla_flags(), "JAX_PLATFORMS": "cpu"}
SETTINGS = ["train.steps=20", "train.batch_size=4", "data.seq_len=64", "train.eval_every=20",
            "train.eval_batches=2", "train.log_every=5", "optimizer.warmup_steps=5",
            "data.tokenizer=byte", "model.vocab_size=260", "model.num_layers=2",
            "train.telemetry_every=10"]
RUNS = ("tiny-baseline-s0", "tiny-g1_sdpa_elementwise-s0")
FIGURE_CALLS = ("plt.show()", "display(Image(")
# Figure cells that may draw nothing, by their first line, and what they print instead.
WITHOUT_FIGURE = {"compare_variants.ipynb": {'entries = result["paired"]': "No paired comparison"}}
pytestmark = pytest.mark.slow  # two training runs and two analyses in subprocesses


@pytest.fixture(scope="session")
def tiny_grid(tmp_path_factory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("grid") / "smoke"
    argv = [str(REPO / "experiments/grids/smoke.py"), "--root", str(root), "--parallel", "2",
            "--analyze_command", "{python} -m gated_attention.analyze --workdir={workdir} "
                                 "--batches=2 --batch_size=4",
            # the default command: a test worker that compiled for a TPU target before (libtpu
            # then leaves pod-like variables to child processes) still runs one host
            "--command", run_grid.TRAIN_COMMAND]
    for item in SETTINGS:
        argv += ["--set", item]
    with pytest.MonkeyPatch.context() as mp:
        for key, value in ENV.items():
            mp.setenv(key, value)
        rc = run_grid.main(argv)
    if rc != 0:
        logs = "\n".join(p.read_text()[-3000:] for p in sorted((root / "_logs").glob("*")))
        pytest.fail(f"tiny grid failed:\n{logs}")
    return root


def test_tiny_grid_is_analysed_and_summarised(tiny_grid):
    analyses = {run: json.loads((tiny_grid / run / "analysis" / "analysis.json").read_text())
                for run in RUNS}
    base, gated = analyses["tiny-baseline-s0"], analyses["tiny-g1_sdpa_elementwise-s0"]
    assert base["gate_score_mean"] is None and 0.0 < gated["gate_score_mean"] < 1.0
    for a in analyses.values():
        assert a["step"] == 20 and a["exclude_first_query"] is True
        assert len(a["first_token_attention_per_layer"]) == 2
        assert a["massive_activation"] == pytest.approx(
            np.mean(a["max_activation_per_layer"]["resid_after_ffn"]))
        assert math.isfinite(a["perplexity"]) and a["perplexity"] < 260  # beats uniform bytes
        # Attention maps are probabilities over the visible keys.
        maps = np.load(tiny_grid / a["workdir"] / "analysis" / "attention_maps.npy")
        np.testing.assert_allclose(maps.sum(-1), 1.0, atol=1e-5)
        assert np.all(np.triu(maps, k=1) == 0)
        # The flags loop.py logged follow the documented rule, recomputed here by hand: a
        # logged loss is a spike if, from the warm-up's end (step 5), it exceeds 1.5 x the
        # EMA (decay 0.9) of the logged losses before it.
        records = stability.read_metrics(tiny_grid / a["workdir"] / "metrics.jsonl")
        train = [r for r in records if r.get("kind") == "train"]
        assert [r["step"] for r in train] == list(range(1, 21))
        ema, want = None, []
        for r in train:
            want.append(ema is not None and r["step"] >= 5 and r["loss"] > 1.5 * ema)
            ema = r["loss"] if ema is None else 0.9 * ema + 0.1 * r["loss"]
        assert [r["loss_spike"] for r in train] == want
        # Telemetry every 10 updates, the last on the final weights (curves reach the end).
        assert [r["step"] for r in records if r.get("kind") == "telemetry"] == [10, 20]
        for name in a["figures"].values():
            assert (tiny_grid / a["workdir"] / "analysis" / name).stat().st_size > 0
    summarize.summarize(tiny_grid)
    with open(tiny_grid / "summary.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    assert float(rows["g1_sdpa_elementwise"]["paper_f_attn"]) == 0.048
    assert float(rows["baseline"]["f_attn"]) == pytest.approx(base["first_token_attention"])


@pytest.mark.parametrize("notebook,env", [
    ("compare_variants.ipynb", "GRID_ROOT"),
    ("inspect_model.ipynb", "RUN_DIR"),
])
def test_notebook_executes(tiny_grid, notebook, env):
    target = tiny_grid if env == "GRID_ROOT" else tiny_grid / RUNS[1]
    cwd, where = REPO, str(target)
    if env == "GRID_ROOT":  # started where Jupyter starts it, given a path from the repo root
        cwd, where = REPO / "notebooks", os.path.relpath(target, REPO)
    book = nbformat.read(REPO / "notebooks" / notebook, as_version=4)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {**ENV, env: where}.items():
            mp.setenv(key, value)
        # allow_errors: every cell runs, so a failure in one does not hide those after it
        NotebookClient(book, timeout=300, kernel_name="python3", allow_errors=True,
                       resources={"metadata": {"path": str(cwd)}}).execute()
    code = [c for c in book.cells if c.cell_type == "code"]
    errors = [f"{o['ename']}: {o['evalue']}" for c in code for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, errors
    assert all(c.execution_count for c in code)
    # Every figure cell shows its figure inline (a PNG in its outputs), or says why it has
    # none: the plots module once switched the kernel to Agg at import, and the figures of
    # plt.show() never appeared.
    missing = []
    for cell in (c for c in code if any(call in c.source for call in FIGURE_CALLS)):
        first = cell.source.splitlines()[0]
        images = [o for o in cell.outputs if "image/png" in o.get("data", {})]
        printed = "".join(o.get("text", "") for o in cell.outputs
                          if o.get("output_type") == "stream")
        because = WITHOUT_FIGURE.get(notebook, {}).get(first)
        if not images and not (because and because in printed):
            missing.append(first)
    assert not missing, f"figure cells of {notebook} that showed no figure: {missing}"
    if env == "GRID_ROOT":
        assert (tiny_grid / "figures" / "attention_maps.png").exists()
