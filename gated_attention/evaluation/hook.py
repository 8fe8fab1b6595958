"""lm-eval tasks inside a training run (train.harness_every, train.harness_tasks).

Every `harness_every` steps and at the last step the loop scores the chosen tasks with the
weights it holds, on the training mesh (the parameters keep their training layout; the rows
are split over the batch axis), and writes each task's metrics to metrics.jsonl (kind
"harness", keys "<task>/<metric>"), TensorBoard, and the run record's last values. Tasks
are lm-eval's (local YAML ones through train.harness_include_path); offline as the command.
"""

from __future__ import annotations

import os
from typing import Any

from gated_attention.config_checks import require

FIELDS = dict(harness_every=0, harness_tasks="", harness_include_path="", harness_limit=0,
              harness_batch_size=16)


def check_fields(train: Any) -> None:
    """ConfigError naming the first harness field out of range (run before anything runs)."""
    every = train.get("harness_every", 0)
    require(isinstance(every, int) and not isinstance(every, bool) and every >= 0,
            f"train.harness_every={every!r} must be an integer >= 0 (0 = off)")
    tasks = train.get("harness_tasks", "")
    require(isinstance(tasks, str), f"train.harness_tasks={tasks!r} must be a comma-separated "
            "string of lm-eval task names")
    require(not every or bool(task_names(train)), "train.harness_every="
            f"{every} needs train.harness_tasks (comma-separated lm-eval task names)")
    include = train.get("harness_include_path", "")
    require(not include or os.path.isdir(include), f"train.harness_include_path={include!r} "
            "is not a folder (lm-eval task YAML files)")
    for name in ("harness_limit", "harness_batch_size"):
        value = train.get(name, FIELDS[name])
        require(isinstance(value, int) and value >= (1 if name == "harness_batch_size" else 0),
                f"train.{name}={value!r} must be an integer >= "
                f"{1 if name == 'harness_batch_size' else '0 (0 = every example)'}")


def task_names(train: Any) -> list[str]:
    return [t.strip() for t in str(train.get("harness_tasks", "")).split(",") if t.strip()]


def due(train: Any, done: int) -> bool:
    every = train.get("harness_every", 0)
    return bool(every) and (done % every == 0 or done == train.steps)


class TrainingHarness:
    """Built once per loop (tasks resolved, codec read); `__call__` scores the given params."""

    def __init__(self, run: Any):
        from gated_attention.evaluation import runner
        from gated_attention.evaluation.tokens import TextCodec

        train = run.config.train
        self.run = run
        self.request = runner.TaskRequest(
            tasks=task_names(train), include_path=train.get("harness_include_path") or None,
            limit=train.get("harness_limit", 0) or None, seed=run.config.get("seed", 0))
        runner.load_tasks(self.request)  # a bad task fails at the start, not at step N
        self.codec = TextCodec(run.inputs.tokenizer, add_bos=bool(run.config.data.get("add_bos")))
        self.lm: Any = None

    def __call__(self, params: Any) -> dict[str, float]:
        from flax import nnx

        from gated_attention.evaluation import backend, engine, runner

        if self.lm is None:  # one engine for the run: later calls reuse its compiled code
            model = nnx.merge(self.run.spec.graphdef, params)
            self.lm = backend.JaxLM(
                engine.Engine(model, self.run.mesh, self.run.rules), self.codec,
                max_length=int(self.run.config.data.seq_len),
                batch_size=self.run.config.train.get("harness_batch_size", 16),
                seed=self.request.seed, name=str(self.run.workdir))
        else:
            self.lm.engine.update(params)
        return runner.headline(runner.evaluate(self.lm, self.request, write=False))
