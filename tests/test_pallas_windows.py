"""Sliding-window attention in the project's Pallas kernels (Mosaic for TPU, Triton for GPU).

- values against the float64 numpy loops (tests/numpy_reference.py's window mask), values and
  gradients against the float64 XLA reference, in interpret mode on this CPU: windows with
  segment ids, GQA, every gate kind, learned sinks, off-by-one, softpick, odd lengths and
  tiles of different sizes per axis;
- blocks outside the window are skipped, not masked: the kernels' block ranges against the
  hand-built mask, and NaNs planted in keys/values (or queries) that lie wholly outside some
  rows' windows stay out of those rows' outputs and gradients (a kernel that only masked
  would multiply them by zero weights and return NaN; the XLA reference does);
- deviceless compiles, forward and backward, as training calls the kernels (causal, segment
  ids, bfloat16, GQA, elementwise gate): Mosaic for a v5e TPU, Triton down to a cubin for an
  H200.
"""

from __future__ import annotations

import dataclasses
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import numpy_reference as nref
import pytest
from jax.experimental.pallas import tpu as pltpu

from gated_attention import ops
from gated_attention.ops import _flash_common as fc
from gated_attention.ops import pallas_gpu, reference
from gated_attention.ops.testing import (
    FAST_COMPILE,
    random_segment_ids,
    relative_error,
    relative_errors,
)

ACTIVATIONS = {"sigmoid": lambda g: 1 / (1 + np.exp(-g)),
               "silu": lambda g: g / (1 + np.exp(-g)),
               "ns_sigmoid": lambda g: 0.5 + 0.5 / (1 + np.exp(-g)),
               "identity": lambda g: g}


@dataclasses.dataclass(frozen=True)
class WindowCase:
    impl: str  # "pallas_tpu" or "pallas_gpu"
    window: int
    normalizer: str = "softmax"
    gate: str | None = "elementwise"
    activation: str = "sigmoid"
    segments: bool = True
    causal: bool = True
    seq: int = 45
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    block_q: int = 8
    block_kv: int = 8
    tol: float = 2e-5  # float32 against float64

    def __str__(self) -> str:
        return (f"{self.impl}-w{self.window}-{self.normalizer}-{self.gate}-{self.activation}"
                f"-seg{int(self.segments)}-causal{int(self.causal)}-s{self.seq}"
                f"-h{self.heads}/{self.kv_heads}-bq{self.block_q}-bkv{self.block_kv}")


def kernel(impl: str):
    """The kernel through the public dispatcher in interpret mode (Mosaic kernels inside the
    documented TPU interpret mode)."""
    def call(q, k, v, **kwargs):
        if impl == "pallas_tpu":
            with pltpu.force_tpu_interpret_mode():
                return ops.attention(q, k, v, impl=impl, interpret=True, **kwargs)
        return ops.attention(q, k, v, impl=impl, interpret=True, **kwargs)
    return call


def inputs(case: WindowCase, seed: int = 0) -> dict[str, np.ndarray | None]:
    rng = np.random.default_rng(seed)
    b, s, h, n, d = 1, case.seq, case.heads, case.kv_heads, case.head_dim
    gate_shape = {"elementwise": (b, s, h, d), "headwise": (b, s, h), None: None}[case.gate]
    return dict(
        q=rng.standard_normal((b, s, h, d)), k=rng.standard_normal((b, s, n, d)),
        v=rng.standard_normal((b, s, n, d)),
        gate=None if gate_shape is None else rng.standard_normal(gate_shape),
        sink=rng.standard_normal(h) if case.normalizer == "learned_sink" else None,
        segment_ids=random_segment_ids(rng, b, s) if case.segments else None,
        probe=rng.standard_normal((b, s, h, d)),
    )


def value_and_grads(fn, case: WindowCase, x: dict, **kwargs):
    """Output and the gradients of <output, probe> w.r.t. q, k, v, gate and sink."""
    names = [n for n in ("q", "k", "v", "gate", "sink") if x[n] is not None]

    def loss(diff):
        a = {**x, **diff}
        out = fn(a["q"], a["k"], a["v"], gate=a["gate"], sink_logits=a["sink"],
                 segment_ids=x["segment_ids"], gate_activation=case.activation,
                 causal=case.causal, normalizer=case.normalizer, window=case.window, **kwargs)
        return jnp.sum(out.astype(x["probe"].dtype) * x["probe"]), out

    (_, out), grads = jax.value_and_grad(loss, has_aux=True)({n: x[n] for n in names})
    return out, grads


