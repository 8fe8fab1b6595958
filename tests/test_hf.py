"""Hugging Face import/export: logits against an independent float64 numpy forward of the HF
tensors, the packed q/gate layout (and the naive split failing), bit-exact round trips, and
one-line errors for bad folders. Tiny random folders are written here; nothing is downloaded.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

from gated_attention import hf
from gated_attention.config.run_config import ConfigError
from gated_attention.hf import config_map, safetensors_io, tensor_map
from tests.hf_fixtures import numpy_forward, random_tensors, tiny_hf_config, write_hf_folder

IDS = np.array([[3, 17, 5, 42, 8, 0, 23], [59, 1, 2, 33, 33, 7, 11]], np.int32)
CASES = [("baseline", False), ("g1_sdpa_headwise", True), ("g1_sdpa_elementwise", False)]


def _logits(model, ids=IDS) -> np.ndarray:
    return np.asarray(model(jnp.asarray(ids))[0], np.float64)


@pytest.mark.parametrize("variant,tied", CASES)
def test_logits_match_numpy_forward(tmp_path, variant, tied):
    config = tiny_hf_config(variant, tied=tied)
    tensors = random_tensors(config)
    model, run = hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))
    assert run.variant == variant and model.cfg.variant.name == variant
    assert model.cfg.tied_embeddings is tied
    expected = numpy_forward(config, tensors, IDS)
    np.testing.assert_allclose(_logits(model), expected, atol=1e-4, rtol=0)
    assert np.abs(expected).max() > 1.0  # the check is not vacuous


@pytest.mark.parametrize("variant", ["g1_sdpa_headwise", "g1_sdpa_elementwise"])
def test_naive_contiguous_split_fails_the_check(tmp_path, variant):
    config = tiny_hf_config(variant)
    tensors = random_tensors(config)
    model, _ = hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))
    ours = _logits(model)
    naive = numpy_forward(config, tensors, IDS, naive_gate_split=True)
    assert np.abs(ours - naive).max() > 1e-2  # runs without error, gives other logits


def test_moe_and_biases_match_numpy_forward(tmp_path):
    config = tiny_hf_config("baseline", moe=True)
    tensors = random_tensors(config, seed=1)
    model, run = hf.load_pretrained(write_hf_folder(tmp_path / "moe", config, tensors))
    assert model.cfg.is_moe and model.cfg.experts == (4, 2) and model.cfg.moe_renormalize
    np.testing.assert_allclose(_logits(model), numpy_forward(config, tensors, IDS), atol=1e-4)
    # the same experts stored fused, as transformers 5 may save them, load to the same model
    fused = {k: v for k, v in tensors.items() if ".experts." not in k}
    for i in range(config["num_hidden_layers"]):
        e = f"model.layers.{i}.mlp.experts."
        stack = lambda name, e=e: np.stack([tensors[f"{e}{j}.{name}.weight"]  # noqa: E731
                                            for j in range(config["num_experts"])])
        fused[e + "gate_up_proj"] = np.concatenate([stack("gate_proj"), stack("up_proj")], 1)
        fused[e + "down_proj"] = stack("down_proj")
    again, _ = hf.load_pretrained(write_hf_folder(tmp_path / "fused", config, fused))
    for name, value in hf.flat_params(again).items():
        np.testing.assert_array_equal(value, hf.flat_params(model)[name])

    config = tiny_hf_config("baseline", bias=True)
    tensors = random_tensors(config, seed=2)
    model, _ = hf.load_pretrained(write_hf_folder(tmp_path / "bias", config, tensors))
    assert model.cfg.qkv_bias and model.cfg.o_proj_bias
    np.testing.assert_allclose(_logits(model), numpy_forward(config, tensors, IDS), atol=1e-4)


def test_round_trip_is_bit_exact_and_sharded_folders_load(tmp_path):
    config = tiny_hf_config("g1_sdpa_elementwise", torch_dtype="bfloat16")
    tensors = {k: v.astype(ml_dtypes.bfloat16) for k, v in random_tensors(config).items()}
    source = write_hf_folder(tmp_path / "src", config, tensors)
    model, run = hf.load_pretrained(source)
    written = hf.save_pretrained(model, run, tmp_path / "out", max_shard_bytes=20_000)
    assert "model.safetensors.index.json" in written and len(written) > 3
    back = safetensors_io.read_tensors(tmp_path / "out")
    assert sorted(back) == sorted(tensors)
    for name, value in tensors.items():
        assert back[name].dtype == value.dtype
        assert back[name].tobytes() == value.tobytes(), name
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == config
    again, _ = hf.load_pretrained(tmp_path / "out")  # the sharded folder loads
    np.testing.assert_array_equal(_logits(again), _logits(model))
    with pytest.raises(ConfigError, match="exists"):  # nothing is overwritten
        hf.save_pretrained(model, run, tmp_path / "out")


def test_export_of_own_model_has_the_official_layout(tmp_path):
    from gated_attention.config.run_config import base_config, model_config
    from gated_attention.model.transformer import build_model

    config = base_config("tiny", "g1_sdpa_headwise")
    config.model.update(num_layers=2, d_model=32, num_heads=4, num_kv_heads=2, head_dim=8,
                        mlp_dim=40, vocab_size=64, tied_embeddings=False)
    model = build_model(model_config(config), seed=3)
    hf.save_pretrained(model, config, tmp_path)
    hf_config = json.loads((tmp_path / "config.json").read_text())
    assert hf_config["headwise_attn_output_gate"] and not hf_config["elementwise_attn_output_gate"]
    tensors = load_file(str(tmp_path / "model.safetensors"))
    assert tensors["model.layers.0.self_attn.q_proj.weight"].shape == (4 * 8 + 4, 32)
    np.testing.assert_allclose(numpy_forward(hf_config, tensors, IDS), _logits(model),
                               atol=1e-4)


def test_q_proj_split_is_per_kv_group():
    """Rows hand-labelled: group 0 = [q head 0, q head 1, gate 0, gate 1], group 1 likewise."""
    from gated_attention.config.run_config import base_config, model_config

    config = base_config("tiny", "g1_sdpa_headwise")
    config.model.update(d_model=1, num_heads=4, num_kv_heads=2, head_dim=2)
    cfg = model_config(config)
    rows = np.array([10, 11, 20, 21, 1, 2, 30, 31, 40, 41, 3, 4], np.float32)[:, None]
    queries, gate = tensor_map.split_q_proj(rows, cfg)
    np.testing.assert_array_equal(queries[0], [[10, 11], [20, 21], [30, 31], [40, 41]])
    np.testing.assert_array_equal(gate[0], [1, 2, 3, 4])
    np.testing.assert_array_equal(tensor_map.pack_q_proj(queries, gate, cfg), rows)


def test_rope_scaling_mapping():
    base = tiny_hf_config()
    theta, fields = config_map.rope_fields({**base, "rope_theta": 1e6, "rope_scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}})
    assert theta == 1e6
    assert fields == dict(type="yarn", factor=4.0, original_max_position=32768, beta_fast=32.0,
                          beta_slow=1.0, attention_factor=0.0)
    _, fields = config_map.rope_fields({**base, "rope_scaling": {"type": "linear",
                                                                 "factor": 2.0}})
    assert fields["type"] == "linear" and fields["factor"] == 2.0
    # transformers 5 keeps theta and the scaling together in rope_parameters
    theta, fields = config_map.rope_fields({"rope_parameters": {"rope_type": "default",
                                                                "rope_theta": 5e5}})
    assert theta == 5e5 and fields["type"] == "none"
    assert config_map.hf_rope_scaling(dict(type="linear", factor=2.0)) == {
        "rope_type": "linear", "factor": 2.0}


@pytest.mark.parametrize("scaling", [
    {"rope_type": "linear", "factor": 3.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16},
])
def test_scaled_rope_imports_match_numpy_forward(tmp_path, scaling):
    config = tiny_hf_config("g1_sdpa_headwise", rope_scaling=scaling, rope_theta=100.0)
    tensors = random_tensors(config, seed=4)
    model, run = hf.load_pretrained(write_hf_folder(tmp_path, config, tensors))
    assert model.cfg.rope_scaling.type == scaling["rope_type"]
    expected = numpy_forward(config, tensors, IDS)
    np.testing.assert_allclose(_logits(model), expected, atol=1e-4, rtol=0)
    plain = numpy_forward({**config, "rope_scaling": None}, tensors, IDS)
    assert np.abs(plain - expected).max() > 1e-2  # the scaling matters at these positions


def _folder(tmp_path, **overrides):
    config = tiny_hf_config(**overrides)
    return write_hf_folder(tmp_path, config, random_tensors(tiny_hf_config()))


@pytest.mark.parametrize("overrides,message", [
    (dict(architectures=["LlamaForCausalLM"], model_type="llama"),
     r"config\.json: architectures=\['LlamaForCausalLM'\] is not supported"),
    (dict(use_sliding_window=True), "use_sliding_window=true is not supported"),
    (dict(layer_types=["sliding_attention", "full_attention"]), "layer_types holds"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
     "rope_scaling.rope_type='dynamic' is not supported"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
     "rope_scaling.rope_type='llama3' is not supported"),
    (dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
    (dict(headwise_attn_output_gate=True, elementwise_attn_output_gate=True),
     "both true"),
    (dict(elementwise_attn_output_gate=True, attention_bias=True), "attention_bias=true"),
])
def test_unsupported_config_fields_are_refused_in_one_line(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        hf.load_pretrained(_folder(tmp_path, **overrides))
    assert "\n" not in str(err.value)


def test_bad_folders_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json not found"):
        hf.load_pretrained(tmp_path / "nowhere")
    config = tiny_hf_config()
    tensors = random_tensors(config)
    bad = {**tensors, "model.layers.1.self_attn.k_proj.weight": np.zeros((8, 32), np.float32)}
    with pytest.raises(ConfigError, match=r"model\.safetensors: tensor model\.layers\.1\.self_attn"
                                          r"\.k_proj\.weight has shape \(8, 32\), but config\.json "
                                          r"implies \(16, 32\)"):
        hf.load_pretrained(write_hf_folder(tmp_path / "shape", config, bad))
    missing = {k: v for k, v in tensors.items() if k != "model.norm.weight"}
    with pytest.raises(ConfigError, match="tensor model.norm.weight is missing"):
        hf.load_pretrained(write_hf_folder(tmp_path / "missing", config, missing))
    # gate flag set, but q_proj without gate rows: caught as a shape error, not wrong logits
    gated = tiny_hf_config("g1_sdpa_elementwise")
    with pytest.raises(ConfigError, match="q_proj.weight has shape"):
        hf.load_pretrained(write_hf_folder(tmp_path / "gates", gated, tensors))
    (tmp_path / "noweights").mkdir()
    (tmp_path / "noweights" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="holds neither model.safetensors"):
        hf.load_pretrained(tmp_path / "noweights")
