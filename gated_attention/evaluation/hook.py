"""lm-eval tasks inside a training run (train.harness_every, train.harness_tasks).

Every `harness_every` steps and at the last step the loop scores the chosen tasks with the
weights it holds, on the training mesh (the parameters keep their training layout; the rows
are split over the batch axis), and writes each task's metrics to metrics.jsonl (kind
"harness", keys "<task>/<metric>"), TensorBoard, and the run record's last values. Tasks
are lm-eval's (local YAML ones through train.harness_include_path); offline as the command.
"""

from __future__ import annotations

from typing import Any

from gated_attention.config.train_config import harness_task_names


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
            tasks=harness_task_names(train), include_path=train.get("harness_include_path") or None,
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
