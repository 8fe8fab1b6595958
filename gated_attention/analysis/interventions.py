"""Evaluate a trained run with its gates changed, beside the unchanged model.

    python -m gated_attention.intervene --workdir=runs/x --scales=0,0.6,0.8,1,1.2 \
        [--force_open=0:1,1:*] [--force_closed=0:0] [--ablate=1:0] [--clamp_sink=-30,0] \
        [--batches=4] [--batch_size=8] [--step=N]

Interventions (each evaluated on its own, on the run's held-out data, as analyze reads it):
- `scale=s`: every gate's logits times s (the gate kernels and biases scaled by s; a list of
  scales gives a curve). s = 1 is the unchanged model, bit for bit;
- `open L:H` / `closed L:H`: the gate score of head H in layer L forced to 1 / 0 (`*` = every
  head or layer; G5 gates, which have no heads, are forced whole);
- `ablate L:H`: head H of layer L contributes nothing to o_proj;
- `sink=c`: every learned sink logit clamped to c (normalizer learned_sink).
Each row reports held-out loss, F-Attn (mean attention on key 0), sink rate and M-Act (mean
over layers of max |layer output|), as in gated_attention/analyze.py, and their change from
the unchanged model. Written to a NEW folder `<workdir>/interventions` (or `.1`, `.2`, ...
when that exists): interventions.json, interventions.md and interventions.png. Nothing in the
saved run is modified. A Hugging Face model imported with `python -m gated_attention.convert
from_hf` is a workdir like any other.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import tempfile
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx

from gated_attention.core import paths
from gated_attention.core.errors import UserError

OUT_DIR = "interventions"
METRICS = ("loss", "first_token_attention", "sink_rate", "massive_activation")
LABELS = {"loss": "loss", "first_token_attention": "F-Attn", "sink_rate": "sink rate",
          "massive_activation": "M-Act"}


@dataclasses.dataclass(frozen=True)
class Change:
    """One intervention: kind in scale / open / closed / ablate / sink."""

    kind: str
    value: float = 1.0
    layer: int | None = None  # None: every layer
    head: int | None = None   # None: every head

    @property
    def label(self) -> str:
        layer, head = ('*' if x is None else x for x in (self.layer, self.head))
        where = f"{layer}:{head}"
        return {"scale": f"scale={self.value:g}", "open": f"open {where}",
                "closed": f"closed {where}", "ablate": f"ablate {where}",
                "sink": f"sink={self.value:g}"}[self.kind]


def parse_where(spec: str, flag: str) -> tuple[int | None, int | None]:
    """`L:H` with `*` for every layer / head."""
    parts = spec.split(":")
    if len(parts) != 2:
        raise UserError(f"--{flag}={spec!r} must look like LAYER:HEAD (integers or *)")
    try:
        return tuple(None if p.strip() == "*" else int(p) for p in parts)  # type: ignore[return-value]
    except ValueError:
        raise UserError(f"--{flag}={spec!r} must look like LAYER:HEAD (integers or *)") from None


def _gates(attention: nnx.Module) -> list[nnx.Module]:
    variant = attention.cfg.variant
    return [attention.gate_for(p) for p in variant.gate_positions]


def check_changes(cfg: Any, changes: Sequence[Change]) -> None:
    """One-line errors for interventions this model cannot take, before anything runs."""
    heads, _ = cfg.heads
    for change in changes:
        if change.kind in ("scale", "open", "closed") and not cfg.variant.gated:
            raise UserError(f"{change.label}: variant {cfg.variant.name!r} has no gate "
                            "(gate_position='none')")
        if change.kind == "sink" and cfg.variant.normalizer != "learned_sink":
            raise UserError(f"{change.label}: needs normalizer='learned_sink', the run has "
                            f"{cfg.variant.normalizer!r}")
        if change.layer is not None and not 0 <= change.layer < cfg.num_layers:
            raise UserError(f"{change.label}: layer must be in 0..{cfg.num_layers - 1}")
        if change.head is not None and not 0 <= change.head < heads:
            raise UserError(f"{change.label}: head must be in 0..{heads - 1}")
        if change.kind in ("open", "closed") and change.head is not None \
                and cfg.variant.gate_position == "dense_output":
            raise UserError(f"{change.label}: a G5 gate has no heads; use LAYER:*")


def _force(gate: nnx.Module, head: int | None, value: float, heads: int) -> None:
    """Force the score of query head `head` (None: all) of `gate`; a gate on kv heads (G2,
    G3) is forced on the kv head that query head reads, a G5 gate whole."""
    from gated_attention.model.layers.gates import Intervention

    width = gate.heads if gate.per_head else 1
    current = (np.full((width,), np.nan, np.float32) if gate.forced is None
               else np.array(gate.forced[...]))
    if head is None or not gate.per_head:
        current[:] = value
    else:
        current[head // (heads // width)] = value
    gate.forced = Intervention(jnp.asarray(current))


def apply_change(model: nnx.Module, change: Change) -> nnx.Module:
    """A changed copy of a per-layer model (the given one is left as it is)."""
    from gated_attention.model.layers.gates import Intervention

    model = nnx.clone(model)
    heads, _ = model.cfg.heads
    for index, block in enumerate(model.layers):
        if change.layer is not None and index != change.layer:
            continue
        attention = block.attention
        if change.kind == "scale":
            for gate in _gates(attention):
                for name in ("kernel", "kernel_b", "bias", "theta"):
                    if hasattr(gate, name):
                        var = getattr(gate, name)
                        var.set_value(var.get_value() * change.value)
        elif change.kind in ("open", "closed"):
            for gate in _gates(attention):
                _force(gate, change.head, 1.0 if change.kind == "open" else 0.0, heads)
        elif change.kind == "ablate":
            mask = (np.ones((heads,), np.float32) if attention.head_mask is None
                    else np.asarray(attention.head_mask[...]))
            mask[slice(None) if change.head is None else change.head] = 0.0
            attention.head_mask = Intervention(jnp.asarray(mask))
        elif change.kind == "sink":
            attention.sink_logits.set_value(jnp.full_like(attention.sink_logits.get_value(),
                                                          change.value))
    return model


def _metrics(model: nnx.Module, batches: list[dict[str, Any]]) -> dict[str, Any]:
    from gated_attention.analysis import stats

    result = stats.model_statistics(model, batches, exclude_first_query=True,
                                    sink_threshold=0.3)
    return {k: result.get(k) for k in (*METRICS, "first_token_attention_per_layer")}


def output_dir(workdir: paths.PathLike) -> Any:
    """`<workdir>/interventions`, or the first `interventions.<n>` that does not exist."""
    base = paths.resolve(workdir)
    out, n = base / OUT_DIR, 0
    while out.exists():
        n += 1
        out = base / f"{OUT_DIR}.{n}"
    return out


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    head = "| intervention | " + " | ".join(
        f"{LABELS[m]} | Δ {LABELS[m]}" for m in METRICS) + " |"
    lines = [head, "|" + "---|" * (1 + 2 * len(METRICS))]
    for row in rows:
        cells = []
        for m in METRICS:
            value, delta = row["metrics"].get(m), row["delta"].get(m)
            cells += ["-" if value is None else f"{value:.4g}",
                      "-" if delta is None else f"{delta:+.4g}"]
        lines.append(f"| {row['intervention']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], path: pathlib.Path, title: str) -> str:
    from gated_attention.analysis.plots import new_figure, save  # no pyplot: no backend

    fig = new_figure((4 * len(METRICS), 3.4))
    axes = fig.subplots(1, len(METRICS))
    scaled = sorted((r["change"]["value"], r) for r in rows if r["change"]["kind"] == "scale")
    others = [r for r in rows if r["change"]["kind"] not in ("scale", "none")]
    base = next(r for r in rows if r["change"]["kind"] == "none")
    for ax, metric in zip(axes, METRICS):
        if scaled:
            ax.plot([s for s, _ in scaled], [r["metrics"][metric] for _, r in scaled], "o-")
            ax.set_xlabel("gate logit scale s")
        ax.axhline(base["metrics"][metric], color="gray", ls="--", lw=1, label="unchanged")
        for i, row in enumerate(others):
            ax.axhline(row["metrics"][metric], color=f"C{i + 1}", lw=1,
                       label=row["intervention"])
        ax.set_title(LABELS[metric])
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    return save(fig, path)


def intervene(workdir: str | os.PathLike[str], changes: Sequence[Change], *, batches: int = 4,
              batch_size: int = 8, step: int | None = None) -> dict[str, Any]:
    """Evaluate the unchanged run and each change; write the table and plot; return them."""
    from gated_attention.analysis.run_analysis import analysis_batches
    from gated_attention.model.transformer import per_layer
    from gated_attention.training import loop

    workdir = paths.resolve(workdir)
    if not (workdir / "config.json").exists():
        raise FileNotFoundError(f"{workdir} holds no config.json: not a training run")
    if batches < 1 or batch_size < 1:
        raise UserError(f"--batches={batches} and --batch_size={batch_size} must be >= 1")
    model, config = loop.load_params(workdir, step=step)
    model = per_layer(model)
    check_changes(model.cfg, changes)
    held_out, _, description = analysis_batches(config, workdir, batch_size, batches)
    base = _metrics(model, held_out)
    rows = [{"intervention": "unchanged", "change": {"kind": "none"}, "metrics": base,
             "delta": {m: 0.0 for m in METRICS}}]
    for change in changes:
        metrics = _metrics(apply_change(model, change), held_out)
        delta = {m: (None if metrics[m] is None or base[m] is None else metrics[m] - base[m])
                 for m in METRICS}
        rows.append({"intervention": change.label, "change": dataclasses.asdict(change),
                     "metrics": metrics, "delta": delta})
        print(f"{change.label:>16}: loss {metrics['loss']:.4f} ({delta['loss']:+.4f}), F-Attn "
              f"{metrics['first_token_attention']:.3f}, sink rate {metrics['sink_rate']:.2f}, "
              f"M-Act {metrics['massive_activation']:.1f}", flush=True)
    result = {"workdir": str(workdir), "variant": config.variant, "arch": config.arch,
              "step": step, "data": description, "batches": batches, "batch_size": batch_size,
              "rows": rows}
    out = output_dir(workdir)
    with tempfile.TemporaryDirectory() as staging:
        local = pathlib.Path(staging)
        (local / "interventions.md").write_text(
            f"# Interventions on {config.variant} ({description})\n\n" + markdown_table(rows))
        plot(rows, local / "interventions.png", f"{config.variant}: {workdir.name}")
        (local / "interventions.json").write_text(json.dumps(result, indent=2) + "\n")
        for file in sorted(local.iterdir(), key=lambda f: f.name == "interventions.json"):
            paths.write_atomic(out / file.name, file.read_bytes())
    result["out"] = str(out)
    return result


def changes_from_flags(scales: Sequence[str], force_open: Sequence[str],
                       force_closed: Sequence[str], ablate: Sequence[str],
                       clamp_sink: Sequence[str]) -> list[Change]:
    changes: list[Change] = []
    for flag, values in (("scales", scales), ("clamp_sink", clamp_sink)):
        for text in values:
            try:
                value = float(text)
            except ValueError:
                raise UserError(f"--{flag}: {text!r} is not a number") from None
            if not math.isfinite(value):
                raise UserError(f"--{flag}: {text!r} must be finite")
            changes.append(Change("scale" if flag == "scales" else "sink", value))
    for kind, flag, specs in (("open", "force_open", force_open),
                              ("closed", "force_closed", force_closed),
                              ("ablate", "ablate", ablate)):
        for spec in specs:
            layer, head = parse_where(spec, flag)
            changes.append(Change(kind, layer=layer, head=head))
    if not changes:
        raise UserError("no intervention asked: give --scales, --force_open, --force_closed, "
                        "--ablate or --clamp_sink")
    return changes
