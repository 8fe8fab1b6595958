"""experiments/telemetry_cost.py for a TPU target (libtpu, deviceless): one telemetry call of a
3-layer model extrapolated from its 1- and 2-layer compiles, U1 + 2 (U2 - U1), equals the
3-layer model compiled whole (an independent program: no extrapolation in it); the
first-token pass traced in its training blocks keeps loops, which are found and listed with
their trip counts (the one-block trace has none: the control); a bad --block is refused
before anything compiles; a recipe with grad_accum > 1 compiles its telemetry within the
train step's own temporaries."""

import pytest

from experiments import telemetry_cost
from gated_attention.config import run_config
from gated_attention.core.errors import UserError

SEQ, BLOCK, FSDP = 128, 32, 4


def tiny_config(layers: int):
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(num_layers=layers, scan_layers=False, d_model=64, num_heads=2,
                        num_kv_heads=2, head_dim=32, mlp_dim=128, vocab_size=256,
                        attention_impl="xla")
    config.data.seq_len = SEQ
    config.mesh.update(fsdp=FSDP, data=1)
    config.train.update(batch_size=FSDP, eval_every=0, loss_chunk_size=0)
    return config


@pytest.fixture(scope="module")
def mesh():
    from gated_attention.compile.target import tpu_mesh

    return tpu_mesh("v5p:2x2x1", {"data": 1, "fsdp": FSDP})


@pytest.mark.reference("two_paths")  # extrapolated vs compiled whole, both this package's
@pytest.mark.slow  # four TPU compiles of a 64-wide forward: about 35 CPU-seconds
@pytest.mark.needs("libtpu")
def test_extrapolated_telemetry_matches_the_three_layer_compile(mesh):
    result = telemetry_cost.extrapolated_telemetry(tiny_config(3), mesh)
    whole = telemetry_cost.compile_telemetry(tiny_config(3), mesh)
    assert result["layers"] == 3 and result["loops_counted_once"] == []
    assert whole["loops_counted_once"] == []
    assert result["flops_per_layer"] > 0 and result["bytes_per_layer"] > 0
    assert result["flops"] > 1.5 * result["u1"]["flops"]  # the extra layers are counted
    assert result["flops"] == pytest.approx(whole["flops"], rel=0.01)
    assert result["bytes"] == pytest.approx(whole["bytes"], rel=0.05)

    blockwise = telemetry_cost.compile_telemetry(tiny_config(1), mesh, block=BLOCK)
    trips = SEQ // BLOCK  # the query-block map and the key-block scan: 4 trips each
    assert blockwise["loops_counted_once"] and set(blockwise["loops_counted_once"]) == {trips}
    # counted once, the blockwise pass shows one of its 16 block pairs: fewer FLOPs
    assert blockwise["flops"] < result["u1"]["flops"]


@pytest.mark.slow  # a train step and a telemetry compiled by libtpu: about 20 CPU-seconds
@pytest.mark.needs("libtpu")
@pytest.mark.reference("independent")  # the compiler's own memory figures
def test_telemetry_of_a_grad_accum_recipe_fits_in_the_step_temporaries(mesh):
    """batch 128 in 32 micro-batches of 4 rows (one per chip): the telemetry forward reads one
    micro-batch, so the compiler's temporaries for it stay within the train step's own (whose
    backward holds one micro-batch's activations). Read over the whole batch, as it was, they
    were 36.2 MB against the step's 22.9 MB."""
    from gated_attention.compile import preflight
    from gated_attention.compile import target as target_compile

    config = tiny_config(2)
    config.model.scan_layers = True
    config.data.seq_len = 256
    config.train.update(batch_size=128, grad_accum=32)
    step = target_compile.compile_step(config, mesh, "train")
    tele = preflight.compile_telemetry(config, mesh)
    assert tele.memory["temporaries"] <= step.memory["temporaries"]
    assert tele.memory["total"] <= step.memory["total"]


@pytest.mark.reference("error_message")
def test_bad_block_is_refused_before_compiling():
    with pytest.raises(UserError, match="--block=-1: must be 0"):
        telemetry_cost.main(["--config=configs/ablation.py:arch=tiny", "--topology=v5p:2x2x1",
                             "--block=-1"])
