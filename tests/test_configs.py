"""Every file in configs/ loads, validates, and keeps to its own table's rows."""

import importlib.util
from pathlib import Path

import pytest
from config_fixtures import flat

from gated_attention.config.run_config import ConfigError, validate_run_config
from gated_attention.model.variants import VARIANTS

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


def builders():
    """(file name, module) for every config file that builds an arch from a config string."""
    return [(name, load(name)) for name in sorted(p.stem for p in CONFIGS.glob("*.py"))
            if name not in NEEDS_ARGUMENT]


@pytest.mark.parametrize("variant", ["baseline", "g1_sdpa_elementwise"])
def test_one_arch_name_means_one_set_of_defaults_whichever_file_builds_it(variant):
    from gated_attention.config.archs import ARCHS

    ablation = load("ablation")
    compared = set()
    for name, module in builders():
        own = set(module.OWN_FIELDS)
        for arch in ARCHS:
            try:
                config = module.get_config(f"arch={arch},variant={variant}")
            except ConfigError:  # a family or table file refusing another arch or row
                continue
            reference = flat(ablation.get_config(f"arch={arch},variant={variant}"))
            differ = {k for k in set(reference) | set(flat(config))
                      if flat(config).get(k) != reference.get(k)} - own
            assert not differ, (f"configs/{name}.py:arch={arch} differs from configs/ablation."
                                f"py:arch={arch} in {sorted(differ)}")
            compared.add((name, arch))
    # Every family and table file was compared on the archs it exists for.
    assert {("tiny", "tiny"), ("tiny", "tiny_moe"), ("dense_1p7b", "dense_1p7b_48l"),
            ("moe_15a2b", "moe_15a2b"), ("table1_moe", "tiny_moe"), ("sinks", "sink_tiny"),
            ("table2_dense", "tiny")} <= compared


def test_the_cpu_run_and_the_paper_recipes_are_the_archs_defaults():
    """The numbers docs/training.md and the README state, for any file that builds the arch."""
    tiny = flat(load("ablation").get_config("arch=tiny"))
    assert {k: tiny[k] for k in ("data.seq_len", "data.add_bos", "train.steps",
                                 "train.batch_size", "train.eval_every",
                                 "train.checkpoint_every", "optimizer.warmup_steps")} == {
        "data.seq_len": 256, "data.add_bos": False, "train.steps": 300, "train.batch_size": 16,
        "train.eval_every": 100, "train.checkpoint_every": 100, "optimizer.warmup_steps": 30}
    dense = load("ablation").get_config("arch=dense_1p7b_28l")
    assert (dense.train.batch_size, dense.data.seq_len, dense.optimizer.peak_lr,
            dense.mesh.fsdp, dense.model.remat) == (
        1024, 4096, 4e-3, -1, "dots_with_no_batch_dims_saveable")
    moe = load("table4_sinks").get_config("arch=tiny_moe")
    assert (moe.train.batch_size, moe.train.steps) == (16, 300)  # the CPU run, not 1024 x 100k
