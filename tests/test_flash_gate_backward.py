"""The kernels' gate backward from the gated output alone (sigmoid gates) against float64
autodiff of out = o * act(g), including saturated gates where act(g) underflows."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention.ops import _flash_common as fc
from gated_attention.ops import pallas_gpu


@pytest.mark.parametrize("activation", ["sigmoid", "ns_sigmoid"])
@pytest.mark.parametrize("headwise", [False, True])
def test_gate_backward_from_output_matches_float64_autodiff(activation, headwise):
    rng = np.random.default_rng(0)
    b, s, h, d = 2, 5, 3, 4
    o = rng.standard_normal((b, s, h, d))
    g = rng.standard_normal((b, s, h) if headwise else (b, s, h, d)) * 4
    g.flat[:3] = [-60.0, 0.0, 60.0]  # sigmoid(-60) ~ 1e-26: o / act(g) would blow up
    dout = rng.standard_normal((b, s, h, d))

    def gated(o_, g_):
        s_ = jax.nn.sigmoid(g_)
        scores = s_ if activation == "sigmoid" else 0.5 + 0.5 * s_
        return o_ * (scores[..., None] if headwise else scores)

    with jax.enable_x64(True):  # the reference in float64; the kernel code below in float32
        out, vjp = jax.vjp(gated, jnp.asarray(o), jnp.asarray(g))
        do_ref, dg_ref = vjp(jnp.asarray(dout))
        assert out.dtype == do_ref.dtype == jnp.float64
    delta_ref = np.einsum("bshd,bshd->bhs", np.asarray(do_ref), o)

    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    do, dg, delta = fc.gate_backward_from_output(f32(dout), f32(out), f32(g), activation)
    for got, want in ((do, do_ref), (dg, dg_ref), (delta, delta_ref)):
        assert np.all(np.isfinite(np.asarray(got)))
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want),
                                   rtol=1e-5, atol=1e-5 * float(np.max(np.abs(want))))


@pytest.mark.parametrize(("activation", "writes_ungated"),
                         [("sigmoid", False), ("ns_sigmoid", False), ("silu", True),
                          ("identity", True)])
def test_forward_writes_the_ungated_output_only_when_the_backward_needs_it(
        activation, writes_ungated):
    """The forward's residual outputs: (out, lse) for sigmoid gates, plus o for the others."""
    q = jnp.ones((1, 32, 2, 16), jnp.float32)
    gate = jnp.zeros_like(q)
    static = pallas_gpu._static(q, q, gate, activation, None, True, "softmax", True, None)
    lowered = jax.jit(lambda *a: pallas_gpu._forward(static, *a, True)).trace(
        q, q, q, None, gate, None).jaxpr
    (call,) = [e for e in lowered.eqns if e.primitive.name == "pallas_call"]
    assert len(call.outvars) == (3 if writes_ungated else 2)
    assert fc.stores_ungated(static.problem) is writes_ungated
