"""The config of an existing run (e.g. a `convert from_hf` import), to start a new run from
its weights with a fresh optimizer:

    --config=configs/from_workdir.py:runs/qwen --workdir=runs/qwen_ft --config.train.steps=500

Every field is the saved run's (its config.json), and train.init_from names that run, so the
new run begins from its latest checkpoint's parameters at step 0.
"""

import json
import pathlib

from gated_attention.config import run_config


def get_config(arg: str | None = None):
    if not arg:
        raise ValueError("configs/from_workdir.py needs a workdir: "
                         "--config=configs/from_workdir.py:runs/x")
    path = pathlib.Path(arg) / "config.json"
    if not path.exists():
        raise ValueError(f"{path} not found: configs/from_workdir.py:{arg} needs a run workdir")
    # saved_config: a run saved before data sections (flat names only) gets them back
    config = run_config.saved_config(json.loads(path.read_text()))
    config.train.init_from = str(pathlib.Path(arg).resolve())
    return config
