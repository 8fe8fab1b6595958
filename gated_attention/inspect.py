"""Print the parameter, FLOP and per-device memory accounting of a config (a thin CLI).

    python -m gated_attention.inspect \
        --config=configs/ablation.py:arch=dense_1p7b_28l,variant=g1_sdpa_elementwise [--json]

Prints total parameters, parameters added versus the same arch's baseline, per-module counts
(layers folded together), training FLOPs per token (6 x matmul parameters active per token
+ causal attention) and per-device memory on a mesh (`--mesh=data=1,fsdp=8,tensor=1`, or
config.mesh with `--num_devices=8`; formula in gated_attention/compile/memory.py). The counting
lives in gated_attention/model/accounting.py; nothing is allocated, so 15B configs work on a laptop.
"""

from __future__ import annotations

import json
from typing import Any

import jax

from gated_attention.compile import memory
from gated_attention.config.run_config import model_config
from gated_attention.model.accounting import (  # noqa: F401 - the names this CLI has always exported
    active_params,
    count_params,
    matmul_params,
    module_counts,
    report,
    train_flops_per_token,
)


def format_table(info: dict[str, Any]) -> str:
    rows = [
        ("variant", info["variant"]),
        ("total params", f"{info['total_params']:,}"),
        ("active params / token", f"{info['active_params']:,}"),
        ("added vs baseline", f"{info['params_added_vs_baseline']:+,}"),
        (f"train FLOPs / token (S={info['seq_len']})", f"{info['train_flops_per_token']:.4g}"),
    ]
    rows += [(f"  {name}", f"{count:,}") for name, count in sorted(info["modules"].items())]
    if "memory" in info:
        rows += memory.format_rows(info["memory"])
    width = max(len(r[0]) for r in rows)
    notes = memory.notes(info["memory"]) if "memory" in info else []
    return "\n".join([f"{k:<{width}}  {v:>18}" for k, v in rows] + notes)


def main(argv: list[str]) -> None:
    del argv
    from absl import flags

    config = flags.FLAGS.config
    info = report(model_config(config), config.data.seq_len)
    extra = _extra_reports(config)
    info.update(extra)
    print(json.dumps(info, indent=2) if flags.FLAGS.json else format_table(info))


def _extra_reports(config: Any) -> dict[str, Any]:
    """Hook for sections other modules add (e.g. per-device memory on a mesh)."""
    from absl import flags

    mesh = flags.FLAGS["mesh"].value if "mesh" in flags.FLAGS else ""
    devices = flags.FLAGS["num_devices"].value if "num_devices" in flags.FLAGS else None
    accelerator = flags.FLAGS["accelerator"].value if "accelerator" in flags.FLAGS else ""
    try:
        return {"memory": memory.report(config, mesh or "", devices, accelerator or "")}
    except ValueError as err:  # a bad --mesh / --num_devices / config.mesh: say which
        from absl import app

        raise app.UsageError(str(err)) from None


def define_flags() -> None:
    """The command's flags, defined when it runs (importing the module defines none)."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Path to a config file.", lock_config=True)
    flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
    flags.DEFINE_string("mesh", "", "Mesh to plan memory for, e.g. data=1,fsdp=8,tensor=1 "
                        "(default: config.mesh).")
    flags.DEFINE_integer("num_devices", None, "Devices to plan for (default: the --mesh "
                         "product, else the devices of this machine).")
    flags.DEFINE_string("accelerator", "", "Also compile the train step for this Cloud TPU "
                        "slice (v5p-64, v5litepod-16, ...; needs libtpu) and show the compiler's "
                        "per-device memory (see gated_attention/preflight.py).")
    flags.mark_flags_as_required(["config"])


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    from absl import app

    define_flags()
    jax.config.update("jax_platforms", "cpu")
    app.run(main)
