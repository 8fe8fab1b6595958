"""What the files in configs/ call: the config string (`configs/x.py:arch=..,variant=..`) and
the base config it names."""

from __future__ import annotations

import ml_collections

from gated_attention.config.run_config import base_config
from gated_attention.core.checks import ConfigError


def parse_config_string(arg: str | None) -> dict[str, str]:
    """`arch=tiny,variant=g1_sdpa_headwise` -> {"arch": "tiny", "variant": ...}."""
    out: dict[str, str] = {}
    for part in filter(None, (arg or "").split(",")):
        if "=" not in part:
            raise ConfigError(f"config string part {part!r} must look like key=value "
                              "(keys: arch, variant)")
        key, value = part.split("=", 1)
        out[key.strip()] = value.strip()
    unknown = set(out) - {"arch", "variant"}
    if unknown:
        raise ConfigError(f"config string key {sorted(unknown)[0]!r} unknown; keys: arch, variant")
    return out



def family_config(arg: str | None, archs: tuple[str, ...]) -> ml_collections.ConfigDict:
    """The base config of an arch family's file (configs/tiny.py, configs/dense_1p7b.py):
    `arch=` in the config string must be one of `archs` (default: the first); `variant=`
    defaults to the baseline."""
    options = parse_config_string(arg)
    arch = options.get("arch", archs[0])
    if arch not in archs:
        raise ConfigError(f"arch={arch!r} is not allowed here; choose one of {', '.join(archs)}")
    return base_config(arch, options.get("variant", "baseline"))


def table_row_config(arg: str | None, rows: tuple[str, ...],
                     default_arch: str) -> ml_collections.ConfigDict:
    """The base config of one row of a paper table (configs/table*.py): `variant=` in the
    config string must be one of the table's `rows`; `arch=` defaults to the table's."""
    options = parse_config_string(arg)
    variant = options.get("variant", rows[0])
    if variant not in rows:
        raise ConfigError(f"variant={variant!r} is not a row of this table; choose one of "
                          f"{', '.join(rows)}")
    return base_config(options.get("arch", default_arch), variant)
