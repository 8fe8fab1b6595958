"""Analyse a trained run: attention sink, massive activations, gate scores, sparsity, maps,
stability; writes `<workdir>/analysis/analysis.json` and PNG figures beside it.

    python -m gated_attention.analyze --workdir=runs/x [--step=N] [--batches=8]
        [--batch_size=8] [--prompt="..."] [--layers=0,3] [--sink_threshold=0.3]
        [--include_first_query]

The metrics are measured on held-out windows that each start a document chunk at position 0
(data.pipeline.analysis_batches), falling back to the packed eval batches when the held-out
split has too few full windows. Definitions: gated_attention/analysis/stats.py. An earlier
analysis of a different checkpoint step is moved to `analysis.step<N>/`, never overwritten.
"""

from __future__ import annotations

import json
import os
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Any

from etils import epath

from gated_attention.core import paths

DEFAULT_PROMPT = ("The quick brown fox jumps over the lazy dog. Attention sinks appear when "
                  "a model has nowhere else to put its attention.")
MAX_PROMPT_TOKENS = 48
BACKCOPY_MAP_TOKENS = 24  # attention maps of the synthetic task: one labelled sequence
ANALYSIS_DIR = "analysis"


def analysis_batches(config: Any, workdir: epath.Path, batch_size: int, num_batches: int
                     ) -> tuple[list[dict[str, Any]], Any, str]:
    """(batches, tokenizer, description) of the run's held-out data."""
    from gated_attention import data as data_lib
    from gated_attention.data import pipeline

    if config.data.source == "bigram_backcopy":
        from gated_attention.data.synthetic import bigram_backcopy

        chain = bigram_backcopy.chain_from_config(config.data, config.model.vocab_size)
        batches = bigram_backcopy.eval_batches(chain, config.data.seq_len, batch_size,
                                               num_batches, seed=config.data.shuffle_seed)
        return batches, chain, "held-out Bigram-Backcopy sequences (BOS at position 0)"
    if config.data.source not in data_lib.LOCAL_SOURCES:  # streamed: seqio, tfds, shards
        inputs = data_lib.build_inputs(config, workdir)
        return (inputs.eval_batches[:num_batches], inputs.tokenizer,
                f"packed {config.data.source} eval batches")
    local = pipeline.load_local_data(config.data, config.model.vocab_size, workdir)
    batches = pipeline.analysis_batches(local, config.data, batch_size, num_batches)
    if batches:
        return batches, local.tokenizer, "held-out windows, one chunk per row from position 0"
    batches = pipeline.eval_batches(local, config.data, batch_size, num_batches)
    return batches, local.tokenizer, "packed held-out batches (too few full windows)"


def prompt_tokens(tokenizer: Any, prompt: str, add_bos: bool) -> tuple[list[int], list[str]]:
    ids = [int(i) for i in tokenizer.encode([prompt])[0]][:MAX_PROMPT_TOKENS]
    if add_bos:
        ids = [int(tokenizer.bos_id)] + ids[:MAX_PROMPT_TOKENS - 1]
    from gated_attention.analysis.plots import token_labels

    return ids, token_labels(tokenizer, ids)


ALL_LAYERS_UP_TO = 4  # models this deep get every layer's map; deeper, first, middle, last


