"""benchmarks/: the table, the block-size sweep and the GPU benchmark script, on a CPU.

The sweep and the table run through benchmarks/device_benchmark.sh with SMALL=1 (tiny shapes
and candidates, kernels interpreted) while `attention.py --check --small` runs beside it, so
the code paths a GPU run will take run here first. Both start once per module, in
parallel.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPT = BENCH / "device_benchmark.sh"
sys.path.insert(0, str(BENCH))

import attention  # noqa: E402 - benchmarks/attention.py
import sweep_blocks  # noqa: E402 - benchmarks/sweep_blocks.py

from gated_attention.ops import cpu_compile  # noqa: E402
from gated_attention.ops.block_sizes import BLOCK_KEYS  # noqa: E402

# No fake devices: one CPU device compiles the interpreted kernels fastest; cheap compiles
# (gated_attention/ops/cpu_compile.py) for the programs the script times only to rank them.
ENV = {**os.environ, "XLA_FLAGS": cpu_compile.xla_flags(), "JAX_PLATFORMS": "cpu",
       "PYTHON": sys.executable, "INSTALL_WHEELS": "0"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The script's sweep and table steps and the --small check, run side by side."""
    out = tmp_path_factory.mktemp("device_benchmark")
    script = subprocess.Popen(["bash", str(SCRIPT), "sweep", "table"], cwd=ROOT, text=True,
                               env={**ENV, "OUT": str(out), "SMALL": "1"},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    check = subprocess.Popen([sys.executable, str(BENCH / "attention.py"), "--check", "--small"],
                             cwd=ROOT, text=True, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT)
    script_out, _ = script.communicate(timeout=300)
    check_out, _ = check.communicate(timeout=300)
    return dict(out=out, script=(script.returncode, script_out),
                check=(check.returncode, check_out))


@pytest.mark.slow  # the module's sweep and check: about a minute of two processes
def test_sweep_json_has_every_candidate_a_winner_and_small_errors(runs):
    rc, text = runs["script"]
    assert rc == 0, text
    report = json.loads((runs["out"] / "sweep.json").read_text())
    assert report["small"] and report["table_key"] == "cpu" and "in_progress" not in report
    results = report["results"]
    assert {r["phase"] for r in results} == {"fwd", "fwd+bwd"}
    # one row per candidate per shape: the table's entry, one valid and one invalid forward
    # candidate; the table's entry, the forward winner (if new) and one backward candidate
    fwd = [r for r in results if r["phase"] == "fwd"]
    assert len(fwd) == 1 + len(sweep_blocks.SMALL_FWD_CANDIDATES)
    assert fwd[0]["current"] and set(fwd[0]["sizes"]) == set(BLOCK_KEYS)
    failed = [r for r in results if r["status"].startswith("failed")]
    assert [r["sizes"]["block_q"] for r in failed] == [8]  # the invalid one, on purpose
    assert "must be >= 16" in failed[0]["status"]
    ok = [r for r in results if not r["status"].startswith("failed")]
    assert ok and all(r["status"] == "ok" for r in ok), ok
    for r in ok:
        assert r["ms"] > 0 and r["tflops"] > 0 and r["compile_s"] >= 0
        assert r["error"] < 1e-2, r
    winner = report["winners"]["cpu"]["32"]
    assert set(winner) == set(BLOCK_KEYS)
    assert report["summary"]["32"]["sizes"] == winner
    # the printed literal is valid Python for the block-size table and equals the winner
    literal = report["literals"]["32"]
    assert eval("{" + literal + "}", {"dict": dict}) == {32: winner}
    assert all(line.strip() in text for line in literal.splitlines())
    assert "sweep: exit 0" in (runs["out"] / "summary.txt").read_text()
    assert "| fwd+bwd |" in (runs["out"] / "sweep.txt").read_text()
    # attention.py --block_sizes reads the winner back from the JSON
    assert attention.load_block_sizes(str(runs["out"] / "sweep.json"), 32) == winner
    assert attention.load_block_sizes(str(runs["out"] / "sweep.json"), 128) is None
    assert attention.load_block_sizes('{"block_q": 64}', 128) == {"block_q": 64}


@pytest.mark.slow
def test_check_small_values_and_gradients_match_reference(runs):
    rc, text = runs["check"]
    assert rc == 0, text
    assert "all cases within tolerance" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "B1 " in line]
    assert len(rows) == len(attention.SMALL_CHECK_CASES)
    assert all(line.endswith("| ok |") for line in rows)


