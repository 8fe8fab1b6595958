"""Run lm-eval tasks on a JaxLM and write lm-eval's own output files.

Tasks are resolved and their datasets loaded before the model runs, so an unknown task name
or a dataset that would need a download while offline is one line naming --tasks. Offline is
the default: HF_DATASETS_OFFLINE / HF_HUB_OFFLINE are set unless downloads are allowed (the
`datasets` library reads them when first imported, so this module sets them before that).
Output goes through lm-eval's EvaluationTracker, so `--output_path` holds exactly what
`lm_eval run --output_path --log_samples` writes: results_<date>.json and, per task,
samples_<task>_<date>.jsonl, under a folder named after the model.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

from gated_attention.core.errors import UserError

OFFLINE_VARIABLES = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")
_MANAGERS: dict[tuple[str | None, bool], Any] = {}  # TaskManagers by (include path, defaults)


def set_offline(allow_downloads: bool) -> None:
    """Nothing is fetched unless asked; a user's own setting of the variables is kept."""
    if not allow_downloads:
        for name in OFFLINE_VARIABLES:
            os.environ.setdefault(name, "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclasses.dataclass
class TaskRequest:
    """lm-eval's own flags for one evaluation."""
    tasks: Sequence[str]
    num_fewshot: int | None = None
    limit: float | None = None
    include_path: str | None = None
    seed: int = 0
    apply_chat_template: bool = False
    log_samples: bool = False
    output_path: str | None = None
    allow_downloads: bool = False


def load_tasks(request: TaskRequest) -> tuple[Any, dict[str, Any]]:
    """(TaskManager, lm-eval's task dict): names resolved and datasets loaded, or UserError."""
    set_offline(request.allow_downloads)
    import datasets

    datasets.disable_progress_bars()  # a bad task's error stays the only line on stderr

    if request.include_path and not os.path.isdir(request.include_path):
        raise UserError(f"--include_path={request.include_path} is not a folder")
    names = [t for t in request.tasks if t]
    if not names:
        raise UserError("--tasks is empty; name lm-eval tasks (`lm_eval ls tasks`) or local "
                        "ones under --include_path")
    manager = _manager(request.include_path, defaults=False) if request.include_path else None
    if manager is None or not all(manager.match_tasks([t]) for t in names):
        manager = _manager(request.include_path, defaults=True)
    unknown = [t for t in names if not manager.match_tasks([t])]
    if unknown:
        raise UserError(f"--tasks={unknown[0]} is not a task lm-eval knows (see `lm_eval ls "
                        "tasks`; local YAML tasks need --include_path)")
    try:
        task_dict = manager.load(names)
    except Exception as err:  # noqa: BLE001 - datasets raises many kinds; one line for all
        offline = not request.allow_downloads
        hint = (" (its dataset is not on this machine and downloads are off: pass "
                "--allow_downloads to fetch it)" if offline else "")
        first = (str(err).splitlines() or [type(err).__name__])[0]
        raise UserError(f"--tasks={','.join(names)}: the task cannot be loaded{hint}: "
                        f"{first}") from None
    return manager, task_dict


def _manager(include_path: str | None, *, defaults: bool) -> Any:
    """lm-eval's TaskManager, one per process and setting: indexing lm-eval's own thousands of
    task files takes seconds, so local tasks alone are looked up without them first."""
    from lm_eval.tasks import TaskManager

    key = (include_path, defaults)
    if key not in _MANAGERS:
        _MANAGERS[key] = TaskManager(include_path=include_path, include_defaults=defaults)
    return _MANAGERS[key]


def evaluate(lm: Any, request: TaskRequest, *, model_args: dict[str, Any] | None = None,
             write: bool = True) -> dict[str, Any]:
    """lm-eval's results dict (with "samples" when log_samples); files written when `write`
    and an output path is set (process 0 only on several hosts)."""
    import jax
    from lm_eval import simple_evaluate
    from lm_eval.loggers import EvaluationTracker

    manager, _ = load_tasks(request)
    tracker = EvaluationTracker(output_path=request.output_path) if request.output_path \
        else None
    results = simple_evaluate(
        model=lm, model_args=model_args or {"pretrained": getattr(lm, "name", "jax")},
        tasks=list(request.tasks),
        num_fewshot=request.num_fewshot, limit=request.limit, task_manager=manager,
        log_samples=request.log_samples, evaluation_tracker=tracker,
        apply_chat_template=request.apply_chat_template, random_seed=request.seed,
        numpy_random_seed=request.seed, torch_random_seed=request.seed,
        fewshot_random_seed=request.seed, batch_size=getattr(lm, "batch_rows", None))
    if results is None:
        return {}
    if write and tracker is not None and jax.process_index() == 0:
        samples = results.pop("samples", None) if request.log_samples else None
        tracker.save_results_aggregated(results=results, samples=samples)
        if samples is not None:
            for name in results["configs"]:
                tracker.save_results_samples(task_name=name, samples=samples[name])
            results["samples"] = samples
    return results


def headline(results: dict[str, Any]) -> dict[str, float]:
    """{"<task>/<metric>": value} for every numeric metric, stderr left out; a filter other
    than lm-eval's "none" stays in the name ("gsm8k/exact_match,strict-match")."""
    out = {}
    for task, metrics in results.get("results", {}).items():
        for key, value in metrics.items():
            if ("stderr" in key or not isinstance(value, (int, float))
                    or key in ("alias", "sample_len")):
                continue
            name = key[:-len(",none")] if key.endswith(",none") else key
            out[f"{task}/{name}"] = float(value)
    return out
