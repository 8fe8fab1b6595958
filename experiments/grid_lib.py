"""What a grid is: a list of `Run`s (arch, variant, config overrides, seed, paper table row).

A grid file under experiments/grids/ defines `runs(scale, seeds)`. `scale` maps the paper's
architectures onto sizes one machine can train ("paper" keeps them), and adds the training
length that suits that size. Row names are the paper's, as in experiments/paper_tables.json
and gated_attention.model.variants.VARIANTS.

What a grid seed means (`SEED_OVERRIDES`): seed s sets the initial weights (`seed`, drawn per
parameter name: train.init_by_name) and the data (`data.shuffle_seed`: the order of a corpus's
chunks, the generated stream of a synthetic task; the task's own chain, data.backcopy.seed,
stays fixed). Runs of different variants with one seed therefore see the same batches in the
same order and start from the same weights wherever a weight has the same name and shape:
seeds pair the rows of a grid. `--set data.shuffle_seed=0` keeps the data fixed across seeds
(the spread is then the initial weights' alone).

`with_lr_multipliers` adds a learning-rate axis: each run once per multiplier of its recipe's
peak learning rate (`optimizer.peak_lr`, from the run's overrides, else its config's
default), named `...-lrx<m>-s<seed>` and labelled `<label> lr x<m>`.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gated_attention.config.archs import ARCHS
from gated_attention.core.errors import UserError
from gated_attention.data import registry as data_registry
from gated_attention.model.variants import VARIANTS

PAPER_TABLES_FILE = pathlib.Path(__file__).with_name("paper_tables.json")
SCALES = ("tiny", "small", "paper")
# The paper's architectures, and the local stand-ins each scale trains instead.
SCALED_ARCHS: dict[str, dict[str, str]] = {
    "tiny": {"moe_15a2b": "tiny_moe", "dense_1p7b_28l": "tiny", "dense_1p7b_48l": "tiny"},
    "small": {"moe_15a2b": "small_moe", "dense_1p7b_28l": "small", "dense_1p7b_48l": "small"},
    "paper": {},
}
# Run length per scale (applied before a grid's own overrides and --set).
SCALE_OVERRIDES: dict[str, dict[str, Any]] = {
    "tiny": {"train.steps": 600, "train.batch_size": 16, "train.eval_every": 200,
             "optimizer.warmup_steps": 60},
    "small": {"train.steps": 5000, "train.batch_size": 32, "train.eval_every": 500,
              "optimizer.warmup_steps": 300},
    "paper": {},
}


# What a grid seed sets besides `seed` (run_overrides; a grid's overrides and --set win).
SEED_OVERRIDES = ("data.shuffle_seed",)
GRID_DEFAULTS: dict[str, Any] = {"train.init_by_name": True}


class GridError(UserError):
    """A grid, scale or run definition names something that does not exist."""


@dataclasses.dataclass(frozen=True)
class Placement:
    """What one run reserves: whole TPU slices, or `hosts` hosts of `cpus` CPUs and `gpus` GPUs.

    `tpu` is "<generation>:<topology>", e.g. "v5p:2x2x2" or "v6e:4x4" (one slice of that
    shape per `num_slices`); without it a run takes `hosts` bundles of CPUs and GPUs, each on
    its own node when there are several (a GPU node: `gpus` = its GPU count).
    """

    tpu: str = ""
    num_slices: int = 1
    hosts: int = 1
    cpus: float = 1.0
    gpus: float = 0.0

    def check(self) -> None:
        if self.tpu and not re.fullmatch(r"v[0-9a-z]+:[0-9]+(x[0-9]+)+", self.tpu):
            raise GridError(f"--tpu={self.tpu!r} must be <generation>:<topology>, e.g. "
                            "v5p:2x2x2 or v6e:4x4")
        if self.num_slices < 1 or self.hosts < 1:
            raise GridError(f"--num_slices={self.num_slices} and --hosts={self.hosts} must be "
                            ">= 1")
        if self.tpu and self.hosts != 1:
            raise GridError("--hosts is for CPU/GPU runs; a TPU run's hosts follow from --tpu")
        if self.cpus < 0 or self.gpus < 0:
            raise GridError(f"--cpus={self.cpus} and --gpus={self.gpus} must be >= 0")


def paper_tables() -> dict[str, Any]:
    return json.loads(PAPER_TABLES_FILE.read_text())


def check_scale(scale: str) -> None:
    if scale not in SCALES:
        raise GridError(f"scale={scale!r} is not allowed; choose one of {', '.join(SCALES)}")


def scaled_arch(paper_arch: str, scale: str) -> str:
    check_scale(scale)
    if paper_arch not in ARCHS:
        raise GridError(f"arch={paper_arch!r} unknown; choose one of {', '.join(ARCHS)}")
    return SCALED_ARCHS[scale].get(paper_arch, paper_arch)


# Short names of common overrides in run directory names.
SHORT_KEYS = {"optimizer.peak_lr": "lr", "lr_multiplier": "lrx",
              "model.narrow_ffn_to_match_baseline": "narrowffn",
              "data.add_bos": "bos", "train.steps": "steps"}
# A data source's field is named by its flat spelling (data.passkey.digits: passkey_digits,
# as data.passkey_digits was), so a grid's runs keep their directories under either spelling.
FLAT_NAMES = {new: old for old, new in data_registry.nested_names().items()}


def _name_part(key: str, value: Any) -> str:
    short = SHORT_KEYS.get(key, FLAT_NAMES.get(key, key).split(".")[-1])
    if isinstance(value, bool):
        return short if value else f"no{short}"
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return short + re.sub(r"[^A-Za-z0-9.+]", "", text)


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a grid. `table` and `paper` locate the paper's row it reproduces."""

    arch: str
    variant: str
    seed: int = 0
    overrides: tuple[tuple[str, Any], ...] = ()
    table: str = ""
    paper: tuple[tuple[str, Any], ...] = ()  # keys matching the paper row, e.g. (("max_lr", 8e-3),)
    label: str = ""  # what tells this run apart in the grid (defaults to the variant)

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise GridError(f"run arch={self.arch!r} unknown; choose one of {', '.join(ARCHS)}")
        if self.variant not in VARIANTS:
            raise GridError(f"run variant={self.variant!r} unknown; choose one of "
                            f"{', '.join(VARIANTS)}")

    @property
    def name(self) -> str:
        """Directory name: arch, variant, the grid's own overrides (not scale defaults), seed."""
        parts = [self.arch, self.variant]
        parts += [_name_part(key, value) for key, value in self.overrides]
        return "-".join(parts + [f"s{self.seed}"])

    @property
    def lr_multiplier(self) -> float | None:
        return dict(self.overrides).get("lr_multiplier")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "arch": self.arch, "variant": self.variant, "seed": self.seed,
                "overrides": dict(self.overrides), "table": self.table, "paper": dict(self.paper),
                "label": self.label or self.variant, "lr_multiplier": self.lr_multiplier}


