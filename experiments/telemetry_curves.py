"""First-token weight over training, per run: when a sink forms, and in which layer.

A paired table holds each run's last telemetry point; whether a sink formed, faded or never
came shows only over the steps. Each run's metrics.jsonl has a telemetry line every
`train.telemetry_every` steps (F-Attn over the model, per layer, and the uniform level of
that batch); this table gives, per run and step, F-Attn as a multiple of that batch's
uniform level over the whole model and in its largest layer (the layer's index beside it).

    python -m experiments.telemetry_curves runs/tables/text_sink_heads2_cpu
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any

from etils import epath

from gated_attention.core import paths


def curve(workdir: paths.PathLike) -> list[dict[str, Any]]:
    """The run's telemetry points in step order (a resumed run's repeated step: the last
    one), each {step, whole, top, layer}: F-Attn over the uniform level over the model and
    in its largest layer, and that layer's index; [] without telemetry."""
    from gated_attention.training.metrics_writer import read_jsonl

    path = epath.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    points: dict[int, Mapping[str, Any]] = {}
    for line in read_jsonl(path, torn_tail="drop"):
        if line.get("kind") == "telemetry" and line.get("f_attn_uniform"):
            points[int(line["step"])] = line
    out = []
    for step in sorted(points):
        line = points[step]
        uniform = float(line["f_attn_uniform"])
        layers = [float(x) for x in line.get("f_attn_per_layer") or ()]
        top = max(range(len(layers)), key=layers.__getitem__) if layers else None
        out.append({"step": step, "whole": float(line["f_attn"]) / uniform,
                    "top": None if top is None else layers[top] / uniform, "layer": top})
    return out


def curves_markdown(root: paths.PathLike, names: Sequence[str]) -> list[str]:
    """A markdown table: one row per run of `names` found under `root`, one column per
    telemetry step any of them logged; each cell "whole / largest layer (its index)"."""
    curves = {name: curve(epath.Path(root) / name) for name in names}
    curves = {name: points for name, points in curves.items() if points}
    if not curves:
        return []
    steps = sorted({p["step"] for points in curves.values() for p in points})
    lines = ["| run | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|" + "---|" * len(steps)]
    for name, points in curves.items():
        by_step = {p["step"]: p for p in points}
        cells = []
        for step in steps:
            p = by_step.get(step)
            if p is None:
                cells.append("-")
            elif p["top"] is None:
                cells.append(f"{p['whole']:.1f}")
            else:
                cells.append(f"{p['whole']:.1f} / {p['top']:.1f} (L{p['layer']})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = epath.Path(argv[1])
    if not root.is_dir():
        print(f"telemetry_curves: no grid root at {root}", file=sys.stderr)
        return 2
    names = sorted(p.name for p in root.iterdir() if (p / "metrics.jsonl").exists())
    print("\n".join(curves_markdown(root, names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
