"""The variant registry: every paper row by its table name, and clear errors for bad ones."""

import json
from pathlib import Path

import pytest

from gated_attention.config.run_config import ConfigError, base_config, model_config
from gated_attention.model.variants import VARIANTS, AttentionVariant, VariantError, get_variant

PAPER = json.loads((Path(__file__).parents[1] / "experiments" / "paper_tables.json").read_text())


def test_every_paper_row_is_registered_under_its_table_name():
    names = set()
    for table in ("table1_moe", "table2_dense", "table3_nonlinearity",
                  "table4_sink_and_activation", "table6_switch_head"):
        names |= {row["name"] for row in PAPER[table]}
    assert len(names) == 26
    assert names <= set(VARIANTS)
    assert {"softmax_off_by_one", "learned_sink", "softpick"} <= set(VARIANTS)


@pytest.mark.parametrize("name, fields", [
    ("g1_sdpa_elementwise", dict(gate_position="sdpa", granularity="elementwise",
                                 activation="sigmoid", combine="multiply")),
    ("g2_value_headwise", dict(gate_position="value", granularity="headwise")),
    ("g1_sdpa_head_shared", dict(sharing="head_shared")),
    ("g1_sdpa_additive_silu", dict(combine="add", activation="silu")),
    ("g1_sdpa_additive_identity", dict(combine="add", activation="identity")),
    ("g1_ns_sigmoid", dict(activation="ns_sigmoid")),
    ("g1_input_independent", dict(gate_input="constant")),
    ("g1_sdpa_rmsnorm", dict(gate_position="none", sdpa_transform="rmsnorm")),
    ("g5_dense_output", dict(gate_position="dense_output")),
    ("switch_v_8top2", dict(switch_target="v", switch_experts=8, switch_top_k=2)),
    ("baseline_sandwich_norm", dict(sandwich_norm=True, gate_position="none")),
    ("q_heads_48", dict(q_heads_multiplier=1.5)),
])
def test_registry_fields(name, fields):
    variant = VARIANTS[name]
    for key, value in fields.items():
        assert getattr(variant, key) == value, (name, key)


def test_unknown_variant_lists_the_allowed_names():
    with pytest.raises(VariantError, match=r"variant='g9' is unknown; choose one of baseline, "):
        get_variant("g9")


@pytest.mark.parametrize("fields, message", [
    (dict(gate_position="G7"), "gate_position='G7' is not allowed; choose one of none, sdpa"),
    (dict(granularity="tokenwise"), "granularity='tokenwise' is not allowed"),
    (dict(activation="tanh"), "activation='tanh' is not allowed; choose one of sigmoid, silu"),
    (dict(gate_position="sdpa", granularity="headwise", sharing="head_shared"),
     "granularity='headwise' with sharing='head_shared'"),
    (dict(gate_position="dense_output", granularity="headwise"), "G5"),
    (dict(switch_target="v", switch_experts=4, switch_top_k=5), "switch_top_k=5 must be in"),
    (dict(normalizer="sparsemax"), "normalizer='sparsemax' is not allowed"),
])
def test_impossible_variants_raise_naming_the_field(fields, message):
    with pytest.raises(VariantError, match=message.replace("(", r"\(")):
        AttentionVariant(**fields)


def test_gate_position_aliases():
    assert AttentionVariant(gate_position="G1").gate_position == "sdpa"
    assert AttentionVariant(gate_position="G5").gate_position == "dense_output"


def test_heads_not_divisible_by_kv_heads_is_refused_before_building():
    config = base_config("tiny", "q_heads_48")
    config.model.num_kv_heads = 4  # 4 heads x 1.5 = 6 query heads over 4 kv heads
    with pytest.raises(ConfigError, match="num_heads=6 is not divisible by num_kv_heads=4"):
        model_config(config)


def test_extra_experts_needs_an_moe_arch():
    with pytest.raises(ConfigError, match="adds experts, which needs an MoE arch"):
        model_config(base_config("tiny", "add_4_experts"))


def test_config_override_of_a_single_axis():
    config = base_config("tiny", "g1_sdpa_elementwise")
    config.attention.activation = "silu"
    assert model_config(config).variant.activation == "silu"
    config.attention.activation = "relu"
    with pytest.raises(ConfigError, match="attention: activation='relu' is not allowed"):
        model_config(config)


def test_unknown_arch_names_the_field():
    with pytest.raises(ConfigError, match="arch='huge' is not allowed; choose one of tiny, small"):
        base_config("huge", "baseline")


@pytest.mark.parametrize("name, fields", [
    ("g1_input_12", dict(gate_position="sdpa", gate_input_dims=12)),
    ("g1_input_16th", dict(gate_input_fraction=1 / 16)),
    ("g1_rank_8", dict(gate_rank=8)),
    ("g1_two_sigmoid_zero_init", dict(gate_scale=2.0, gate_init="zeros", activation="sigmoid")),
    ("g1_bias_init_2", dict(gate_bias=True, gate_bias_init=2.0)),
    ("g1_g2", dict(gate_position="sdpa", extra_gate_positions="value")),
    ("xsa", dict(gate_position="none", exclusive_self_attention=True)),
    ("xsa_g1", dict(gate_position="sdpa", exclusive_self_attention=True)),
    ("swa_32_g1", dict(gate_position="sdpa", window=32)),
])
def test_registry_fields_beyond_the_paper(name, fields):
    variant = VARIANTS[name]
    for key, value in fields.items():
        assert getattr(variant, key) == value, (name, key)
    assert variant.gate_positions == (() if not variant.gated else
                                      ("sdpa", *(("value",) if name == "g1_g2" else ())))


def test_a_beyond_axis_overrides_from_the_config():
    config = base_config("tiny", "g1_sdpa_elementwise")
    config.attention.window = 16
    config.attention.gate_rank = 4
    cfg = model_config(config)
    assert (cfg.variant.window, cfg.variant.gate_rank) == (16, 4)
    config.attention.gate_init = "ones"
    with pytest.raises(ConfigError, match="attention: gate_init='ones' is not allowed"):
        model_config(config)
