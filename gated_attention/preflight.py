"""`python -m gated_attention.preflight`: compile a run's steps for a TPU slice or GPU nodes on
any CPU, and say whether they fit (the code: compile/preflight.py; docs/preflight.md).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gated_attention.compile import cuda as cuda_compile

if __name__ == "__main__" and cuda_compile.wants_gpu_target(sys.argv):
    cuda_compile.enable()  # before jax's import, which loads the CUDA plugin it finds

import jax  # noqa: E402

from gated_attention.compile import gpu_targets  # noqa: E402
from gated_attention.compile.preflight import (  # noqa: E402
    PREFLIGHT_STEPS,
    format_report,
    parse_target,
    preflight,
    steps_main_runs,
)
from gated_attention.core import errors  # noqa: E402
from gated_attention.core.errors import UserError  # noqa: E402


def main(argv: list[str]) -> None:
    from absl import app, flags

    FLAGS = flags.FLAGS
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        tpu = parse_target(FLAGS.accelerator, FLAGS.hosts)
        steps = tuple(s for s in FLAGS.steps.split(",") if s) or steps_main_runs(FLAGS.config)
        for s in steps:
            if s not in PREFLIGHT_STEPS:
                raise UserError(f"--steps {s!r} is not allowed; choose from "
                                f"{', '.join(PREFLIGHT_STEPS)}")
        info = preflight(FLAGS.config, tpu, steps,
                         Path(FLAGS.dump_hlo) if FLAGS.dump_hlo else None, FLAGS.slices,
                         check_only=FLAGS.check_only)
    except UserError as err:  # AcceleratorError, GpuAcceleratorError, ConfigError, ...
        errors.fail(err, "Pre-flight error")
    print(json.dumps(info, indent=2) if FLAGS.json else format_report(info))
    if info["fits"] is False:
        sys.exit(1)


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing as main's: config errors as one clear line, code bugs with a traceback."""
    from absl import flags

    from gated_attention import main as main_command

    return main_command.parse_flags(argv, flags.FLAGS)


def define_flags() -> None:
    """The command's flags, defined when it runs (importing the module defines none)."""
    from absl import flags
    from ml_collections import config_flags

    config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                    "configs/ablation.py:arch=tiny,variant=baseline",
                                    lock_config=True)
    flags.DEFINE_string("accelerator", None, "Cloud TPU accelerator type as gcloud names it "
                        "(v5litepod-16, v5p-64, v6e-64, v4-32, ...) or a GPU node: "
                        + ", ".join(gpu_targets.known_accelerators()))
    flags.DEFINE_integer("hosts", None, "GPU nodes only: how many nodes of the accelerator.")
    flags.DEFINE_string("steps", "", "Programs to compile: train, eval, telemetry, comma-"
                        "separated (default: those main runs; no eval step with "
                        "train.eval_every=0, no telemetry with train.telemetry_every=0).")
    flags.DEFINE_integer("slices", 1, "TPU types only: slices of --accelerator joined by the "
                         "data-centre network (multislice); the config's mesh.dcn_* sizes must "
                         "multiply to this.")
    flags.DEFINE_bool("json", False, "Print JSON instead of a table.")
    flags.DEFINE_bool("check_only", False, "Run every check up to the compile (config, data, "
                      "the mesh on the target's devices, batch layout) and compile nothing.")
    flags.DEFINE_string("dump_hlo", "", "Folder to write the optimized HLO of each step to.")
    flags.mark_flags_as_required(["config", "accelerator"])


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    # The host only compiles; no accelerator needed (and the CUDA plugin registers its
    # compiler without a GPU only when jax's platforms are "cpu").
    jax.config.update("jax_platforms", "cpu")
    from absl import app

    define_flags()
    app.run(main, flags_parser=parse_flags)
