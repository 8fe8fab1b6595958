"""The Qwen3-Next family in and out (Qwen3-Next, Qwen3.5, Qwen3.5-MoE and the multimodal Qwen3.5
folders' text model): logits against an independent float64 numpy forward written from
transformers' modeling code (tests/hf_fixtures.py), the other layout's q/gate split failing that
check, bit-exact round trips, export of this project's runs to every layout that can hold them,
and one-line refusals of what the model cannot reproduce. Tiny random folders; no network.
"""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gated_attention import hf
from gated_attention.config.run_config import ConfigError, base_config, model_config
from gated_attention.hf import safetensors_io
from gated_attention.model.transformer import build_model
from tests.hf_fixtures import (
    multimodal_config,
    multimodal_tensors,
    numpy_forward,
    numpy_next_forward,
    random_next_tensors,
    random_tensors,
    tiny_hf_config,
    tiny_next_config,
    write_hf_folder,
)

IDS = np.array([[3, 17, 5, 42, 8, 0, 23], [59, 1, 2, 33, 33, 7, 11]], np.int32)
LAYOUTS = [("qwen3_next", True, False), ("qwen3_next", False, True), ("qwen3_5", None, False),
           ("qwen3_5_moe", None, True)]


def _logits(model, ids=IDS) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids))[0], np.float64)


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield


@pytest.mark.parametrize("layout,moe,tied", LAYOUTS)
def test_logits_match_reference_and_the_other_split_fails(tmp_path, layout, moe, tied):
    config = tiny_next_config(layout, moe=moe, tied=tied)
    tensors = random_next_tensors(config, seed=len(layout))
    model, run = hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))
    cfg = model.cfg
    assert cfg.variant.name == "g1_sdpa_elementwise" and cfg.zero_centred_norm
    assert cfg.partial_rotary_factor == 0.5 and cfg.rotary_dim == 4
    assert cfg.is_moe == (layout == "qwen3_5_moe" or bool(moe))
    assert bool(cfg.shared_expert_mlp_dim) == cfg.is_moe
    # the gate is its own tensor: q_proj and the gate kernel are [D, heads, head_dim] each
    attention = model.layers[0].attention
    assert attention.q_proj[...].shape == (32, 4, 8)
    assert attention.gate.kernel[...].shape == (32, 4, 8)
    ours = _logits(model)
    expected = numpy_next_forward(config, tensors, IDS)
    np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
    assert np.abs(expected).max() > 1.0
    wrong = numpy_next_forward(config, tensors, IDS, split="kv_group")
    assert np.abs(ours - wrong).max() > 1e-2  # the official release's split: other logits


@pytest.mark.parametrize("layout", ["qwen3_next", "qwen3_5", "qwen3_5_moe"])
def test_round_trip_is_bit_exact(tmp_path, layout):
    config = tiny_next_config(layout, moe=layout != "qwen3_5")
    tensors = random_next_tensors(config, seed=3)
    model, run = hf.load_pretrained(write_hf_folder(tmp_path / "src", config, tensors))
    hf.save_pretrained(model, run, tmp_path / "out")
    back = safetensors_io.read_tensors(tmp_path / "out")
    assert sorted(back) == sorted(tensors)
    for name, value in tensors.items():
        assert back[name].tobytes() == value.tobytes(), name
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == config


@pytest.mark.parametrize("layout", ["qwen3_5", "qwen3_5_moe"])
def test_multimodal_folder_loads_its_text_model(tmp_path, layout):
    text = tiny_next_config(layout)
    tensors = random_next_tensors(text, seed=4)
    folder = write_hf_folder(tmp_path / "mm", multimodal_config(text, layout),
                             multimodal_tensors(tensors))
    model, run = hf.load_pretrained(folder)
    np.testing.assert_allclose(_logits(model), numpy_next_forward(text, tensors, IDS),
                               atol=1e-4, rtol=0)
    hf.save_pretrained(model, run, tmp_path / "out")  # exported as the text-only causal LM
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    assert written["architectures"] == text["architectures"]
    back = safetensors_io.read_tensors(tmp_path / "out")
    assert sorted(back) == sorted(tensors)
    assert all(back[n].tobytes() == v.tobytes() for n, v in tensors.items())


def _own_run(variant: str, **model: object):
    config = base_config("tiny", variant)
    config.model.update(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                        mlp_dim=40, vocab_size=64, tied_embeddings=False, **model)
    run_model = build_model(model_config(config), seed=5)
    # trained norms are not all ones: move them off their initial value
    for block in run_model.layers:
        for norm in (block.attn_norm, block.ffn_norm, block.attention.q_norm,
                     block.attention.k_norm):
            norm.scale[...] = norm.scale[...] * 1.25
    return run_model, config


