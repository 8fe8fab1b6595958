"""Training metrics: `metrics.jsonl` (one JSON object per step) and TensorBoard events.

Loss-spike rule (README, "Metrics, evaluation, checkpoints"): after warm-up, a loss is a spike
when it exceeds `factor` x the EMA(decay) of all losses before it (factor 1.5, decay 0.9 by
default; the paper smooths its loss curves with the same EMA of 0.9). The EMA starts at the
first loss and is updated with every finite loss, spikes included (the same rule as
gated_attention.analysis.stability).
"""

from __future__ import annotations

import json
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any


class SpikeDetector:
    def __init__(self, factor: float = 1.5, decay: float = 0.9, warmup_steps: int = 0):
        self.factor, self.decay, self.warmup_steps = factor, decay, warmup_steps
        self.ema: float | None = None

    def update(self, step: int, loss: float) -> bool:
        if not math.isfinite(loss):  # divergence, not a spike; it never enters the EMA
            return False
        spike = (self.ema is not None and step >= self.warmup_steps
                 and loss > self.factor * self.ema)
        self.ema = loss if self.ema is None else self.decay * self.ema + (1 - self.decay) * loss
        return bool(spike)

    def state_dict(self) -> dict[str, Any]:
        return {"ema": self.ema}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.ema = state.get("ema")


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file (one JSON object a line, blank lines skipped); [] if absent.

    A line that is not JSON is an error naming the file and line, never silently dropped.
    """
    path = pathlib.Path(path)
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number} is not JSON ({err.msg})") from None
    return records


class MetricsWriter:
    """Appends to `<workdir>/metrics.jsonl` and writes TensorBoard events to `<workdir>/tb`."""

    def __init__(self, workdir: str | os.PathLike[str], *, enabled: bool = True,
                 resume_step: int = 0):
        self.path = pathlib.Path(workdir) / "metrics.jsonl"
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self._truncate_after(resume_step)
        from tensorboardX import SummaryWriter

        self._tb = SummaryWriter(str(pathlib.Path(workdir) / "tb"))

    def _truncate_after(self, step: int) -> None:
        """Drop records past the checkpoint a run resumes from: they are recomputed exactly."""
        records = read_jsonl(self.path)
        kept = [r for r in records if r.get("step", 0) <= step]
        if len(kept) != len(records):
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, step: int, values: Mapping[str, Any], *, kind: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "kind": kind, **{k: _plain(v) for k, v in values.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        for name, value in values.items():
            if isinstance(value, (int, float, bool)) and math.isfinite(value):
                self._tb.add_scalar(f"{kind}/{name}", float(value), int(step))

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return value
