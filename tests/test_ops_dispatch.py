"""ops.resolve_impl ("auto" never drops a feature) and the model running on a Pallas kernel."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gated_attention import ops
from gated_attention.config import run_config
from gated_attention.model.transformer import Transformer
from gated_attention.ops import block_sizes

# What each implementation can do, restated from its module docstring (not read from
# ops/choices.py, so a wrong capability there fails here).
CAN = {
    "cudnn": dict(normalizers={"softmax"}, segments=False, dtypes={"bfloat16", "float16"},
                  cross=True),
    "splash": dict(normalizers={"softmax", "softmax_off_by_one", "learned_sink"},
                   segments=True, dtypes={"float32", "bfloat16"}, cross=False),
    "pallas_gpu": dict(normalizers=set(ops.NORMALIZERS), segments=True,
                       dtypes={"float32", "bfloat16"}, cross=False),
    "pallas_tpu": dict(normalizers=set(ops.NORMALIZERS), segments=True,
                       dtypes={"float32", "bfloat16"}, cross=False),
}
# The expected pick per platform and request, written out by hand: (normalizer, segments,
# dtype, equal lengths) -> impl.
EXPECTED = {
    "gpu": {("softmax", False, "bfloat16", True): "cudnn",
            ("softmax", True, "bfloat16", True): "pallas_gpu",
            ("softmax", False, "float32", True): "pallas_gpu",
            ("softpick", False, "bfloat16", True): "pallas_gpu",
            ("learned_sink", True, "bfloat16", True): "pallas_gpu",
            ("softmax", False, "bfloat16", False): "cudnn",
            ("learned_sink", False, "bfloat16", False): "xla"},
    "tpu": {("softmax", True, "bfloat16", True): "splash",
            ("softmax_off_by_one", False, "float32", True): "splash",
            ("learned_sink", True, "bfloat16", True): "splash",
            ("softpick", True, "bfloat16", True): "pallas_tpu",
            ("softmax", False, "bfloat16", False): "xla"},
    "cpu": {("softmax", True, "bfloat16", True): "xla",
            ("softpick", False, "float32", True): "xla"},
}


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
def test_auto_picks_per_platform_and_feature(platform):
    for (normalizer, segments, dtype, same), want in EXPECTED[platform].items():
        seg = jnp.zeros((1, 4), jnp.int32) if segments else None
        with jax.enable_x64(False):
            got = ops.resolve_impl("auto", segment_ids=seg, normalizer=normalizer,
                                   platform=platform, dtype=jnp.dtype(dtype), same_length=same)
        assert got == want, (platform, normalizer, segments, dtype, same)


@pytest.mark.parametrize("platform", ["cpu", "gpu", "tpu"])
@pytest.mark.parametrize("x64", [False, True])
def test_auto_never_drops_a_feature(platform, x64):
    for normalizer, segments, dtype, same in itertools.product(
            ops.NORMALIZERS, (False, True), ("float32", "bfloat16"), (True, False)):
        seg = jnp.zeros((1, 4), jnp.int32) if segments else None
        with jax.enable_x64(x64):
            impl = ops.resolve_impl("auto", segment_ids=seg, normalizer=normalizer,
                                    platform=platform, dtype=jnp.dtype(dtype), same_length=same)
        assert impl in ops.IMPLS and impl != "auto"
        if impl in CAN:
            can = CAN[impl]
            assert normalizer in can["normalizers"] and (can["segments"] or not segments)
            assert dtype in can["dtypes"] and (can["cross"] or same)
        assert impl in ("xla", "cudnn", f"pallas_{platform}") or (impl, platform) == (
            "splash", "tpu")
        if impl == "splash":
            assert not x64, "jax's splash kernel does not trace with x64 on"


def test_choices_table_is_data_that_names_real_implementations():
    from gated_attention.ops import choices, dispatch

    for platform, order in choices.PREFERENCE.items():
        assert order[-1] == "xla" and set(order) <= set(dispatch.MODULES), platform
    assert set(choices.CAPABILITIES) <= set(dispatch.MODULES)
    with pytest.raises(ValueError, match="platform='npu'.*gpu, tpu, cpu"):
        choices.choose("npu", normalizer="softmax", segments=False, dtype=None,
                       same_length=True)


def test_block_size_table_and_overrides():
    sizes = block_sizes.block_sizes_for(128, kind="h200")
    assert (sizes["block_q"], sizes["block_kv"]) == (128, 64)
    assert block_sizes.block_sizes_for(128, kind="tpu")["block_q"] % 128 == 0
    # The model config's two keys set the backward tiles too unless those are given.
    over = block_sizes.block_sizes_for(64, {"block_q": 32, "block_kv": 16}, kind="h200")
    assert (over["block_q_dq"], over["block_kv_dkv"]) == (32, 16)
    warps = block_sizes.block_sizes_for(64, {"num_warps": 2}, kind="h200")
    assert (warps["num_warps"], warps["num_warps_bwd"], warps["num_stages_bwd"]) == (2, 2, 3)
    both = block_sizes.block_sizes_for(64, {"num_warps": 2, "num_warps_bwd": 8}, kind="h200")
    assert (both["num_warps"], both["num_warps_bwd"]) == (2, 8)
    for kind, rows in block_sizes.TABLE.items():  # every row names every key
        assert all(set(row) == set(block_sizes.BLOCK_KEYS) for row in rows.values()), kind
    with pytest.raises(ValueError, match="unknown device kind 'v100x'"):
        block_sizes.block_sizes_for(64, kind="v100x")
    with pytest.raises(ValueError, match="must be a power of two"):
        block_sizes.block_sizes_for(64, {"block_kv": 48}, kind="cpu")


def _tiny_model(impl: str) -> Transformer:
    config = run_config.base_config("tiny", "g1_sdpa_elementwise")
    config.attention.normalizer = "learned_sink"
    config.model.num_layers = 1
    config.model.attention_impl = impl
    config.model.block_sizes.block_q = 16
    config.model.block_sizes.block_kv = 16
    return Transformer(run_config.model_config(config), rngs=nnx.Rngs(0))


def test_model_on_pallas_gpu_matches_xla():
    """A gated, learned-sink model with packed sequences: same logits on both attention paths."""
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, 1024, (2, 40)), jnp.int32)
    segments = jnp.asarray(np.repeat([[0, 1, 2, 3]], 10, axis=1).reshape(1, 40).repeat(2, 0),
                           jnp.int32)
    positions = jnp.tile(jnp.arange(10), 4)[None].repeat(2, 0)
    logits = {}
    for impl in ("xla", "pallas_gpu"):
        model = _tiny_model(impl)
        # Non-zero sinks so the sink term matters.
        model.layers[0].attention.sink_logits[...] = jnp.linspace(-1.0, 1.0, 4, dtype=jnp.float32)
        logits[impl] = jax.jit(lambda t, p, s, m=model: m(t, positions=p, segment_ids=s)[0])(
            tokens, positions, segments)
    scale = float(jnp.max(jnp.abs(logits["xla"])))
    assert float(jnp.max(jnp.abs(logits["pallas_gpu"] - logits["xla"]))) < 1e-4 * scale


def test_auto_and_interpret_follow_the_target_platform_not_the_host():
    """A TPU program compiled on a CPU host must get the TPU's choices (Mosaic, no interpreter)."""
    from gated_attention.ops import _flash_common

    assert jax.default_backend() == "cpu"
    assert ops.resolve_impl("auto", segment_ids=None, normalizer="softmax") == "xla"
    assert _flash_common.resolve_interpret(None) is True
    with ops.compiling_for("tpu"):
        assert ops.target_platform() == "tpu"
        assert ops.resolve_impl("auto", segment_ids=None, normalizer="softmax") != "xla"
        assert _flash_common.resolve_interpret(None) is False
    with ops.compiling_for("gpu"):
        assert ops.resolve_impl("auto", segment_ids=None, normalizer="softmax",
                                dtype=jnp.bfloat16) == "cudnn"
    assert ops.target_platform() == "cpu"
    with pytest.raises(ValueError, match="platform='tpux'.*cpu, gpu, tpu"):
        with ops.compiling_for("tpux"):
            pass