@pytest.mark.parametrize("variant,layout", [("g1_sdpa_elementwise", "qwen3_next"),
                                            ("g1_sdpa_headwise", "qwen3_5")])
def test_own_run_exports_to_the_next_layouts_and_loads_back(tmp_path, variant, layout):
    model, config = _own_run(variant)
    hf.save_pretrained(model, config, tmp_path / "out", layout=layout)
    written = json.loads((tmp_path / "out" / "config.json").read_text())
    tensors = safetensors_io.read_tensors(tmp_path / "out")
    assert written["model_type"] == ("qwen3_next" if layout == "qwen3_next" else "qwen3_5_text")
    assert written["partial_rotary_factor"] == 1.0
    ours = _logits(model)
    np.testing.assert_allclose(numpy_next_forward(written, tensors, IDS), ours, atol=1e-4)
    again, run = hf.load_pretrained(tmp_path / "out")
    np.testing.assert_allclose(_logits(again), ours, atol=1e-5, rtol=0)
    hf.save_pretrained(again, run, tmp_path / "again")  # and out again, bit for bit
    for name, value in safetensors_io.read_tensors(tmp_path / "again").items():
        assert value.tobytes() == tensors[name].tobytes(), name


def test_export_refuses_what_a_layout_cannot_hold(tmp_path):
    model, config = _own_run("baseline")
    with pytest.raises(ConfigError, match=r"variant='baseline' has no qwen3_next form; layouts "
                                          r"that can hold it: official, qwen3$"):
        hf.save_pretrained(model, config, tmp_path / "a", layout="qwen3_next")
    gated, gated_config = _own_run("g1_sdpa_elementwise")
    with pytest.raises(ConfigError, match="variant='g1_sdpa_elementwise' has no qwen3 form"):
        hf.save_pretrained(gated, gated_config, tmp_path / "b", layout="qwen3")
    with pytest.raises(ConfigError, match="qwen3_5_moe is MoE only"):
        hf.save_pretrained(gated, gated_config, tmp_path / "c", layout="qwen3_5_moe")
    with pytest.raises(ConfigError, match="--to='llama' is not a Hugging Face layout"):
        hf.save_pretrained(gated, gated_config, tmp_path / "d", layout="llama")
    moe, moe_config = _own_run("g1_sdpa_elementwise", num_experts=4, experts_per_token=2,
                               expert_mlp_dim=16)
    with pytest.raises(ConfigError, match="model.shared_expert_mlp_dim=0: qwen3_next's MoE"):
        hf.save_pretrained(moe, moe_config, tmp_path / "e", layout="qwen3_next")
    # an imported Qwen3-Next model rotates a quarter of each head: no official form
    config = tiny_next_config("qwen3_5")
    imported, run = hf.load_pretrained(write_hf_folder(tmp_path / "src", config,
                                                       random_next_tensors(config)))
    with pytest.raises(ConfigError, match="model.partial_rotary_factor=0.5 has no official"):
        hf.save_pretrained(imported, run, tmp_path / "f", layout="official")
    assert not any((tmp_path / n).exists() for n in "abcdef")  # nothing written


REFUSED = [
    (dict(layer_types=["full_attention", "linear_attention"]), "layer_types[1]='linear_attention'"),
    (dict(layer_types=None), "full_attention_interval=4 (no layer_types)"),
    (dict(mtp_num_hidden_layers=1), "mtp_num_hidden_layers=1 is not supported"),
    (dict(attention_bias=True), "attention_bias=true is not supported"),
    (dict(mlp_only_layers=[0]), "mlp_only_layers=[0] mixes dense and MoE layers"),
    (dict(decoder_sparse_step=2), "decoder_sparse_step=2 mixes dense and MoE layers"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (dict(rope_parameters={"rope_type": "llama3", "rope_theta": 1e4}),
     "rope_parameters.rope_type='llama3' is not supported"),
    (dict(partial_rotary_factor=0.1), "rotates 0 of head_dim=8 channels"),
]


@pytest.mark.parametrize("override,message", REFUSED)
def test_what_the_model_cannot_reproduce_is_refused_in_one_line(tmp_path, override, message):
    config = {k: v for k, v in tiny_next_config("qwen3_next").items() if k not in override}
    config.update({k: v for k, v in override.items() if v is not None})
    folder = write_hf_folder(tmp_path, config, random_next_tensors(tiny_next_config()))
    with pytest.raises(ConfigError) as err:
        hf.load_pretrained(folder)
    assert message in str(err.value) and "config.json" in str(err.value)
    assert "\n" not in str(err.value)


def test_an_mtp_head_in_the_weights_is_refused(tmp_path):
    config = tiny_next_config("qwen3_5")
    tensors = {**random_next_tensors(config), "mtp.fc.weight": np.zeros((32, 64), np.float32)}
    with pytest.raises(ConfigError, match="mtp.fc.weight is a multi-token-prediction head"):
        hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))