def default_layers(num_layers: int) -> list[int]:
    if num_layers <= ALL_LAYERS_UP_TO:
        return list(range(num_layers))
    return sorted({0, num_layers // 2, num_layers - 1})


def layers_caption(layers: Sequence[int], num_layers: int) -> str:
    """Which layers a figure of attention maps draws, and why the others are not there."""
    if list(layers) == list(range(num_layers)):
        return f"all {num_layers} layers"
    shown = ", ".join(str(i) for i in layers)
    why = ("first, middle and last; --layers draws others"
           if list(layers) == default_layers(num_layers) else "chosen with --layers")
    return f"layers {shown} of {num_layers} ({why})"


def stability_section(workdir: epath.Path, config: Any) -> dict[str, Any]:
    """Spikes and divergence under the run's own rule (train.spike_factor, train.spike_ema,
    after optimizer.warmup_steps), the flags loop.py logged, and the held-out curve."""
    from gated_attention.analysis import stability

    warmup_steps = int(config.optimizer.warmup_steps)
    rule = {"factor": float(config.train.get("spike_factor", stability.SPIKE_FACTOR)),
            "decay": float(config.train.get("spike_ema", stability.EMA_DECAY))}

    path = workdir / "metrics.jsonl"
    if not path.exists():
        return {"train": stability.stability_report([], warmup_steps=warmup_steps, **rule),
                "eval": [], "logged_spikes": None}
    records = stability.read_metrics(path)
    train = [r for r in records if r.get("kind", "train") == "train"]
    evals = [r for r in records if r.get("kind") == "eval"]
    report = stability.stability_report(stability.loss_series(train),
                                        warmup_steps=warmup_steps, **rule)
    logged = [r["step"] for r in train if r.get("loss_spike")]
    return {"train": report, "logged_spike_steps": logged, "logged_spikes": len(logged),
            "eval": stability.loss_series(evals, "loss"),
            "final_eval": evals[-1] if evals else None}


def make_figures(out: pathlib.Path, result: dict[str, Any], maps: Any, labels: list[str],
                 train_series: Sequence[tuple[int, float]]) -> dict[str, str]:
    from gated_attention.analysis import plots

    name = result["variant"]
    num_layers = len(result["first_token_attention_per_layer"])
    figures = {
        "loss": plots.plot_loss_curves({name: train_series}, out / "loss.png"),
        "first_token_attention": plots.plot_per_layer(
            {name: result["first_token_attention_per_layer"]}, out / "first_token_attention.png",
            "attention on token 0", "F-Attn per layer"),
        "max_activation": plots.plot_per_layer(
            result["max_activation_per_layer"], out / "max_activation.png", "max |value|",
            f"{name}: massive activations per layer", log=True),
        "attention_maps": plots.plot_attention_map(
            {name: maps}, out / "attention_maps.png", result["attention_map_layers"],
            tokens=labels, title="head-averaged attention, "
            + layers_caption(result["attention_map_layers"], num_layers)),
    }
    if result["gate_histogram"] is not None:
        hist = result["gate_histogram"]
        figures["gate_histogram"] = plots.plot_gate_histograms(
            {f"layer {i}": {"edges": hist["edges"], "all": h}
             for i, h in enumerate(hist["per_layer"])},
            out / "gate_histogram.png", f"{name}: gate scores per layer")
    if result["sparsity"] is not None:
        figures["sparsity"] = plots.plot_per_layer(
            {side: [layer[side]["mean_abs"] for layer in result["sparsity"]]
             for side in ("before", "after")},
            out / "sparsity.png", "mean |SDPA output|", f"{name}: before / after the gate")
    return {k: os.path.basename(v) for k, v in figures.items()}


def keep_earlier(out: epath.Path, step: int) -> None:
    """Move an analysis of another checkpoint step aside (nothing saved is lost)."""
    old_file = out / "analysis.json"
    if not old_file.exists():
        return
    old_step = json.loads(old_file.read_text()).get("step")
    if old_step == step:
        return
    target = paths.move_aside(out, f"{ANALYSIS_DIR}.step{old_step}")
    print(f"Moved the analysis of step {old_step} to {target}")


def analyze(workdir: str | os.PathLike[str], *, step: int | None = None, batches: int = 8,
            batch_size: int = 8, prompt: str = DEFAULT_PROMPT,
            layers: Sequence[int] | None = None, sink_threshold: float = 0.3,
            exclude_first_query: bool = True) -> dict[str, Any]:
    """Analyse the run in `workdir` (its latest checkpoint unless `step`); returns the result."""
    from gated_attention.analysis import stats
    from gated_attention.config import run_config
    from gated_attention.model import accounting
    from gated_attention.training import checkpoint as checkpoint_lib
    from gated_attention.training import loop

    workdir = paths.resolve(workdir)  # local or gs://
    if not (workdir / "config.json").exists():
        raise FileNotFoundError(f"{workdir} holds no config.json: not a training run")
    if step is None:
        ckpt = checkpoint_lib.Checkpointer(workdir, keep=1, async_save=False)
        step = ckpt.latest_step()
        ckpt.close()
        if step is None:
            raise FileNotFoundError(f"{workdir} holds no checkpoint")
    model, config = loop.load_params(workdir, step=step)
    held_out, tokenizer, description = analysis_batches(config, workdir, batch_size, batches)
    result = stats.model_statistics(model, held_out, exclude_first_query=exclude_first_query,
                                    sink_threshold=sink_threshold)
    num_layers = model.cfg.num_layers
    layers = default_layers(num_layers) if layers is None else list(layers)
    if config.data.source == "bigram_backcopy":  # the synthetic sink task: its own metrics
        from gated_attention.analysis import backcopy

        result["task"] = backcopy.task_statistics(model, tokenizer, held_out,
                                                  sink_threshold=sink_threshold)
        ids, labels = backcopy.example_sequence(tokenizer, BACKCOPY_MAP_TOKENS)
        prompt = "a held-out-like Bigram-Backcopy sequence (T = trigger)"
    else:
        ids, labels = prompt_tokens(tokenizer, prompt, bool(config.data.add_bos))
    maps = stats.attention_maps(model, ids, layers)
    stability = stability_section(workdir, config)
    cfg = run_config.model_config(config)
    info = accounting.report(cfg, int(config.data.seq_len))
    result.update(
        workdir=str(workdir), step=int(step), arch=config.arch, data=description,
        batch_size=batch_size, seq_len=int(config.data.seq_len), add_bos=bool(config.data.add_bos),
        prompt=prompt, prompt_tokens=labels, attention_map_layers=layers,
        stability=stability,
        params={k: info[k] for k in ("total_params", "active_params",
                                     "params_added_vs_baseline")},
    )
    out = workdir / ANALYSIS_DIR
    keep_earlier(out, int(step))
    from gated_attention.analysis.stability import loss_series

    train_series = loss_series(r for r in _records(workdir) if r.get("kind", "train") == "train")
    with tempfile.TemporaryDirectory() as staging:  # matplotlib and numpy write local files
        local = pathlib.Path(staging)
        result["figures"] = make_figures(local, result, maps, labels, train_series)
        import numpy as np

        np.save(local / "attention_maps.npy", maps)
        (local / "analysis.json").write_text(json.dumps(result, indent=2) + "\n")
        # analysis.json last: it marks a complete analysis
        for file in sorted(local.iterdir(), key=lambda f: f.name == "analysis.json"):
            paths.write_atomic(out / file.name, file.read_bytes())
    return result


def _records(workdir: epath.Path) -> list[dict[str, Any]]:
    from gated_attention.analysis.stability import read_metrics

    path = workdir / "metrics.jsonl"
    return read_metrics(path) if path.exists() else []






def per_layer_note(values: Sequence[float], most: int = 8) -> str:
    """'  (per layer: 0.008, 0.112)' for up to `most` layers: a mean over layers can hide a
    layer whose gate opens beside one that stays shut."""
    if not 1 < len(values) <= most:
        return ""
    return "  (per layer: " + ", ".join(f"{v:.3f}" for v in values) + ")"


def summary_lines(result: dict[str, Any]) -> list[str]:
    """What the command prints: one metric a line, and both held-out perplexities, each named
    by the tokens it measured (the analysis windows here; training's packed eval batches)."""
    gate = result["gate_score_mean"]
    query0 = "excluded" if result["exclude_first_query"] else "included"
    rows = [
        (f"F-Attn (attention on token 0, query 0 {query0})",
         f"{result['first_token_attention']:.3f}"),
        (f"sink rate (heads above {result.get('sink_threshold', 0.3):g} on token 0)",
         f"{result['sink_rate']:.2f}"),
        ("M-Act (mean over layers of max |layer output|)", f"{result['massive_activation']:.2f}"),
        ("mean gate score", "- (no gate)" if gate is None else f"{gate:.3f}"
         + per_layer_note([g["mean"] for g in result.get("gate_score_per_layer") or []])),
    ]
    if "perplexity" in result:
        tokens = result.get("loss_tokens")
        rows.append(("held-out perplexity, this analysis",
                     f"{result['perplexity']:.2f}  on "
                     + (f"{tokens:,} tokens of " if isinstance(tokens, int) else "")
                     + result["data"]))
    path = paths.resolve(result["workdir"]) / "summary.json"
    summary = json.loads(path.read_text()) if path.exists() else {}
    evaluation = summary.get("eval") or {}
    if "perplexity" in evaluation:
        rows.append(("held-out perplexity, training's last eval",
                     f"{evaluation['perplexity']:.2f}  at step {summary.get('steps', '?')}, on "
                     "its train.eval_batches packed batches"))
    width = max(len(name) for name, _ in rows)
    lines = [f"{result['variant']} at step {result['step']}:"]
    lines += [f"  {name:<{width}}  {value}" for name, value in rows]
    if "perplexity" in result and "perplexity" in evaluation:
        lines.append("  The two perplexities measure different held-out tokens, so they differ.")
    lines.append(f"Written to {paths.resolve(result['workdir']) / ANALYSIS_DIR}")
    return lines
