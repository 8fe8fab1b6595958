"""benchmarks/compiled_step.py and the lean step's compiled program, for a TPU target
(libtpu, deviceless): the 1-/2-layer extrapolation against a 3-layer compile, the chunked
loss's tiles each counted (its FLOPs those of the plain loss plus the backward's recomputed
logits, by hand; counted once per loop, as XLA does, they fall short: the control), the
token-tiled loss's FLOPs those of the plain loss (no recomputation), no float32
[batch, seq, vocab] logits in a step with either chunked loss (the plain loss's step holds
them: the control), the tied embedding's gradient kept per device as the parameter's shard in
bfloat16 (no whole [vocab, d_model] copy in float32), no float32 copy of q or k stored
by QK-norm and RoPE (two separate steps store one: the control), and the token tiles'
logits stored in bfloat16 with train.logits_dtype=compute, and G1's gate projection adding
one matmul to the step, its forward (differentiated apart from q_proj: three, the control)."""

import re
import sys
from pathlib import Path

import jax.numpy as jnp
import pytest

from gated_attention.compile.target import compile_step, tpu_mesh
from gated_attention.config import run_config
from gated_attention.model.layers.attention import Attention
from gated_attention.model.layers.norms import RMSNorm
from gated_attention.model.layers.rope import inverse_frequencies

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import compiled_step  # noqa: E402 - benchmarks/compiled_step.py

pytestmark = pytest.mark.slow  # ten TPU compiles of a tiny model: about 150 s
VOCAB, D_MODEL, SEQ, BATCH, FSDP = 1024, 128, 256, 8, 4
LOGITS = f"f32[{BATCH // FSDP},{SEQ},{VOCAB}]"  # one device's share of whole float32 logits


TOKEN_TILE = 64  # sequence positions per tile of the token-tiled loss: SEQ / 64 = 4 tiles


def tiny_config(loss_chunk_size: int, layers: int, scan_layers: bool = False,
                loss_tiles: str = "vocab", variant: str = "baseline"):
    config = run_config.base_config("tiny", variant)
    config.model.update(dtype="bfloat16", attention_impl="xla", num_layers=layers,
                        scan_layers=scan_layers)
    config.mesh.update(fsdp=FSDP, data=1)
    config.train.update(batch_size=BATCH, eval_every=0, loss_chunk_size=loss_chunk_size,
                        loss_tiles=loss_tiles)
    return config


@pytest.fixture(scope="module")
def mesh():
    return tpu_mesh("v5p:2x2x1", {"data": 1, "fsdp": FSDP})


@pytest.fixture(scope="module")
def chunked(mesh):
    hlo: dict[str, str] = {}
    return compiled_step.measure(tiny_config(256, layers=3, scan_layers=True), mesh, hlo), hlo


@pytest.fixture(scope="module")
def token_tiled(mesh):
    hlo: dict[str, str] = {}
    config = tiny_config(TOKEN_TILE, layers=3, scan_layers=True, loss_tiles="tokens")
    return compiled_step.measure(config, mesh, hlo), hlo


@pytest.fixture(scope="module")
def plain(mesh):
    hlo: dict[str, str] = {}
    return compiled_step.measure(tiny_config(0, layers=3), mesh, hlo), hlo


def test_extrapolated_flops_and_bytes_match_the_whole_compile(plain):
    """Unrolled 3 layers compiled whole = U1 + 2 (U2 - U1), as the benchmark extrapolates
    (the plain loss: a program without loops, which the cost analysis counts whole)."""
    result, hlo = plain
    assert compiled_step.loops(hlo["full"]) == [] and result["loops_counted_once"] == []
    assert result["layers"] == 3
    whole = result["full_compile"]
    assert result["flops"]["full"] == pytest.approx(whole["flops"], rel=0.01)
    assert result["bytes"]["full"] == pytest.approx(whole["bytes"], rel=0.05)
    assert result["flops"]["layers"] + result["flops"]["rest"] == pytest.approx(
        result["flops"]["full"])
    assert result["flops"]["per_layer"] > 0 and result["bytes"]["per_layer"] > 0
    table = compiled_step.format_table({"baseline": result})
    assert "total memory (GB)" in table and "FLOPs, per layer" in table


