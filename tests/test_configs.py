"""Every file in configs/ loads, validates, and keeps to its own table's rows."""

import importlib.util
from pathlib import Path

import pytest

from gated_attention.config_lib import ConfigError, validate_run_config
from gated_attention.variants import VARIANTS

CONFIGS = Path(__file__).parents[1] / "configs"


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"config_{name}", CONFIGS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Config files that need an argument (tested with one elsewhere: tests/test_hf_convert.py).
NEEDS_ARGUMENT = ("from_workdir",)


@pytest.mark.parametrize("name", sorted(p.stem for p in CONFIGS.glob("*.py")
                                        if p.stem not in NEEDS_ARGUMENT))
def test_config_file_validates_with_its_defaults(name):
    config = load(name).get_config()
    cfg = validate_run_config(config)
    assert cfg.variant.name == config.variant


def test_table_rows_are_variants_and_other_rows_are_refused():
    tables = sorted(p.stem for p in CONFIGS.glob("table*.py"))
    assert len(tables) == 5
    for name in tables:
        module = load(name)
        assert set(module.ROWS) <= set(VARIANTS), name
        outside = next(v for v in VARIANTS if v not in module.ROWS)
        with pytest.raises(ConfigError, match=f"variant='{outside}' is not a row"):
            module.get_config(f"variant={outside}")


def test_paper_recipes():
    dense = load("dense_1p7b").get_config("arch=dense_1p7b_48l,variant=g1_sdpa_elementwise")
    assert (dense.model.num_layers, dense.model.d_model) == (48, 1536)
    assert dense.model.narrow_ffn_to_match_baseline and dense.optimizer.peak_lr == 4e-3
    # 400B tokens at 1024 sequences of 4096 tokens a step.
    assert abs(dense.train.steps * 1024 * 4096 - 400e9) / 400e9 < 0.01
    moe = load("moe_15a2b").get_config("variant=g1_sdpa_headwise")
    assert (moe.optimizer.peak_lr, moe.optimizer.final_lr, moe.optimizer.warmup_steps,
            moe.train.steps, moe.train.batch_size) == (2e-3, 3e-5, 1_000, 100_000, 1024)
    assert (moe.model.num_experts, moe.model.experts_per_token) == (128, 8)
    ablation = load("ablation").get_config("arch=small,variant=learned_sink")
    assert (ablation.arch, ablation.attention.normalizer) == ("small", "learned_sink")


def test_from_workdir_without_a_workdir_says_how_to_call_it(tmp_path):
    module = load("from_workdir")
    with pytest.raises(ValueError, match=r"needs a workdir: --config=configs/from_workdir.py:"):
        module.get_config()
    with pytest.raises(ValueError, match="config.json not found"):
        module.get_config(str(tmp_path))


def test_family_files_keep_to_their_archs():
    for name, archs in (("tiny", "tiny, tiny_moe"),
                        ("dense_1p7b", "dense_1p7b_28l, dense_1p7b_48l")):
        with pytest.raises(ConfigError, match=f"arch='small' is not allowed here; choose one of "
                                              f"{archs}"):
            load(name).get_config("arch=small")
    assert load("tiny").get_config("arch=tiny_moe,variant=g1_sdpa_headwise").variant == (
        "g1_sdpa_headwise")