def test_benchmark_script_is_shellcheck_clean_and_parses():
    shellcheck = Path(sys.executable).with_name("shellcheck")
    result = subprocess.run([str(shellcheck), str(SCRIPT)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_dry_run_prints_the_gpu_commands_inside_the_budget(tmp_path):
    env = {**ENV, "OUT": str(tmp_path), "DRY_RUN": "1", "PYTHON": "python3"}
    result = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("=== ")]
    commands = [line.split("): ", 1)[1] for line in lines]
    train = ("python3 benchmarks/train_step.py --arch=dense_1p7b_28l --seq_len=4096 --batch=4 "
             "--dtype=bfloat16 --remat=dots_with_no_batch_dims_saveable --steps=10 --warmup=2")
    assert commands[0] == "nvidia-smi"
    assert commands[2:] == [  # the table and the train step first, the sweep last
        "python3 benchmarks/attention.py",
        f"{train} --variants=baseline",
        f"{train} --variants=g1_sdpa_elementwise",
        f"{train} --variants=g1_sdpa_headwise",
        "python3 benchmarks/attention.py --check",
        "python3 benchmarks/preflight_memory.py",
        f"python3 benchmarks/sweep_blocks.py --budget_s=30 --out={tmp_path}/sweep.json",
    ]
    caps = [int(line.split("(timeout ", 1)[1].split(" s)")[0]) for line in lines]
    assert sum(caps) <= 600, caps  # the default BUDGET_S: no step is starved by design
    result = subprocess.run(["bash", str(SCRIPT), "nonsense"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and "unknown step" in result.stderr


def test_check_retries_a_case_that_fails_with_small_tiles(monkeypatch, capsys):
    """A case that cannot run with the given sizes is rerun with SAFE_BLOCKS; still a failure."""
    monkeypatch.setattr(attention, "SMALL_CHECK_CASES", attention.SMALL_CHECK_CASES[1:])
    assert not attention.check(small=True, blocks={"block_q": 8})
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| GQA")]
    assert len(rows) == 2
    assert "failed: UserError" in rows[0] and "must be >= 16" in rows[0]
    assert "(retry with SAFE_BLOCKS)" in rows[1] and rows[1].endswith("| ok |")


@pytest.mark.slow
def test_table_small_has_every_row_baselines_first(runs):
    rc, _ = runs["script"]
    text = (runs["out"] / "table.txt").read_text()
    assert rc == 0, text
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ")
            and "B1 " in line]
    names = [r[0].lstrip("| ") for r in rows]
    assert names[:3] == ["cuDNN (jax.nn.dot_product_attention)",
                         "cuDNN + unfused elementwise gate", "jax Pallas Triton mha"]
    assert names[-1] == "XLA reference (jit)"
    assert "pallas_gpu, gated elementwise + segment ids" in names
    for name, row in zip(names, rows):
        if name.startswith("cuDNN"):
            assert row[3] == "needs a GPU"
            continue
        assert float(row[3]) > 0 and float(row[5]) > 0, row  # fwd and fwd+bwd TFLOP/s
        assert float(row[6].rstrip(" |")) < 2e-2, row  # bf16 error vs the XLA reference
    assert "import grain" not in (BENCH / "attention.py").read_text()


def test_packed_rows_count_each_document_not_the_whole_row():
    shape = attention.Shape(1, 4096, 16, 16, 128)
    whole = 4 * 16 * 4096 ** 2 * 128 / 2  # 4 B H S^2 D / 2, by hand
    assert attention.causal_flops(shape) == whole
    four_docs = attention.packed_segment_ids(1, 4096)
    assert attention.causal_flops(shape, four_docs) == whole / 4  # 4 x (S/4)^2
    uneven = np.array([[0] * 1000 + [1] * 3096])
    assert attention.causal_flops(shape, uneven) == whole * (1000 ** 2 + 3096 ** 2) / 4096 ** 2


def test_xla_is_not_timed_at_16k_and_triton_mha_not_with_gqa():
    rows = {r.name: r for r in attention._implementations("gpu", small=False)}
    xla, mha = rows["XLA reference (jit)"], rows["jax Pallas Triton mha"]
    long, gqa = attention.FULL_SHAPES[2], attention.FULL_SHAPES[1]
    assert long.seq == 16384 and attention._why_not(xla, long).startswith("skipped")
    assert attention._why_not(xla, gqa) == ""
    assert gqa.kv_heads == 4 and attention._why_not(mha, gqa) == "no GQA"


@pytest.mark.slow
@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_preflight_memory_rehearses_on_this_cpu():
    """The memory step's pre-flight half runs here (deviceless, for an H200); the measured
    half says n/a without a GPU. About 20 s of CPU."""
    result = subprocess.run([sys.executable, str(BENCH / "preflight_memory.py"), "--small"],
                            cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    row = [line for line in result.stdout.splitlines() if line.startswith("| h200-1 ")]
    assert len(row) == 1 and "n/a (no GPU)" in row[0], result.stdout
    total = float(row[0].split("|")[2].split()[0])  # GiB
    assert 0.001 < total < 1.0, row  # the tiny arch: megabytes, not zero, not gigabytes
