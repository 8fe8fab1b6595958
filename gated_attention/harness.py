"""Downstream evaluation with EleutherAI's lm-evaluation-harness on this project's JAX model.

    python -m gated_attention.harness --workdir=runs/demo/gated --tasks=my_task \\
        --include_path=tasks/ --output_path=out/ --log_samples
    python -m gated_attention.harness --hf_dir=path/to/Qwen3-folder --tasks=hellaswag \\
        --num_fewshot=10 --allow_downloads --dtype=bfloat16

The flags are lm-eval's own (--tasks, --num_fewshot, --limit, --include_path, --batch_size,
--output_path, --log_samples, --seed, --apply_chat_template) plus the model's: --workdir or
--hf_dir, --dtype, --max_length. The output files are lm-eval's (results_<date>.json and
samples_<task>_<date>.jsonl). Nothing is downloaded unless --allow_downloads is given. Bad
input is one line naming the flag (exit status 2) before anything compiles.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any

from absl import flags

from gated_attention.cli import flags as cli_flags
from gated_attention.core import errors
from gated_attention.core.errors import UserError
from gated_attention.evaluation import runner

CLI = cli_flags.Command("gated_attention.harness", __doc__)


def define_flags(flag_values: flags.FlagValues) -> flags.FlagValues:
    """The model's flags, then lm-eval's own under their lm-eval names."""
    flags.DEFINE_string("workdir", "", "A training run (its latest checkpoint and tokenizer).",
                        flag_values=flag_values)
    flags.DEFINE_string("hf_dir", "", "A Hugging Face folder any layout load_pretrained reads "
                        "(config.json, safetensors, tokenizer.json).", flag_values=flag_values)
    flags.DEFINE_string("dtype", "float32", "Compute dtype: float32 | bfloat16.",
                        flag_values=flag_values)
    flags.DEFINE_integer("max_length", 0, "Context length in tokens (default: the model's "
                         "max_position_embeddings, a run's data.seq_len).",
                         flag_values=flag_values)
    flags.DEFINE_string("tasks", "", "Comma-separated lm-eval task names.",
                        flag_values=flag_values)
    flags.DEFINE_integer("num_fewshot", None, "Few-shot examples per prompt (default: the "
                         "task's).", flag_values=flag_values)
    flags.DEFINE_float("limit", None, "Examples per task (a fraction if below 1).",
                       flag_values=flag_values)
    flags.DEFINE_string("include_path", None, "A folder of task YAML files.",
                        flag_values=flag_values)
    flags.DEFINE_string("batch_size", "16", "Rows per compiled call (or 'auto' = 16), rounded "
                        "up to a multiple of the data-parallel devices.", flag_values=flag_values)
    flags.DEFINE_string("output_path", None, "Where lm-eval's results and samples files go.",
                        flag_values=flag_values)
    flags.DEFINE_bool("log_samples", False, "Write samples_<task>_<date>.jsonl files.",
                      flag_values=flag_values)
    flags.DEFINE_integer("seed", 0, "lm-eval's seeds and the sampling seed.",
                         flag_values=flag_values)
    flags.DEFINE_bool("apply_chat_template", False, "Prompts through the tokenizer's "
                      "chat_template (tokenizer_config.json).", flag_values=flag_values)
    flags.DEFINE_bool("allow_downloads", False, "Let lm-eval fetch hub datasets (off: "
                      "HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1).", flag_values=flag_values)
    return flag_values


def parse(argv: list[str] | None = None) -> types.SimpleNamespace:
    """The command line's values (absl flags on a FlagValues of this call's own)."""
    return CLI.parse(define_flags(flags.FlagValues()), argv)


def _batch_size(text: str) -> int:
    if text == "auto":
        return 16
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UserError(f"--batch_size={text!r} must be a positive integer or 'auto'")
    return value


def check_flags(args: types.SimpleNamespace) -> runner.TaskRequest:
    """Flags that need no model or task: checked first."""
    if args.max_length < 0:
        raise UserError(f"--max_length={args.max_length} must be >= 1 (0: the model's own)")
    if args.num_fewshot is not None and args.num_fewshot < 0:
        raise UserError(f"--num_fewshot={args.num_fewshot} must be >= 0")
    if args.limit is not None and args.limit <= 0:
        raise UserError(f"--limit={args.limit} must be > 0")
    if args.log_samples and not args.output_path:
        raise UserError("--log_samples needs --output_path (where the samples files go)")
    _batch_size(args.batch_size)
    limit = args.limit if args.limit is None or args.limit < 1 else int(args.limit)
    return runner.TaskRequest(
        tasks=[t.strip() for t in args.tasks.split(",") if t.strip()],
        num_fewshot=args.num_fewshot, limit=limit, include_path=args.include_path,
        seed=args.seed, apply_chat_template=args.apply_chat_template,
        log_samples=args.log_samples, output_path=args.output_path,
        allow_downloads=args.allow_downloads)


def run(args: types.SimpleNamespace) -> dict[str, Any]:
    request = check_flags(args)
    runner.set_offline(args.allow_downloads)  # before lm-eval and datasets are imported
    from gated_attention.evaluation import backend, engine
    from gated_attention.inference import loading

    loading.check_source(args.workdir, args.hf_dir, args.dtype)
    runner.load_tasks(request)  # unknown tasks and offline datasets fail before the model
    loaded = loading.load(args.workdir, args.hf_dir, args.dtype)
    if args.apply_chat_template and not loaded.chat_template:
        raise UserError("--apply_chat_template: the model's tokenizer defines no chat_template "
                        "(tokenizer_config.json)")
    lm = backend.JaxLM(engine.Engine(loaded.model), loaded.codec,
                       max_length=args.max_length or loaded.max_length,
                       batch_size=_batch_size(args.batch_size), seed=args.seed,
                       name=loaded.name, chat_template=loaded.chat_template)
    return runner.evaluate(lm, request, model_args={
        "pretrained": loaded.name, "dtype": args.dtype, "max_length": lm.max_length})


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    try:
        results = run(args)
    except UserError as err:
        errors.fail(err)
    from lm_eval.utils import make_table

    if results:
        print(make_table(results))
        print(json.dumps(runner.headline(results), indent=2))


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    main(sys.argv[1:])
