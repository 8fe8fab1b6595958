"""Hugging Face folder <-> run workdir, from the command line.

    python -m gated_attention.convert from_hf path/to/hf_folder --workdir=runs/qwen
    python -m gated_attention.convert to_hf --workdir=runs/x --out=path/to/hf_folder \
        [--to=qwen3_next]

`from_hf` writes a workdir as training would: config.json (the imported architecture and
variant, the folder's tokenizer and input settings), an orbax checkpoint at step 0 (the weights
and a fresh optimizer state) and the model's tokenizer file. `analyze`, `generate` and the
notebooks read it as any run. To continue training, start a new run from its weights (fresh
optimizer, step 0):

    python -m gated_attention.main --config=configs/from_workdir.py:runs/qwen \
        --workdir=runs/qwen_ft --config.train.steps=1000

`to_hf` writes config.json + safetensors of a run's latest checkpoint in the layout `--to`
names (official, qwen3, qwen3_next, qwen3_5, qwen3_5_moe; default: the layout the run was
imported from, else official), with the run's tokenizer (`tokenizer.model` or `tokenizer.json`,
with its special tokens) and its input settings (hf/run_files.py), so that importing the folder
back, or `generate --hf`, reads the same input. Both refuse, before writing anything, a folder
that already holds files they would write.
"""

from __future__ import annotations

import os
import pathlib
from typing import Any

import jax.numpy as jnp
from flax import nnx

from gated_attention.config.run_config import ConfigError
from gated_attention.core import errors, paths
from gated_attention.data import registry as data_registry
from gated_attention.model.transformer import per_layer


def train_state(model: nnx.Module, config: Any) -> dict[str, Any]:
    """The train state of step.py for `model`'s weights: a fresh optimizer state, step 0."""
    from gated_attention.training import optim

    _, params, _ = nnx.split(model, nnx.Param, ...)
    tx = optim.make_optimizer(config.optimizer, config.train.steps)
    return {"params": params, "opt_state": tx.init(params), "step": jnp.zeros((), jnp.int32)}


def from_hf(hf_dir: str | os.PathLike[str], workdir: str | os.PathLike[str], *,
            dtype: str = "float32") -> Any:
    """Import a Hugging Face folder into a new run workdir; returns the run config."""
    from gated_attention import hf
    from gated_attention.config import run_config
    from gated_attention.hf import run_files
    from gated_attention.training import checkpoint as checkpoint_lib
    from gated_attention.training import workdir as workdir_lib

    hf_dir = pathlib.Path(hf_dir)
    model, config = hf.load_pretrained(hf_dir, dtype=dtype)  # every check before any write
    root = paths.resolve(workdir)
    try:
        has_tokenizer = run_files.apply(hf_dir, config)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    if has_tokenizer:
        run_config.validate_run_config(config)
        data_registry.check_files(config)  # the tokenizer fits the vocabulary
        if config.data.get("tokenizer_path"):  # the workdir's copy
            config.data.tokenizer_path = str(root / pathlib.Path(config.data.tokenizer_path).name)
    else:
        print(f"{hf_dir} holds no tokenizer (tokenizer.model or tokenizer.json): set "
              "data.tokenizer and data.tokenizer_path before training or analysing this run")
    if root.exists() and any(root.iterdir()):
        raise workdir_lib.WorkdirError(f"{root} is not empty; choose a new --workdir "
                                       "(nothing is overwritten)")
    workdir_lib.prepare(root, config)
    for name in run_files.tokenizer_files(hf_dir):
        paths.write_atomic(root / name, (hf_dir / name).read_bytes())
    ckpt = checkpoint_lib.Checkpointer(root, keep=config.train.keep_checkpoints,
                                       async_save=False)
    ckpt.save(0, train_state(model, config), None)
    ckpt.close()
    return config


def to_hf(workdir: str | os.PathLike[str], out: str | os.PathLike[str], *,
          step: int | None = None, dtype: str | None = None,
          layout: str | None = None) -> list[str]:
    """Export a run's checkpoint as a Hugging Face folder in `layout` (default: the layout it
    was imported from, else official), with its tokenizer and input settings; returns the
    files written."""
    from gated_attention import hf
    from gated_attention.hf import layouts, run_files
    from gated_attention.training import loop

    root, out = paths.resolve(workdir), pathlib.Path(out)
    if layout is not None:
        layouts.get_layout(layout)  # a bad --to fails before the checkpoint is read
    taken = run_files.taken(out, root)
    if taken:
        raise ConfigError(f"{out / taken[0]} exists; choose an empty --out folder (nothing is "
                          "overwritten)")
    model, config = loop.load_params(root, step=step)
    if config.model.get("scan_layers"):  # the Hugging Face layout names every layer
        model = per_layer(model)
        config = config.copy_and_resolve_references()
        config.model.scan_layers = False
    if config.data.get("tokenizer", "sentencepiece") != "byte":
        run_files.tokenizer_present(root, config)  # before any file is written
    written = hf.save_pretrained(model, config, out, dtype=dtype, layout=layout)
    return written + run_files.write(root, config, out)


USAGE_FROM_HF = "python -m gated_attention.convert from_hf HF_DIR --workdir=W"
USAGE_TO_HF = "python -m gated_attention.convert to_hf --workdir=W --out=DIR [--to=LAYOUT]"


def main(argv: list[str]) -> None:
    from absl import flags, logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
    FLAGS = flags.FLAGS
    if len(argv) < 2 or argv[1] not in ("from_hf", "to_hf"):
        errors.exit_with("usage: python -m gated_attention.convert from_hf HF_DIR --workdir=W | "
                         "to_hf --workdir=W --out=DIR")
    if not FLAGS.workdir:
        errors.exit_with("Error: --workdir is required")
    try:
        if argv[1] == "from_hf":
            if len(argv) != 3:
                errors.exit_with(f"usage: {USAGE_FROM_HF}")
            config = from_hf(argv[2], FLAGS.workdir, dtype=FLAGS.dtype or "float32")
            print(f"Imported {argv[2]} ({config.variant}, {config.model.num_layers} layers) "
                  f"into {FLAGS.workdir}")
        else:
            if len(argv) != 2 or not FLAGS.out:
                errors.exit_with(f"usage: {USAGE_TO_HF}")
            written = to_hf(FLAGS.workdir, FLAGS.out, step=FLAGS.step, dtype=FLAGS.dtype,
                            layout=FLAGS.to)
            print(f"Wrote {', '.join(written)} to {FLAGS.out}")
    except (errors.UserError, FileNotFoundError) as err:  # ConfigError, WorkdirError, ...
        errors.fail(err)


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "The run's working directory.")
    flags.DEFINE_string("out", None, "to_hf: the Hugging Face folder to write.")
    flags.DEFINE_string("dtype", None, "from_hf: the compute dtype (float32, bfloat16); to_hf: "
                        "the weights' dtype (default: the imported checkpoint's, else float32).")
    flags.DEFINE_integer("step", None, "to_hf: the checkpoint step (default: the latest).")
    flags.DEFINE_string("to", None, "to_hf: the Hugging Face layout: official, qwen3, "
                        "qwen3_next, qwen3_5, qwen3_5_moe (default: the layout the run was "
                        "imported from, else official).")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    from absl import app

    define_flags()
    app.run(main)