@pytest.mark.parametrize("impl", ["chunked", "pallas_tpu", "splash"])
def test_arguments_are_checked_once_per_call(impl, monkeypatch):
    """ops.attention checks at its door and calls the kernel's trusted entry point; a direct
    call of the kernel's public `attention` checks once too."""
    from gated_attention.ops import arguments, dispatch

    calls = []
    real = arguments.check_arguments

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(arguments, "check_arguments", counted)
    monkeypatch.setattr(dispatch, "check_arguments", counted)
    q = jnp.ones((1, 128, 2, 128), jnp.float32)
    jax.eval_shape(lambda q: ops.attention(q, q, q, impl=impl), q)
    assert len(calls) == 1
    kernel = __import__(f"gated_attention.ops.{impl}", fromlist=["attention"])
    jax.eval_shape(lambda q: kernel.attention(q, q, q), q)
    assert len(calls) == 2


def test_a_bad_argument_is_a_user_error_naming_what_is_allowed():
    from gated_attention.core.errors import UserError

    q = jnp.ones((1, 8, 2, 16), jnp.float32)
    with pytest.raises(UserError, match=r"^normalizer='sofmax' is not allowed; choose one of "
                                        r"softmax, softmax_off_by_one, learned_sink, softpick$"):
        ops.attention(q, q, q, normalizer="sofmax")
    with pytest.raises(UserError, match=r"^impl='flash' is not allowed; choose one of xla, "):
        ops.attention(q, q, q, impl="flash")
    with pytest.raises(UserError, match=r"query heads \(2\) must be a multiple of kv heads"):
        ops.attention(q, jnp.ones((1, 8, 3, 16)), jnp.ones((1, 8, 3, 16)))