def numpy_output(case: WindowCase, x: dict) -> np.ndarray:
    """The output by loops in float64 (softmax family): windowed weights @ v, then the gate."""
    probs = nref.attention_probs_window(x["q"], x["k"], window=case.window,
                                        segment_ids=x["segment_ids"],
                                        normalizer=case.normalizer, sink=x["sink"])
    group = case.heads // case.kv_heads
    v = np.repeat(x["v"], group, axis=2)
    out = np.einsum("bhst,bthd->bshd", probs, v)
    if case.gate == "elementwise":
        out = out * ACTIVATIONS[case.activation](x["gate"])
    elif case.gate == "headwise":
        out = out * ACTIVATIONS[case.activation](x["gate"])[..., None]
    return out


# GQA 2 as 2 query heads on 1 kv head, not 4 on 2: the interpreter's cost grows with the grid,
# heads times blocks (4.3 against 2.4 CPU-s for the first case's run), and the grouping is the
# same.
CASES = [
    # TPU: packed rows, GQA 2, odd length (padding), elementwise sigmoid gate, window 11.
    WindowCase("pallas_tpu", 11, heads=2, kv_heads=1),
    # TPU: learned sink, GQA 4, headwise silu gate, a q tile twice the kv tile, no segments.
    WindowCase("pallas_tpu", 16, "learned_sink", "headwise", "silu", segments=False,
               seq=40, kv_heads=1, block_q=16, block_kv=8),
    # TPU: softpick (numpy loops cover the softmax family only: the XLA reference here),
    # ns_sigmoid gate, kv tile twice the q tile. (In bfloat16 softpick's gradients are 2-3%
    # off the float64 reference with or without a window; bfloat16 is compiled below.)
    WindowCase("pallas_tpu", 13, "softpick", "elementwise", "ns_sigmoid", seq=48,
               heads=2, kv_heads=1, block_q=8, block_kv=16),
    # GPU: off-by-one, non-causal window (keys ahead visible, the left edge bounded), segments.
    WindowCase("pallas_gpu", 20, "softmax_off_by_one", None, causal=False, seq=64,
               block_q=16, block_kv=16, heads=2, kv_heads=2),
    # GPU: learned sink, GQA 2, headwise sigmoid gate, odd length, window 19.
    WindowCase("pallas_gpu", 19, "learned_sink", "headwise", seq=61, heads=2, kv_heads=1,
               block_q=16, block_kv=16),
]


# The Mosaic kernels run in the TPU interpreter (host callbacks): 20-30 s of CPU a case.
SLOW_IMPLS = ("pallas_tpu",)


@pytest.mark.parametrize("case", [
    pytest.param(c, marks=pytest.mark.slow) if c.impl in SLOW_IMPLS else c for c in CASES],
    ids=str)
def test_windowed_kernel_matches_the_float64_references(case: WindowCase):
    x = {n: None if a is None else jnp.asarray(
        a, jnp.int32 if n == "segment_ids" else jnp.float32) for n, a in inputs(case).items()}
    x64 = {n: None if a is None else np.asarray(a, np.int32 if n == "segment_ids"
                                               else np.float64) for n, a in x.items()}
    with jax.enable_x64(True):  # jitted: 1.1 CPU-s a case against 4-5 eagerly, op by op
        want_out, want_grads = jax.jit(lambda x: value_and_grads(reference.attention, case, x))(
            {n: None if a is None else jnp.asarray(a) for n, a in x64.items()})
        assert want_out.dtype == jnp.float64
    blocks = dict(block_q=case.block_q, block_kv=case.block_kv, block_q_dq=case.block_q,
                  block_kv_dq=case.block_kv, block_q_dkv=case.block_q,
                  block_kv_dkv=case.block_kv)
    compiled = jax.jit(lambda x: value_and_grads(kernel(case.impl), case, x,
                                                 block_sizes=blocks)).lower(x).compile(
        compiler_options=FAST_COMPILE)
    out, grads = compiled(x)
    errors = relative_errors((out, grads), (want_out, want_grads))
    if case.normalizer != "softpick" and case.causal:
        errors["out vs numpy"] = relative_error(out, numpy_output(case, x64))
    bad = {name: e for name, e in errors.items() if not e <= case.tol}
    assert not bad, f"errors above {case.tol}: {bad}"


