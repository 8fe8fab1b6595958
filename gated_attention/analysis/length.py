"""Evaluate a trained run at many lengths, with and without RoPE scaling.

    python -m gated_attention.evaluate_length --workdir=runs/x --lengths=256,512,1024,2048 \
        [--scalings=none,yarn] [--yarn_factor=0] [--tasks=passkey,multikey_niah,...] \
        [--examples=8] [--ppl_rows=4] [--batch_size=1] [--block=512] [--seed=0] [--step=N]

For each scaling and each length L it measures
- held-out perplexity over whole rows of L tokens and per position bucket ([0, 64), [64, 128),
  ... doubling up to L), on held-out document chunks that start at position 0 (as the
  analysis does), or on windows of the concatenated held-out split when too few documents
  are that long;
- the synthetic retrieval tasks of analysis/retrieval_tasks.py, scored exactly.
A data.source=passkey run (no held-out text) is scored on its own task only:
--tasks=marked_passkey --ppl_rows=0.
Attention runs through ops "chunked" (blockwise, no S x S matrix), so 16k tokens fit on a CPU.
"yarn" uses factor = yarn_factor, or the longest length / the training length when 0, over
the run's training length (data.seq_len). Results go to <workdir>/length_eval/length_eval.json;
an evaluation with other settings already there is moved to length_eval.<n>/ first.

KV-cache eviction (StreamingLLM; layers/kv_cache.py):

    python -m gated_attention.evaluate_length --workdir=runs/x --evict_windows=16,32 \
        --keep_first=0,1,4 [--ppl_rows=16] [--batch_size=8]

scores the run's held-out rows (as analyze reads them, at its training length) through a
cache that keeps the last W tokens and the first k: loss and next-token accuracy at the
positions beyond the window (>= W, where tokens have been evicted), beside full attention;
on the Bigram-Backcopy task also the copy accuracy there. Written to
<workdir>/length_eval/eviction.json (an earlier one is kept: eviction.<n>.json).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from gated_attention.analysis import retrieval_scores as retrieval_tasks
from gated_attention.core import paths
from gated_attention.core.errors import UserError

EVAL_DIR, RESULT_FILE = "length_eval", "length_eval.json"
SCALINGS = ("none", "linear", "ntk", "yarn")
FIRST_BUCKET = 64


def position_buckets(length: int) -> list[tuple[int, int]]:
    """[start, end) position ranges: [0, 64), [64, 128), ... doubling, the last ending at L."""
    edges, edge = [0], FIRST_BUCKET
    while edge < length:
        edges.append(edge)
        edge *= 2
    return list(zip(edges, edges[1:] + [length]))


def scaled_config(cfg: Any, scaling: str, train_length: int, factor: float, block: int) -> Any:
    """The run's ModelConfig with `scaling` (over the training length) and chunked attention."""
    from gated_attention.model.layers.rope import RopeScaling

    if scaling not in SCALINGS:
        raise UserError(f"scaling={scaling!r} is not allowed; choose one of {', '.join(SCALINGS)}")
    rope = (RopeScaling() if scaling == "none" else
            RopeScaling(scaling, factor=factor, original_max_position=train_length))
    return cfg.replace(rope_scaling=rope, attention_impl="chunked",
                       block_sizes=(("block_q", block), ("block_kv", block)))