def table_runs(table: str, paper_arch: str, scale: str, seeds: Sequence[int], *,
               names: Sequence[str] | None = None, extra: Sequence[str] = ()) -> list[Run]:
    """One run per row of a paper table (and per seed), plus `extra` comparison variants."""
    rows = paper_tables()[table]
    row_names = [r["name"] for r in rows] if names is None else list(names)
    arch = scaled_arch(paper_arch, scale)
    return [Run(arch=arch, variant=name, seed=seed, table=table)
            for name in dict.fromkeys([*row_names, *extra]) for seed in seeds]


def load_grid(path: str | pathlib.Path) -> Any:
    """Import a grid file by path; it must define `runs(scale, seeds)`."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise GridError(f"grid file {path} does not exist (see experiments/grids/)")
    spec = importlib.util.spec_from_file_location(f"grid_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "runs", None)):
        raise GridError(f"grid file {path} defines no runs(scale, seeds) function")
    return module


def grid_runs(path: str | pathlib.Path, scale: str, seeds: Sequence[int]) -> list[Run]:
    """The grid's runs at `scale`, each name once (two paper settings may map onto one)."""
    check_scale(scale)
    runs = load_grid(path).runs(scale, tuple(seeds))
    out, seen = [], set()
    for run in runs:
        if run.name in seen:  # e.g. two paper settings that map onto one local arch
            continue
        seen.add(run.name)
        out.append(run)
    return out


def _schedule_default(run: Run, field: str) -> float:
    from gated_attention.config.run_config import base_config

    return float(base_config(run.arch, run.variant).optimizer[field])


def parse_multipliers(text: str) -> tuple[float, ...]:
    """'0.5,1,2' -> (0.5, 1.0, 2.0); GridError naming the flag when a value is not > 0."""
    try:
        values = tuple(float(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise GridError(f"--lr_multipliers={text!r} must be comma-separated numbers, "
                        "e.g. 0.5,1,2,4,8") from None
    if not values or any(not v > 0 for v in values):
        raise GridError(f"--lr_multipliers={text!r} must be numbers > 0, e.g. 0.5,1,2,4,8")
    return tuple(dict.fromkeys(values))


def with_lr_multipliers(runs: Sequence[Run], multipliers: Sequence[float]) -> list[Run]:
    """Each run once per multiplier of its recipe's peak learning rate (variant, then lr,
    then seed order is kept: runs come out grouped as they went in)."""
    out = []
    for run in runs:
        for m in multipliers:
            label = f"{run.label or run.variant} lr x{m:g}"
            out.append(dataclasses.replace(
                run, overrides=(*run.overrides, ("lr_multiplier", float(m))), label=label))
    return out


def run_overrides(run: Run, scale: str, settings: Mapping[str, Any] | None = None
                  ) -> dict[str, Any]:
    """Every --config.x=y a run is launched with: grid and scale defaults < the seed's data <
    grid overrides < --set. An lr_multiplier m scales the schedule those give (peak and final
    learning rate, the config's defaults where none is set) by m."""
    overrides = {**GRID_DEFAULTS, **SCALE_OVERRIDES[scale],
                 **{key: run.seed for key in SEED_OVERRIDES}, **dict(run.overrides),
                 **dict(settings or {}), "seed": run.seed}
    multiplier = overrides.pop("lr_multiplier", None)
    if multiplier is not None:
        for field in ("peak_lr", "final_lr"):
            key = f"optimizer.{field}"
            base = overrides.get(key, _schedule_default(run, field))
            overrides[key] = float(base) * float(multiplier)
    return overrides


def define_selection_flags(flag_values: Any, root_help: str, only_help: str) -> None:
    """--root, --scale, --seeds and --only: which runs of a grid a command acts on (run_grid
    trains them, grid_workloads lists them for GKE), defined alike for both."""
    from absl import flags

    flags.DEFINE_string("root", None, root_help, flag_values=flag_values)
    flags.DEFINE_string("scale", "tiny", f"One of {', '.join(SCALES)}.", flag_values=flag_values)
    flags.DEFINE_string("seeds", "0", "Comma-separated seeds, e.g. 0,1,2.",
                        flag_values=flag_values)
    flags.DEFINE_string("only", "", only_help, flag_values=flag_values)
