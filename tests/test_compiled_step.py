"""benchmarks/compiled_step.py and the lean step's compiled program, for a TPU target
(libtpu, deviceless): the 1-/2-layer extrapolation against a 3-layer compile, no float32
[batch, seq, vocab] logits in a chunked-loss step (the plain loss's step holds them: the
control), and the tied embedding's gradient kept per device as the parameter's shard in
bfloat16 (no whole [vocab, d_model] copy in float32)."""

import re
import sys
from pathlib import Path

import pytest

from gated_attention import config_lib
from gated_attention.target_compile import compile_step, tpu_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compiled_step  # noqa: E402 - benchmarks/compiled_step.py

pytestmark = pytest.mark.slow  # four TPU compiles of a tiny model: about a minute
VOCAB, D_MODEL, SEQ, BATCH, FSDP = 1024, 128, 256, 8, 4
LOGITS = f"f32[{BATCH // FSDP},{SEQ},{VOCAB}]"  # one device's share of whole float32 logits


def tiny_config(loss_chunk_size: int, layers: int):
    config = config_lib.base_config("tiny", "baseline")
    config.model.update(dtype="bfloat16", attention_impl="xla", num_layers=layers)
    config.mesh.update(fsdp=FSDP, data=1)
    config.train.update(batch_size=BATCH, eval_every=0, loss_chunk_size=loss_chunk_size)
    return config


@pytest.fixture(scope="module")
def mesh():
    return tpu_mesh("v5p:2x2x1", {"data": 1, "fsdp": FSDP})


@pytest.fixture(scope="module")
def chunked(mesh):
    hlo: dict[str, str] = {}
    return compiled_step.measure(tiny_config(256, layers=3), mesh, hlo), hlo


def test_extrapolated_flops_and_bytes_match_the_whole_compile(chunked):
    """Unrolled 3 layers compiled whole = U1 + 2 (U2 - U1), as the benchmark extrapolates."""
    result, _ = chunked
    assert result["layers"] == 3
    whole = result["full_compile"]
    assert result["flops"]["full"] == pytest.approx(whole["flops"], rel=0.01)
    assert result["bytes"]["full"] == pytest.approx(whole["bytes"], rel=0.05)
    assert result["flops"]["layers"] + result["flops"]["rest"] == pytest.approx(
        result["flops"]["full"])
    assert result["flops"]["per_layer"] > 0 and result["bytes"]["per_layer"] > 0
    table = compiled_step.format_table({"baseline": result})
    assert "total memory (GB)" in table and "FLOPs, per layer" in table


def test_chunked_loss_step_holds_no_whole_float32_logits(chunked, mesh):
    _, hlo = chunked
    assert LOGITS not in hlo["full"]
    tile = f"f32[{BATCH // FSDP},{SEQ},256]"
    assert tile in hlo["full"]  # the loss works a vocabulary tile at a time
    plain = compile_step(tiny_config(0, layers=1), mesh, "train").hlo_text
    assert LOGITS in plain  # the control: the plain loss materialises them


def test_embedding_gradient_is_the_parameters_shard_in_bfloat16(chunked):
    _, hlo = chunked
    shard = f"bf16[{VOCAB},{D_MODEL // FSDP}]"
    assert shard in hlo["full"]
    assert f"f32[{VOCAB},{D_MODEL}]" not in hlo["full"]  # no whole float32 table or gradient
    # the bfloat16 table is gathered once per step (one all-gather of the whole table)
    gathers = re.findall(rf"= bf16\[{VOCAB},{D_MODEL}\]\S* all-gather\(", hlo["full"])
    assert len(gathers) == 1, gathers