def make_forward(graphdef: Any) -> Callable[..., tuple[Any, Any]]:
    """jit(params, inputs [b, L], targets [b, L]) -> (per-token NLL [b, L], argmax [b, L]).

    The NLL is the loss code's: logsumexp(logits) - logit of the target, in float32.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    @jax.jit
    def forward(params, inputs, targets):
        model = nnx.merge(graphdef, params)
        logits, _ = model(inputs)
        logits = logits.astype(jnp.float32)
        target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - target_logit
        return nll, jnp.argmax(logits, axis=-1).astype(jnp.int32)

    return forward


def perplexity_by_position(nll: np.ndarray, mask: np.ndarray, length: int) -> dict[str, Any]:
    """Mean loss and perplexity over all masked targets, and per position bucket."""
    nll, mask = np.asarray(nll, np.float64), np.asarray(mask, np.float64)

    def summary(sl: slice) -> dict[str, Any]:
        tokens = float(mask[:, sl].sum())
        loss = float((nll[:, sl] * mask[:, sl]).sum() / max(tokens, 1.0))
        return {"loss": loss, "perplexity": math.exp(min(loss, 700.0)), "tokens": int(tokens)}

    out = summary(slice(None))
    out["buckets"] = [{"start": s, "end": e, **summary(slice(s, e))}
                      for s, e in position_buckets(length)]
    return out


def held_out_rows(local: Any, data_config: Any, length: int, rows: int) -> tuple[np.ndarray, str]:
    """`rows` rows of length + 1 held-out tokens, and where they come from."""
    from gated_attention.data import pipeline

    at_length = data_config.copy_and_resolve_references()
    at_length.seq_len = length
    batches = pipeline.analysis_batches(local, at_length, rows, 1)
    if batches:
        batch = batches[0]
        return np.concatenate([batch["inputs"], batch["targets"][:, -1:]], axis=1), \
            "held-out document chunks from position 0"
    stream, add_bos = local.held_out.tokens, bool(data_config.add_bos)
    take = length if add_bos else length + 1  # a BOS token starts every row when add_bos
    count = min(rows, len(stream) // take)
    if count == 0:
        return np.zeros((0, length + 1), np.int32), "too few held-out tokens"
    windows = stream[:count * take].reshape(count, take)
    if add_bos:
        bos = np.full((count, 1), local.tokenizer.bos_id, np.int32)
        windows = np.concatenate([bos, windows], axis=1)
    return windows.astype(np.int32), "windows of the concatenated held-out split"


def evaluate(workdir: str | os.PathLike[str], lengths: Sequence[int], *,
             scalings: Sequence[str] = ("none", "yarn"), yarn_factor: float = 0.0,
             tasks: Sequence[str] = retrieval_tasks.TASKS, examples: int = 8, ppl_rows: int = 4,
             batch_size: int = 1, block: int = 512, seed: int = 0,
             step: int | None = None) -> dict[str, Any]:
    """Evaluate the run in `workdir` at `lengths`; writes and returns the result."""
    from flax import nnx

    from gated_attention.config import run_config
    from gated_attention.data import pipeline
    from gated_attention.model.transformer import abstract_model
    from gated_attention.training import loop

    workdir = paths.resolve(workdir)
    lengths = sorted({int(x) for x in lengths})
    _check_arguments(workdir, lengths, scalings, tasks, examples, ppl_rows, batch_size, block)
    model, config = loop.load_params(workdir, step=step)
    step = step or _latest_step(workdir)
    from gated_attention.data import LOCAL_SOURCES

    passkey_run = config.data.source == "passkey"
    if config.data.source not in LOCAL_SOURCES and not passkey_run:
        raise UserError("evaluate_length reads the held-out split of a local data source "
                        f"({', '.join(LOCAL_SOURCES)}) or scores a data.source='passkey' run; "
                        f"data.source={config.data.source!r} is not supported yet")
    if passkey_run and ppl_rows:
        raise UserError("a data.source='passkey' run has no held-out text: pass --ppl_rows=0 "
                        "(and --tasks=marked_passkey, the task it learned)")
    params = nnx.state(model, nnx.Param)
    train_length = int(config.data.seq_len)
    factor = yarn_factor or max(1.0, max(lengths) / train_length)
    if passkey_run:
        from gated_attention.data.inputs import stream_tokenizer

        local, tokenizer = None, stream_tokenizer(config, workdir)
    else:
        local = pipeline.load_local_data(config.data, config.model.vocab_size, workdir)
        tokenizer = local.tokenizer
    add_bos = bool(config.data.add_bos)
    count_tokens = retrieval_tasks.token_counter(tokenizer, add_bos)
    # marked pass keys as long as the run's own (10 digits for a run on other data)
    options = {"marked_passkey": {"digits": int(config.data.passkey.digits)}}
    settings = {"step": int(step), "lengths": lengths, "scalings": list(scalings),
                "yarn_factor": factor, "train_length": train_length, "tasks": list(tasks),
                "examples": examples, "ppl_rows": ppl_rows, "seed": seed}
    results: dict[str, Any] = {}
    for scaling in scalings:
        cfg = scaled_config(run_config.model_config(config), scaling, train_length, factor, block)
        forward = make_forward(nnx.split(abstract_model(cfg), nnx.Param, ...)[0])
        per_length = {}
        for length in lengths:
            entry: dict[str, Any] = {}
            rows, source = (held_out_rows(local, config.data, length, ppl_rows) if ppl_rows
                            else (np.zeros((0, length + 1), np.int32), "not asked"))
            if len(rows):
                nll = np.concatenate([np.asarray(forward(params, rows[i:i + batch_size, :-1],
                                                         rows[i:i + batch_size, 1:])[0])
                                      for i in range(0, len(rows), batch_size)])
                entry["perplexity"] = {**perplexity_by_position(nll, np.ones_like(nll), length),
                                       "rows": len(rows), "data": source}
            entry["tasks"] = {task: _task_score(forward, params, task, length, examples,
                                                tokenizer, add_bos, count_tokens, seed,
                                                batch_size, options.get(task, {}))
                              for task in tasks}
            scored = [t["score"] for t in entry["tasks"].values() if t["score"] is not None]
            entry["retrieval_score"] = float(np.mean(scored)) if scored else None
            per_length[str(length)] = entry
            _print_entry(scaling, length, entry)
        results[scaling] = per_length
    out = {"workdir": str(workdir), "variant": config.variant, "arch": config.arch,
           "settings": settings, "results": results}
    _write(workdir, out)
    return out


def eviction_eval(workdir: str | os.PathLike[str], windows: Sequence[int],
                  keep_firsts: Sequence[int] = (0,), *, rows: int = 16, batch_size: int = 8,
                  step: int | None = None) -> dict[str, Any]:
    """Held-out loss / accuracy beyond the window under KV-cache eviction; writes the result."""
    import jax.numpy as jnp
    from flax import nnx

    from gated_attention.analysis.run_analysis import analysis_batches
    from gated_attention.inference import generation as generate
    from gated_attention.training import loop

    workdir = paths.resolve(workdir)
    if not (workdir / "config.json").exists():
        raise FileNotFoundError(f"{workdir} holds no config.json: not a training run")
    if not windows or min(windows) < 1 or min(keep_firsts, default=0) < 0 or rows < 1 \
            or batch_size < 1:
        raise UserError(f"--evict_windows={list(windows)} must be >= 1, --keep_first="
                        f"{list(keep_firsts)} >= 0, --ppl_rows={rows} and --batch_size="
                        f"{batch_size} >= 1")
    model, config = loop.load_params(workdir, step=step)
    batches, chain, description = analysis_batches(config, workdir, batch_size,
                                                   max(1, -(-rows // batch_size)))
    copy_mask = None
    if config.data.source == "bigram_backcopy":
        from gated_attention.data.synthetic.bigram_backcopy import copy_positions

        copy_mask = lambda inputs: copy_positions(chain, inputs)  # noqa: E731
    full = nnx.jit(lambda m, t: m(t)[0].astype(jnp.float32))

    def score(logits_of, W: int) -> dict[str, Any]:
        sums: dict[str, float] = {}
        for batch in batches:
            inputs, targets = np.asarray(batch["inputs"]), np.asarray(batch["targets"])
            mask = np.asarray(batch.get("mask", np.ones_like(targets)), bool)
            logits = np.asarray(logits_of(inputs), np.float64)
            shifted = logits - logits.max(-1, keepdims=True)
            nll = np.log(np.exp(shifted).sum(-1)) - np.take_along_axis(
                shifted, targets[..., None], -1)[..., 0]
            correct = logits.argmax(-1) == targets
            beyond = mask & (np.arange(inputs.shape[1]) >= W)[None]
            parts = {"": beyond}
            if copy_mask is not None:
                parts["copy_"] = beyond & np.asarray(copy_mask(inputs), bool)
            for prefix, m in parts.items():
                sums[prefix + "tokens"] = sums.get(prefix + "tokens", 0) + float(m.sum())
                sums[prefix + "nll"] = sums.get(prefix + "nll", 0) + float((nll * m).sum())
                sums[prefix + "correct"] = sums.get(prefix + "correct", 0) + float(
                    (correct & m).sum())
        out = {}
        for prefix in ("", "copy_") if copy_mask is not None else ("",):
            n = max(sums[prefix + "tokens"], 1.0)
            out.update({prefix + "loss": sums[prefix + "nll"] / n,
                        prefix + "accuracy": sums[prefix + "correct"] / n,
                        prefix + "tokens": int(sums[prefix + "tokens"])})
        return out

    results = []
    for W in sorted(set(windows)):
        entry = {"window": W, "full": score(lambda t: full(model, jnp.asarray(t)), W)}
        for k in sorted(set(keep_firsts)):
            entry[f"keep_first={k}"] = score(
                lambda t, W=W, k=k: generate.streaming_logits(model, t, evict_window=W,
                                                              keep_first=k), W)
        results.append(entry)
        print(f"W={W}: " + ", ".join(f"{name} loss {e['loss']:.4f} acc {e['accuracy']:.3f}"
                                     for name, e in entry.items() if name != "window"),
              flush=True)
    result = {"workdir": str(workdir), "variant": config.variant, "arch": config.arch,
              "data": description, "seq_len": int(config.data.seq_len),
              "rows": sum(len(b["inputs"]) for b in batches), "results": results}
    out, n = workdir / EVAL_DIR / "eviction.json", 0
    while out.exists():
        n += 1
        out = workdir / EVAL_DIR / f"eviction.{n}.json"
    paths.write_atomic(out, json.dumps(result, indent=2) + "\n")
    result["out"] = str(out)
    return result


def _task_score(forward, params, task, length, examples, tokenizer, add_bos, count_tokens,
                seed, batch_size, options) -> dict[str, Any]:
    try:
        items = retrieval_tasks.make_examples(task, length, examples, count_tokens, seed,
                                              **options)
    except ValueError as err:
        return {"score": None, "note": str(err)}
    if not items:
        return {"score": None, "note": "no examples asked"}
    batch = retrieval_tasks.answer_batch(items, tokenizer, length, add_bos)
    predicted = np.concatenate([
        np.asarray(forward(params, batch["inputs"][i:i + batch_size],
                           batch["targets"][i:i + batch_size])[1])
        for i in range(0, len(items), batch_size)])
    scores = retrieval_tasks.score_predictions(items, tokenizer, predicted, batch["answer_mask"])
    return {"score": float(np.mean(scores)), "scores": scores}


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _print_entry(scaling: str, length: int, entry: dict[str, Any]) -> None:
    ppl = entry.get("perplexity", {}).get("perplexity")
    tasks = " ".join(f"{name}={_percent(task['score'])}" for name, task in entry["tasks"].items())
    print(f"{scaling:>6} L={length:>6}: PPL {'-' if ppl is None else f'{ppl:.3f}'}, retrieval "
          f"{_percent(entry['retrieval_score'])} ({tasks})", flush=True)


def _latest_step(workdir: Any) -> int:
    from gated_attention.training import checkpoint as checkpoint_lib

    ckpt = checkpoint_lib.Checkpointer(workdir, keep=1, async_save=False)
    step = ckpt.latest_step()
    ckpt.close()
    return int(step)


def _check_arguments(workdir, lengths, scalings, tasks, examples, ppl_rows, batch_size,
                     block) -> None:
    """One-line errors for bad arguments, before anything is loaded, compiled or written."""
    if not (workdir / "config.json").exists():
        raise FileNotFoundError(f"{workdir} holds no config.json: not a training run")
    if not lengths or min(lengths) < 2:
        raise UserError(f"--lengths={lengths} must be integers >= 2")
    for scaling in scalings:
        if scaling not in SCALINGS:
            raise UserError(f"--scalings: {scaling!r} is not allowed; choose from "
                            f"{', '.join(SCALINGS)}")
    retrieval_tasks.check_tasks(tasks)
    for name, value in (("examples", examples), ("ppl_rows", ppl_rows),
                        ("batch_size", batch_size), ("block", block)):
        if value < (0 if name in ("examples", "ppl_rows") else 1):
            raise UserError(f"--{name}={value} is out of range")


def _write(workdir: Any, result: dict[str, Any]) -> None:
    """Write the result; an earlier one of other settings is moved aside, never overwritten."""
    out = workdir / EVAL_DIR
    old_file = out / RESULT_FILE
    if old_file.exists() and json.loads(old_file.read_text()).get("settings") != \
            result["settings"]:
        n = 1
        while (workdir / f"{EVAL_DIR}.{n}").exists():
            n += 1
        moved = paths.move_aside(out, f"{EVAL_DIR}.{n}")
        print(f"Moved the earlier length evaluation (other settings) to {moved}")
    paths.write_atomic(out / RESULT_FILE, json.dumps(result, indent=2) + "\n")