def visible_tiles(mask: np.ndarray, bq: int, bkv: int) -> np.ndarray:
    """[nq, nkv]: tiles holding at least one visible (query, key) pair of the [S, S] mask."""
    s = mask.shape[0]
    return mask.reshape(s // bq, bq, s // bkv, bkv).any(axis=(1, 3))


@pytest.mark.parametrize("causal", [True, False])
def test_block_ranges_are_the_tiles_the_hand_built_window_mask_touches(causal):
    """The kernels' loop bounds / index-map ranges visit exactly the tiles holding a visible
    pair of the loop-built window mask, no more: far fewer than the causal mask alone."""
    s, bq, bkv, window = 96, 8, 16, 20
    tiles = visible_tiles(nref.window_mask(s, s, window, causal=causal), bq, bkv)
    kv_lo, kv_hi, q_lo, q_hi = (np.asarray(a)[0] for a in fc.block_ranges(
        None, 1, s, s, bq, bkv, causal, window))
    for i in range(s // bq):
        seen = np.flatnonzero(tiles[i])
        assert (kv_lo[i], kv_hi[i]) == (seen.min(), seen.max() + 1)
    for j in range(s // bkv):
        seen = np.flatnonzero(tiles[:, j])
        assert (q_lo[j], q_hi[j]) == (seen.min(), seen.max() + 1)
    visited = int(np.sum(kv_hi - kv_lo))
    assert visited == tiles.sum()  # the window's tiles form one band per row
    # by hand: the causal mask alone visits 42 of these 72 tiles, no mask all 72
    assert visited == (26 if causal else 56)


@pytest.mark.parametrize("s, bq, bkv, window", [(96, 8, 16, 20), (128, 16, 8, 9),
                                                 (64, 16, 16, 1), (192, 32, 32, 40)])
def test_the_tpu_grid_is_shortened_to_the_blocks_a_window_can_touch(s, bq, bkv, window):
    """The Mosaic kernels' inner grid axis has window_steps steps, not every block: the bound
    holds for every q block (kv block) the hand-built mask touches, and is reached."""
    p = fc.Problem(batch=1, seq=s, padded=s, heads=1, kv_heads=1, head_dim=8, padded_dim=8,
                   causal=True, normalizer="softmax", gate_kind=None,
                   gate_activation="sigmoid", has_segments=False, window=window)
    tiles = visible_tiles(nref.window_mask(s, s, window), bq, bkv)
    kv_steps, q_steps = fc.window_steps(p, bq, bkv, s // bkv), fc.window_steps(p, bkv, bq,
                                                                               s // bq)
    assert tiles.sum(axis=1).max() <= kv_steps < s // bkv
    assert tiles.sum(axis=0).max() <= q_steps < s // bq
    assert tiles.sum(axis=1).max() >= kv_steps - 1  # tight to within one block
    assert fc.window_steps(dataclasses.replace(p, window=0), bq, bkv, 7) == 7
    assert fc.window_steps(dataclasses.replace(p, causal=False), bq, bkv, 7) == 7


def test_unmasked_tiles_lie_wholly_inside_the_window():
    """The tiles the kernels run without a mask hold only visible pairs (hand-built mask)."""
    s, bq, bkv, window = 64, 8, 16, 21
    p = fc.Problem(batch=1, seq=s, padded=s, heads=1, kv_heads=1, head_dim=8, padded_dim=8,
                   causal=True, normalizer="softmax", gate_kind=None,
                   gate_activation="sigmoid", has_segments=False, window=window)
    mask = nref.window_mask(s, s, window).reshape(s // bq, bq, s // bkv, bkv)
    full = mask.all(axis=(1, 3))
    for i in np.arange(s // bq, dtype=np.int32):  # int32 indices, as inside the kernels
        start = int(fc.unmasked_kv_start(p, i, bq, bkv, 0))
        end = int(fc.unmasked_kv_end(p, i, bq, bkv, s // bkv))
        assert [j for j in range(s // bkv) if start <= j < end] == list(np.flatnonzero(full[i]))
    for j in np.arange(s // bkv, dtype=np.int32):
        start = int(fc.unmasked_q_start(p, j, bq, bkv, 0))
        end = int(fc.unmasked_q_end(p, j, bq, bkv, s // bq))
        assert [i for i in range(s // bq) if start <= i < end] == list(
            np.flatnonzero(full[:, j]))


SKIP = {"pallas_tpu": dict(block=8, seq=48, window=12), "pallas_gpu": dict(block=16, seq=96,
                                                                           window=24)}


def _skip_setup(impl: str):
    c = SKIP[impl]
    blk, s, w = c["block"], c["seq"], c["window"]
    rng = np.random.default_rng(0)
    # One head: what is skipped is blocks along the sequence; a second head doubled the
    # interpreter's grid.
    q, k, v = (jnp.asarray(rng.standard_normal((1, s, 1, 16)), jnp.float32) for _ in range(3))
    sizes = dict(block_q=blk, block_kv=blk, block_q_dq=blk, block_kv_dq=blk, block_q_dkv=blk,
                 block_kv_dkv=blk)
    # q blocks from `clear` on see nothing of kv block 0: (i * blk) - (blk - 1) >= w
    clear = -(-(w + blk - 1) // blk) * blk
    return blk, s, w, q, k, v, sizes, clear


@pytest.mark.parametrize("impl", [pytest.param("pallas_tpu", marks=pytest.mark.slow),
                                  "pallas_gpu"])
def test_kv_blocks_outside_the_window_are_never_visited(impl):
    """NaN values in kv block 0: rows whose q block lies past that block's reach stay finite
    in the output and in dq (forward and dq passes skip the block); the XLA reference, which
    masks, multiplies the NaNs by zero weights and returns NaN there."""
    blk, s, w, q, k, v, sizes, clear = _skip_setup(impl)
    v_nan = v.at[:, :blk].set(jnp.nan)

    def loss(fn, q, v, **kw):
        out = fn(q, k, v, window=w, **kw)
        return jnp.sum(out[:, clear:]), out

    run = jax.jit(jax.value_and_grad(lambda q, v: loss(kernel(impl), q, v, block_sizes=sizes),
                                     has_aux=True))
    (_, out), dq = run(q, v_nan)
    assert np.isfinite(np.asarray(out[:, clear:])).all()
    assert np.isfinite(np.asarray(dq[:, clear:])).all()
    # one compile for both reference calls (eagerly each op compiled per call)
    ref = jax.jit(jax.value_and_grad(lambda q, v: loss(reference.attention, q, v), has_aux=True))
    (_, want), want_dq = ref(q, v)  # finite values: the truth
    np.testing.assert_allclose(out[:, clear:], want[:, clear:], rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(dq[:, clear:], want_dq[:, clear:], rtol=2e-4, atol=2e-5)
    (_, masked), masked_dq = ref(q, v_nan)
    assert np.isnan(np.asarray(masked[:, clear:])).all()  # masking alone does not keep NaN out
    assert np.isnan(np.asarray(masked_dq[:, clear:])).any()


@pytest.mark.parametrize("impl", [pytest.param("pallas_tpu", marks=pytest.mark.slow),
                                  "pallas_gpu"])
def test_q_blocks_outside_the_window_are_never_visited_by_the_dkv_pass(impl):
    """NaN queries in the last q block, the loss over the other rows: dk/dv of the kv blocks
    that block cannot see stay finite (the dk/dv pass skips it; the reference does not)."""
    blk, s, w, q, k, v, sizes, _ = _skip_setup(impl)
    last = s - blk
    q_nan = q.at[:, last:].set(jnp.nan)
    # kv blocks j with last - ((j + 1) * blk - 1) >= w are wholly outside the last block's reach
    reach = (last - w + 1) // blk * blk  # keys before this are such blocks

    def loss(fn, k, v, **kw):
        return jnp.sum(fn(q_nan, k, v, window=w, **kw)[:, :last])

    dk, dv = jax.jit(jax.grad(lambda k, v: loss(kernel(impl), k, v, block_sizes=sizes),
                              argnums=(0, 1)))(k, v)
    assert reach >= blk
    assert np.isfinite(np.asarray(dk[:, :reach])).all()
    assert np.isfinite(np.asarray(dv[:, :reach])).all()
    # one compile for both reference calls, the finite queries and the NaN ones
    ref = jax.jit(jax.grad(lambda q, k, v: jnp.sum(reference.attention(
        q, k, v, window=w)[:, :last]), argnums=(1, 2)))
    want_dk, want_dv = ref(q, k, v)
    np.testing.assert_allclose(dk[:, :reach], want_dk[:, :reach], rtol=2e-4, atol=2e-5)
    np.testing.assert_allclose(dv[:, :reach], want_dv[:, :reach], rtol=2e-4, atol=2e-5)
    masked_dk, _ = ref(q_nan, k, v)
    assert np.isnan(np.asarray(masked_dk[:, :reach])).any()


def test_window_is_refused_with_the_implementations_that_serve_it():
    q = jnp.zeros((1, 16, 2, 16))
    with pytest.raises(ValueError, match=r"impl='cudnn_packed' has no sliding window "
                                         r"\(window=4\); choose one of xla, chunked, "
                                         r"pallas_gpu, pallas_tpu, splash or auto"):
        ops.attention(q, q, q, impl="cudnn_packed", window=4)
    with pytest.raises(ValueError, match=r"window=-2 must be >= 0"):
        pallas_gpu.attention(q, q, q, window=-2, interpret=True)


def test_auto_takes_a_pallas_kernel_for_a_window_where_it_is_the_first_that_serves_it():
    auto = functools.partial(ops.dispatch.resolve_impl, "auto", segment_ids=None, window=8)
    assert auto(normalizer="softmax", platform="gpu", dtype=jnp.bfloat16) == "pallas_gpu"
    assert auto(normalizer="softmax", platform="gpu", dtype=jnp.float32) == "pallas_gpu"
    # splash (first on TPU) has no softpick: the project's Mosaic kernel serves it
    assert auto(normalizer="softpick", platform="tpu", dtype=jnp.bfloat16) == "pallas_tpu"
    assert auto(normalizer="softmax", platform="cpu", dtype=jnp.float32) == "xla"


def test_cost_estimate_counts_only_the_pairs_inside_the_window():
    """visible_pairs against the hand-built mask's count (the FLOPs XLA is told)."""
    for causal in (True, False):
        for s, w in ((40, 11), (40, 0), (12, 30)):
            p = fc.Problem(batch=2, seq=s, padded=s, heads=3, kv_heads=1, head_dim=8,
                           padded_dim=8, causal=causal, normalizer="softmax", gate_kind=None,
                           gate_activation="sigmoid", has_segments=False, window=w)
            assert fc.visible_pairs(p) == 6 * nref.window_mask(s, s, w, causal=causal).sum()


# ----------------------------------------------------------------------------- real targets

TRAINING = dict(window=256, seq=1024)  # packed bf16 rows, GQA 2, elementwise sigmoid gate


@pytest.mark.needs("libtpu")
def test_windowed_kernel_compiles_for_a_tpu_forward_and_backward():
    """Mosaic compiles the forward, dq and dk/dv kernels with the window, for v5e, as a
    training step calls them (about 5 s)."""
    import flash_cases

    text = flash_cases.tpu_compiled_text("v5e:2x2", seq=TRAINING["seq"],
                                         window=TRAINING["window"])
    assert text.count("tpu_custom_call") >= 3
    for name in ("gated_flash_fwd", "gated_flash_dq", "gated_flash_dkv"):
        assert name in text


@pytest.mark.needs("jax_plugins.xla_cuda12")
def test_windowed_kernel_compiles_for_an_h200_forward_and_backward():
    """Triton -> PTX -> cubin for an H200 (no GPU): forward and dk/dv (with dq) kernels."""
    from gated_attention.compile import gpu_targets
    from gated_attention.compile import target as target_compile
    from gated_attention.ops.target import compiling_for

    device = target_compile.gpu_devices(gpu_targets.parse_accelerator("h200-1"))[0]
    on = lambda shape, dtype=jnp.bfloat16: jax.ShapeDtypeStruct(  # noqa: E731
        shape, dtype, sharding=jax.sharding.SingleDeviceSharding(device))
    s = TRAINING["seq"]
    q, kv, seg = on((1, s, 4, 128)), on((1, s, 2, 128)), on((1, s), jnp.int32)

    def loss(q, k, v, gate, seg):
        out = pallas_gpu.attention(q, k, v, gate=gate, segment_ids=seg, interpret=False,
                                   window=TRAINING["window"])
        return jnp.sum(out.astype(jnp.float32))

    with compiling_for("gpu", device_kind=device.device_kind):
        compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3))).lower(
            q, kv, kv, q, seg).compile()
    calls = re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())
    assert calls.count("__gpu$xla.gpu.triton") == 2, calls