def test_per_head_split_fails_on_the_official_layout(tmp_path):
    """The negative control the other way: the official release read as Qwen3-Next reads it."""
    config = tiny_hf_config("g1_sdpa_elementwise")
    tensors = random_tensors(config)
    model, _ = hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))
    ours = _logits(model)
    np.testing.assert_allclose(ours, numpy_forward(config, tensors, IDS), atol=1e-4)
    assert np.abs(ours - numpy_forward(config, tensors, IDS, per_head_split=True)).max() > 1e-2


def test_zero_centred_norm_and_partial_rotary_against_float64(x64):
    """The two model pieces the layout needs, against numpy in float64 (scoped 64-bit)."""
    from flax import nnx

    from gated_attention.model.layers.norms import RMSNorm
    from gated_attention.model.layers.rope import apply_rope

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 5, 3, 8))
    w = 0.3 * rng.standard_normal(8)
    norm = RMSNorm(8, rngs=nnx.Rngs(0), zero_centred=True)
    assert np.all(np.asarray(norm.scale[...]) == 0)  # initialised to 0 (an identity scale)
    norm.scale[...] = jnp.asarray(w, jnp.float32)
    want = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * (1 + w)
    np.testing.assert_allclose(np.asarray(norm(jnp.asarray(x, jnp.float32))), want, atol=1e-5)
    pos = np.arange(5)[None]
    got = np.asarray(apply_rope(jnp.asarray(x, jnp.float32), jnp.asarray(pos), 100.0,
                                rotary_dim=4))
    inv = 1.0 / 100.0 ** (np.arange(0, 4, 2) / 4)
    ang = np.concatenate([pos[0][:, None] * inv] * 2, -1)[None, :, None]
    x1, x2 = x[..., :2], x[..., 2:4]
    rot = np.concatenate([-x2, x1], -1)
    want = np.concatenate([x[..., :4] * np.cos(ang) + rot * np.sin(ang), x[..., 4:]], -1)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.array_equal(got[..., 4:], x[..., 4:].astype(np.float32))  # passed through


def test_analysis_sees_the_gate_as_its_own_tensor(tmp_path):
    """gate_scores (what every analysis reads) of an imported Qwen3.5 model are sigmoid of the
    gate rows of q_proj, per head [b, s, heads, head_dim], computed here from the HF tensors."""
    from gated_attention.model import capture

    config = tiny_next_config("qwen3_5")
    tensors = random_next_tensors(config, seed=7)
    model, _ = hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))
    model(jnp.asarray(IDS), capture=("gate_scores",))
    layers = capture.collect(model)
    eps = config["rms_norm_eps"]
    x = np.asarray(tensors["model.embed_tokens.weight"], np.float64)[IDS]
    w = np.asarray(tensors["model.layers.0.input_layernorm.weight"], np.float64)
    h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * (1 + w)
    rows = np.asarray(tensors["model.layers.0.self_attn.q_proj.weight"], np.float64)
    gate = (h @ rows.T).reshape(*IDS.shape, 4, 2, 8)[..., 1, :]  # [b, s, head, d]
    scores = np.asarray(layers[0]["gate_scores"], np.float64)
    assert scores.shape == (*IDS.shape, 4, 8)
    np.testing.assert_allclose(scores, 1 / (1 + np.exp(-gate)), atol=1e-5)


@pytest.mark.parametrize("fields,message", [
    (dict(partial_rotary_factor=0.1), "model.partial_rotary_factor=0.1 must be in (0, 1]"),
    (dict(partial_rotary_factor=1.5), "model.partial_rotary_factor=1.5 must be in (0, 1]"),
    (dict(shared_expert_mlp_dim=16), "model.shared_expert_mlp_dim=16 needs an MoE arch"),
])
def test_the_new_model_fields_are_checked_in_one_line(fields, message):
    config = base_config("tiny", "g1_sdpa_elementwise")
    config.model.update(fields)
    with pytest.raises(ConfigError) as err:
        model_config(config)
    assert message in str(err.value) and "\n" not in str(err.value)