def test_chunked_loss_flops_count_every_vocabulary_tile(chunked, plain):
    """The chunked loss does the plain loss's three [tokens, d_model] x [d_model, vocab]
    matmuls plus one, its backward's recomputed logits: with every tile counted, the steps'
    FLOPs differ by that matmul. The chunked step as compiled (scanned layers, and two loops
    of VOCAB / 256 = 4 tiles whose bodies XLA's cost analysis counts once) falls far short:
    the control."""
    tiles = VOCAB // 256
    result, hlo = chunked
    # the layers' scan (forward, backward) and the loss's tiles (forward, backward)
    assert sorted(compiled_step.loops(hlo["full"])) == [3, 3, tiles, tiles]
    assert compiled_step.loops(hlo["u1"]) == [] and result["loops_counted_once"] == []
    logits_matmul = 2 * (BATCH // FSDP) * SEQ * D_MODEL * VOCAB  # per chip, by hand
    reference = plain[0]["flops"]["full"] + logits_matmul
    assert result["flops"]["full"] == pytest.approx(reference, rel=0.01)
    # As compiled, with the layers' loop counted 3 times (per layer from U1/U2) but the
    # tiles' loops once: the count before every loop was weighted by its trips.
    looped = result["full_compile"]["flops"] + 2 * result["flops"]["per_layer"]
    assert reference - looped > 2 * logits_matmul  # 4 x (1 - 1/4) matmuls missing
    assert "loops counted once (trips)  " in compiled_step.format_table({"chunked": result})


def test_token_tiled_loss_flops_are_the_plain_losss(token_tiled, plain):
    """The gradient computed in the forward pass: the logits matmul once and its two
    gradient matmuls, as the plain loss, with every tile counted (one loop of SEQ / 64 = 4
    tiles in the step as compiled, beside the layers' scan)."""
    result, hlo = token_tiled
    assert sorted(compiled_step.loops(hlo["full"])) == [3, 3, SEQ // TOKEN_TILE]
    assert compiled_step.loops(hlo["u1"]) == [] and result["loops_counted_once"] == []
    assert result["flops"]["full"] == pytest.approx(plain[0]["flops"]["full"], rel=0.01)


def test_token_tiled_loss_step_holds_no_whole_float32_logits(token_tiled):
    _, hlo = token_tiled
    assert LOGITS not in hlo["full"]
    # the loss works a few positions at a time, over the whole vocabulary
    assert f"f32[{BATCH // FSDP},{TOKEN_TILE},{VOCAB}]" in hlo["full"]
    # the table's gradient: the bfloat16 shard per tile, added up on the float32 shard
    assert f"bf16[{VOCAB},{D_MODEL // FSDP}]" in hlo["full"]
    assert f"f32[{VOCAB},{D_MODEL}]" not in hlo["full"]


def test_token_tiles_with_compute_dtype_logits_store_them_in_bfloat16(token_tiled, mesh):
    """train.logits_dtype=compute: the tile's logits matmul writes bfloat16 and no float32
    tile of logits is stored (the float32 step stores one: the control)."""
    config = tiny_config(TOKEN_TILE, layers=3, scan_layers=True, loss_tiles="tokens")
    config.train.logits_dtype = "compute"
    tile = f"{BATCH // FSDP},{TOKEN_TILE},{VOCAB}"

    def stored_tiles(hlo_text: str) -> set[str]:
        return {shape for _, shape, _ in compiled_step.stored_arrays(hlo_text)
                if shape.endswith(f"[{tile}]")}

    assert "f32[" + tile + "]" in stored_tiles(token_tiled[1]["full"])  # the control
    assert stored_tiles(compile_step(config, mesh, "train").hlo_text) == {f"bf16[{tile}]"}


def test_chunked_loss_step_holds_no_whole_float32_logits(chunked, plain):
    _, hlo = chunked
    assert LOGITS not in hlo["full"]
    tile = f"f32[{BATCH // FSDP},{SEQ},256]"
    assert tile in hlo["full"]  # the loss works a vocabulary tile at a time
    assert LOGITS in plain[1]["full"]  # the control: the plain loss materialises them


def test_embedding_gradient_is_the_parameters_shard_in_bfloat16(chunked):
    _, hlo = chunked
    shard = f"bf16[{VOCAB},{D_MODEL // FSDP}]"
    assert shard in hlo["full"]
    assert f"f32[{VOCAB},{D_MODEL}]" not in hlo["full"]  # no whole float32 table or gradient
    # the bfloat16 table is gathered once per step (one all-gather of the whole table)
    gathers = re.findall(rf"= bf16\[{VOCAB},{D_MODEL}\]\S* all-gather\(", hlo["full"])
    assert len(gathers) == 1, gathers


def float32_q_or_k(hlo_text: str) -> list[tuple[str, str, str]]:
    """Stored float32 arrays of one device's q or k, or of their rotary halves, other than
    the XLA attention's own float32 matmul outputs (its gradients for q and k)."""
    model = run_config.model_config(tiny_config(0, layers=1))
    rows = f"{BATCH // FSDP},{SEQ}"
    shapes = {f"f32[{rows},{h},{w}]" for h in model.heads
              for w in (model.head_dim, model.head_dim // 2)}
    return [array for array in compiled_step.stored_arrays(hlo_text)
            if array[1] in shapes and not array[2].endswith("dot_general")]


def test_qk_norm_and_rope_store_no_float32_q_or_k(plain, mesh, monkeypatch):
    """QK-norm and RoPE run as one float32 expression rounded once (forward) and hand back
    the compute dtype's cotangent (backward): no float32 q or k is written between them.
    The control: the norm rounded to bfloat16 and RoPE applied after, as two steps, stores
    RoPE's float32 copy of the normalised q and k."""
    assert float32_q_or_k(plain[1]["full"]) == []

    def two_steps(self, x, positions, base, scaling, rotary_dim):
        """The norm rounded to x's dtype, then RoPE on the whole of it cast to float32."""
        y32 = self(x).astype(jnp.float32)
        d = rotary_dim or x.shape[-1]
        inv_freq = jnp.asarray(inverse_frequencies(d, base, scaling), jnp.float32)
        angles = positions.astype(jnp.float32)[..., None] * inv_freq
        sin, cos = jnp.sin(angles)[:, :, None, :], jnp.cos(angles)[:, :, None, :]
        y1, y2 = jnp.split(y32[..., :d], 2, axis=-1)
        out = jnp.concatenate([y1 * cos - y2 * sin, y2 * cos + y1 * sin, y32[..., d:]], -1)
        return out.astype(x.dtype)

    monkeypatch.setattr(RMSNorm, "normalize_and_rotate", two_steps)
    control = float32_q_or_k(compile_step(tiny_config(0, layers=1), mesh, "train").hlo_text)
    model = run_config.model_config(tiny_config(0, layers=1))
    whole = {f"f32[{BATCH // FSDP},{SEQ},{h},{model.head_dim}]" for h in model.heads}
    assert {shape for _, shape, _ in control} >= whole


def matmuls(hlo_text: str) -> int:
    """Matmuls of an optimized TPU program (each dot is one convolution instruction)."""
    return len(re.findall(r"= \S+ convolution\(", hlo_text))


def test_g1_gate_projection_adds_one_matmul_with_q_projs_backward(plain, mesh, monkeypatch):
    """The G1 gate's projection and q_proj form their input and weight gradients in one matmul
    each (layers/paired_projection.py): against the baseline, G1's one-layer step has one
    matmul more, the gate's forward. The control: the two projections differentiated apart
    add three (forward, input gradient, weight gradient)."""
    def g1_matmuls() -> int:
        config = compiled_step.unrolled(tiny_config(0, layers=3, variant="g1_sdpa_elementwise"), 1)
        return matmuls(compile_step(config, mesh, "train").hlo_text)

    baseline = matmuls(plain[1]["u1"])
    assert g1_matmuls() == baseline + 1

    def apart(self, x, fuse_gate):
        return self._project(self.q_proj, x, "q_bias"), self.gate.logits(x) if fuse_gate else None

    monkeypatch.setattr(Attention, "_project_q_and_gate", apart)
    assert g1_matmuls() == baseline + 3
