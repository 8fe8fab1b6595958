"""`python -m gated_attention.generate`: text from a trained run or a Hugging Face folder (the
code: inference/generation.py)."""

from __future__ import annotations

import sys

from gated_attention.core import errors
from gated_attention.core.errors import UserError
from gated_attention.inference.generation import (
    continuation,
    encode_prompt,
    generate,
    load_for_generation,
)


def main(argv: list[str]) -> None:
    from absl import flags, logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every file it reads at INFO
    FLAGS = flags.FLAGS
    if len(argv) > 1:
        errors.exit_with(f"unexpected arguments: {' '.join(argv[1:])}")
    try:
        model, config, tokenizer = load_for_generation(FLAGS.workdir or "", FLAGS.hf or "")
    except (UserError, FileNotFoundError) as err:
        errors.fail(err)
    prompt = encode_prompt(FLAGS.prompt, tokenizer, config)
    if not prompt:
        errors.exit_with("Error: --prompt encodes to no tokens")
    try:
        new = generate(model, [prompt], FLAGS.max_new_tokens, temperature=FLAGS.temperature,
                       top_p=FLAGS.top_p, seed=FLAGS.seed,
                       eos_id=None if FLAGS.ignore_eos else int(tokenizer.eos_id),
                       evict_window=FLAGS.evict_window, keep_first=FLAGS.keep_first)[0]
    except UserError as err:
        errors.fail(err)
    text, note = continuation(new, tokenizer, ignore_eos=FLAGS.ignore_eos,
                              temperature=FLAGS.temperature)
    print(FLAGS.prompt + text)
    if note:
        print(note, file=sys.stderr)


def define_flags() -> None:
    from absl import flags

    flags.DEFINE_string("workdir", None, "A training run (or a `convert from_hf` workdir).")
    flags.DEFINE_string("hf", None, "A Hugging Face folder (config.json, safetensors, "
                        "tokenizer.model or tokenizer.json), instead of --workdir.")
    flags.DEFINE_string("prompt", "The", "Text to continue.")
    flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate.")
    flags.DEFINE_float("temperature", 0.0, "0 = greedy; else sample softmax(logits / T).")
    flags.DEFINE_float("top_p", 1.0, "Nucleus sampling: keep the most likely tokens up to this "
                       "probability mass.")
    flags.DEFINE_integer("seed", 0, "Sampling seed.")
    flags.DEFINE_bool("ignore_eos", False, "Keep generating past the end-of-text token.")
    flags.DEFINE_integer("evict_window", 0, "KV-cache eviction: keep only the last N tokens "
                         "(0 = keep all).")
    flags.DEFINE_integer("keep_first", 0, "With --evict_window: also keep the first N tokens "
                         "(StreamingLLM's attention sinks).")


if __name__ == "__main__":
    from gated_attention.cli.platform import keep_libtpu_out_of_cpu_runs

    keep_libtpu_out_of_cpu_runs()  # before jax starts: a CPU run never tries libtpu
    from absl import app

    define_flags()
    app.run(main)
