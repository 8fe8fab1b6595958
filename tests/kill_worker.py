"""A training run that kills itself with SIGKILL at a chosen moment (tests/test_faults.py).

    python tests/kill_worker.py CONFIG_JSON WORKDIR MOMENT

MOMENT: `after_checkpoint:N` (just after the save of step N returns, its write possibly
still in flight), `final_eval` (inside the last held-out evaluation), or `random:SECONDS`
(at a uniformly random time within SECONDS of the first training batch; a run that reaches
its final evaluation first waits there for the kill, so the kill always lands before the run
ends). jax runs with the settings of tests/conftest.py (32-bit, 8 fake devices, the same
compile flags, and the test process's XLA optimisation level, which the test passes in
JAX_DISABLE_MOST_OPTIMIZATIONS) so that the compiled steps, and so the numbers, equal those of
the test process.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402,F401  (jax flags, as in the test process)
import jax  # noqa: E402
import ml_collections  # noqa: E402

from gated_attention.parallel import distributed
from gated_attention.training import checkpoint, loop  # noqa: E402
from gated_attention.training import step as step_lib  # noqa: E402


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main(config_json: str, workdir: str, moment: str) -> None:
    config = ml_collections.ConfigDict(json.loads(Path(config_json).read_text()))
    kind, _, arg = moment.partition(":")
    if kind == "after_checkpoint":
        save = checkpoint.Checkpointer.save

        def save_then_die(self, step, *args, **kwargs):
            save(self, step, *args, **kwargs)
            if step == int(arg):
                die()

        checkpoint.Checkpointer.save = save_then_die
    elif kind == "final_eval":
        evaluate = step_lib.evaluate

        def evaluate_then_die(eval_fn, params, batches):
            calls.append(1)
            if len(calls) == config.train.steps // config.train.eval_every:
                eval_fn(params, batches[0])
                die()
            return evaluate(eval_fn, params, batches)

        calls: list[int] = []
        step_lib.evaluate = evaluate_then_die
    elif kind == "random":
        global_batch = distributed.global_batch

        def start_timer_then_batch(*args, **kwargs):
            if not timers:
                delay = random.uniform(0.0, float(arg))
                print(f"kill after {delay:.3f} s", flush=True)
                timers.append(threading.Timer(delay, die))
                timers[0].start()
            return global_batch(*args, **kwargs)

        timers: list[threading.Timer] = []
        distributed.global_batch = start_timer_then_batch
        evaluate = step_lib.evaluate

        def final_eval_waits_for_the_kill(eval_fn, params, batches):
            calls.append(1)
            if len(calls) == config.train.steps // config.train.eval_every:
                print("reached the final evaluation before the kill: waiting", flush=True)
                threading.Event().wait()
            return evaluate(eval_fn, params, batches)

        calls = []
        step_lib.evaluate = final_eval_waits_for_the_kill
    else:
        raise SystemExit(f"unknown moment {moment!r}")
    loop.run(config, workdir, progress=False, devices=jax.devices()[:1])


if __name__ == "__main__":
    main(*sys.argv[1:])
