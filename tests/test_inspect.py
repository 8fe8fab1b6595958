"""Parameter and FLOP accounting against closed-form counts from the architecture shapes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gated_attention.config.run_config import base_config, model_config
from gated_attention.inspect import count_params, report, train_flops_per_token

ROOT = Path(__file__).parents[1]


def dense_1p7b_closed_form() -> tuple[int, int]:
    """(total params, params in norms) of the 28-layer dense 1.7B baseline, by hand."""
    V, D, L, H, KV, d, F = 151_936, 2048, 28, 16, 8, 128, 6144
    per_layer_matmul = D * H * d * 2 + D * KV * d * 2 + 3 * D * F
    per_layer_norms = 2 * d + 2 * D
    norms = L * per_layer_norms + D
    return V * D + L * per_layer_matmul + norms, norms


def test_dense_1p7b_parameter_count():
    total, _ = dense_1p7b_closed_form()
    assert total == 1_720_574_976
    assert count_params(model_config(base_config("dense_1p7b_28l", "baseline"))) == total


def test_train_flops_per_token_is_6n_plus_causal_attention():
    total, norms = dense_1p7b_closed_form()
    attention = 6 * 28 * 16 * 128 * 4096  # 3 x (QK^T + PV) x 1/2 causal, per token
    cfg = model_config(base_config("dense_1p7b_28l", "baseline"))
    assert train_flops_per_token(cfg, 4096) == 6 * (total - norms) + attention


def test_report_counts_gate_parameters_as_added():
    info = report(model_config(base_config("dense_1p7b_28l", "g1_sdpa_elementwise")), 4096)
    assert info["params_added_vs_baseline"] == 2048 * 16 * 128 * 28  # 117.4M
    assert info["modules"]["layers.*.attention.gate.kernel"] == 2048 * 16 * 128 * 28


def test_cli_prints_json():
    out = subprocess.run(
        [sys.executable, "-m", "gated_attention.inspect",
         "--config=configs/ablation.py:arch=tiny,variant=g1_sdpa_headwise", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    info = json.loads(out[out.index("{"):])
    assert info["variant"] == "g1_sdpa_headwise"
    assert info["params_added_vs_baseline"] == 128 * 4 * 4


def test_cli_rejects_unknown_variant_with_allowed_names():
    result = subprocess.run(
        [sys.executable, "-m", "gated_attention.inspect",
         "--config=configs/ablation.py:arch=tiny,variant=g7"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode != 0
    assert "variant='g7' is unknown; choose one of baseline" in result.stderr


def test_the_inspect_door_leaves_the_standard_librarys_inspect_alone():
    """gated_attention/inspect.py is only the `python -m gated_attention.inspect` door (the
    counting is in accounting.py); the package's own `import inspect` gets the stdlib."""
    import inspect as stdlib_inspect

    from gated_attention.ops import cudnn_packed

    assert cudnn_packed.inspect is stdlib_inspect
    assert stdlib_inspect.__file__.endswith("/inspect.py") and "gated_attention" not in (
        stdlib_inspect.__file__)



@pytest.mark.slow  # three memory plans of the 1.7B arch: about 13 s on the shared host
@pytest.mark.reference("independent")  # the overrides worked out from the config by hand
def test_a_plan_that_fits_on_none_listed_names_what_would_shrink_it():
    """The 1.7B arch's defaults (1024 x 4096 in one micro-batch, remat of the projections)
    fit no accelerator on one device or on 32 data-parallel ones: the table ends with the
    overrides that shrink it; with them (32-way fsdp, 64 micro-batches, full remat) it fits
    and says nothing more."""
    from gated_attention import inspect
    from gated_attention.compile import memory

    config = base_config("dense_1p7b_28l", "g1_sdpa_elementwise")
    info = report(model_config(config), config.data.seq_len)
    info["memory"] = memory.report(config, "data=1,fsdp=1", None)
    assert info["memory"]["fits_on"] == []
    assert inspect.format_table(info).splitlines()[-1] == (
        "to fit: fewer sequences per micro-batch (--config.train.grad_accum=2 or more; 1024 "
        "now); --config.model.remat=full (each block recomputed in the backward; "
        "dots_with_no_batch_dims_saveable now); more devices (--mesh=data=1,fsdp=N, or "
        "--num_devices)")
    info["memory"] = memory.report(config, "data=32,fsdp=1", None)
    assert info["memory"]["fits_on"] == []
    assert inspect.format_table(info).splitlines()[-1].startswith(
        "to fit: weights sharded over the data-parallel devices too (--mesh=data=1,fsdp=32); "
        "fewer sequences per micro-batch (--config.train.grad_accum=2 or more; 1024 now)")
    config.train.grad_accum = 64
    config.model.remat = "full"
    info["memory"] = memory.report(config, "data=1,fsdp=32", None)
    assert "TPU v5p" in info["memory"]["fits_on"]
    assert not inspect.format_table(info).splitlines()[-1].startswith("to fit")
