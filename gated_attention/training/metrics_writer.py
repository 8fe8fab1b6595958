"""Training metrics: `metrics.jsonl` (one JSON object per step) and TensorBoard events.

Loss-spike rule (README, "Metrics, evaluation, checkpoints"): after warm-up, a loss is a spike
when it exceeds `factor` x the EMA(decay) of all losses before it (factor 1.5, decay 0.9 by
default; the paper smooths its loss curves with the same EMA of 0.9). The EMA starts at the
first loss and is updated with every finite loss, spikes included (the same rule as
gated_attention.analysis.stability).
"""

from __future__ import annotations

import io
import json
import math
import os
import time
import warnings
from collections.abc import Mapping
from typing import Any

from gated_attention.core import paths


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


def read_jsonl(path: str | os.PathLike[str], *, torn_tail: str = "error"
               ) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl file (one JSON object a line, blank lines skipped); [] if absent.

    A line that is not JSON is an error naming the file and line, never silently dropped;
    except, with torn_tail="drop", an unfinished last line (a run killed mid-write), which
    is dropped with a warning. Values written as null (non-finite numbers) read as NaN.
    """
    path = paths.resolve(path)
    if not path.exists():
        return []
    text = path.read_text()
    lines = text.splitlines()
    torn = bool(text) and not text.endswith("\n")  # every complete record ends its line
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line, object_hook=_nulls_as_nan))
        except json.JSONDecodeError as err:
            if torn and number == len(lines) and torn_tail == "drop":
                warnings.warn(f"{path}:{number}: dropped an unfinished last line (the run was "
                              "stopped while writing it)", stacklevel=2)
                continue
            raise ValueError(f"{path}:{number} is not JSON ({err.msg})") from None
    return records


def _nulls_as_nan(record: dict[str, Any]) -> dict[str, Any]:
    return {k: float("nan") if v is None else v for k, v in record.items()}


class MetricsWriter:
    """Appends to `<workdir>/metrics.jsonl` and writes TensorBoard events to `<workdir>/tb`.

    On a local disk every record is appended as it comes. A bucket object cannot be
    appended to, so there records are buffered and the file is rewritten at most every
    `remote_flush_seconds` (and on `flush`/`close`, which the training loop calls at each
    checkpoint and at the end).
    """

    def __init__(self, workdir: str | os.PathLike[str], *, enabled: bool = True,
                 resume_step: int = 0, remote_flush_seconds: float = 60.0):
        self.path = paths.resolve(workdir) / "metrics.jsonl"
        self.enabled = enabled
        self.remote_flush_seconds = remote_flush_seconds
        self._local = paths.is_local(self.path)
        self._pending: list[str] = []
        self._last_flush = time.monotonic()
        self._tb = None
        if not enabled:
            return
        self._truncate_after(resume_step)
        from tensorboardX import SummaryWriter

        _route_remote_events_through_epath()
        self._tb = SummaryWriter(os.fspath(paths.resolve(workdir) / "tb"))

    def _truncate_after(self, step: int) -> None:
        """Drop records past the checkpoint a run resumes from: they are recomputed exactly."""
        text = self.path.read_text() if self.path.exists() else ""
        records = read_jsonl(self.path, torn_tail="drop")
        kept = [r for r in records if r.get("step", 0) <= step]
        if len(kept) != len(records) or (text and not text.endswith("\n")):
            paths.write_atomic(self.path, "".join(_dumps(r) for r in kept))

    def write(self, step: int, values: Mapping[str, Any], *, kind: str = "train") -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "kind": kind, **{k: _plain(v) for k, v in values.items()}}
        self._pending.append(_dumps(record))
        if self._local or time.monotonic() - self._last_flush >= self.remote_flush_seconds:
            self._write_pending()
        for name, value in values.items():
            if isinstance(value, (int, float, bool)) and math.isfinite(value):
                self._tb.add_scalar(f"{kind}/{name}", float(value), int(step))

    def write_telemetry(self, step: int, record: Mapping[str, Any]) -> None:
        """A telemetry point (training/telemetry.py): one metrics.jsonl record of kind
        "telemetry" (lists per layer / head), and in TensorBoard per-layer scalars
        (telemetry/<name>/layer<i>) and one gate-score histogram per layer."""
        if not self.enabled:
            return
        self.write(step, record, kind="telemetry")  # the scalars: f_attn, sink_rate, m_act
        for name in ("f_attn", "m_act", "gate_mean", "gate_norm"):
            for i, value in enumerate(record.get(f"{name}_per_layer") or []):
                if value is not None:
                    self._tb.add_scalar(f"telemetry/{name}/layer{i}", float(value), int(step))
        for i, heads in enumerate(record.get("f_attn_per_head") or []):
            for h, value in enumerate(heads):
                if value is not None:
                    self._tb.add_scalar(f"telemetry/f_attn/layer{i}_head{h}", float(value),
                                        int(step))
        lo, hi = record.get("gate_hist_range") or (0.0, 1.0)
        for i, counts in enumerate(record.get("gate_hist_per_layer") or []):
            self._add_histogram(f"telemetry/gate_scores/layer{i}", counts, lo, hi, step)

    def _add_histogram(self, tag: str, counts: list[float], lo: float, hi: float,
                       step: int) -> None:
        """A histogram from fixed-bin counts (tensorboardX's raw form: right bin edges)."""
        import numpy as np

        counts_array = np.asarray(counts, np.float64)
        total = float(counts_array.sum())
        if total <= 0:
            return
        edges = np.linspace(lo, hi, len(counts_array) + 1)
        centres = (edges[:-1] + edges[1:]) / 2
        self._tb.add_histogram_raw(
            tag, min=float(lo), max=float(hi), num=total,
            sum=float(np.sum(counts_array * centres)),
            sum_squares=float(np.sum(counts_array * centres ** 2)),
            bucket_limits=edges[1:].tolist(), bucket_counts=counts_array.tolist(),
            global_step=int(step))

    def _write_pending(self) -> None:
        if self._pending:
            paths.append_text(self.path, "".join(self._pending))
            self._pending = []
        self._last_flush = time.monotonic()

    def flush(self) -> None:
        if not self.enabled:
            return
        self._write_pending()
        self._tb.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        self._write_pending()
        self._tb.close()


class _EpathEventFile:
    """One TensorBoard event file in a bucket: objects cannot be appended to, so the whole
    (small) file is uploaded again at each flush, as tensorboardX's own GCS writer does."""

    def __init__(self, path: str):
        self.path, self.buffer = path, io.BytesIO()

    def write(self, data: bytes) -> None:
        self.buffer.write(data)

    def flush(self) -> None:
        paths.write_atomic(self.path, self.buffer.getvalue())

    def close(self) -> None:
        self.flush()


class _EpathEventFiles:
    def open(self, path: str) -> _EpathEventFile:
        return _EpathEventFile(path)

    def directory_check(self, path: str) -> None:
        del path  # buckets have no directories to create


def _route_remote_events_through_epath() -> None:
    """Bucket event files go through epath, like every other run file (tensorboardX would
    otherwise need google-cloud-storage for gs:// and boto3 for s3://)."""
    from tensorboardX import record_writer

    for prefix in paths.REMOTE_PREFIXES:
        record_writer.register_writer_factory(prefix.split(":")[0], _EpathEventFiles())


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no NaN or Infinity
    return value


def _dumps(record: Mapping[str, Any]) -> str:
    """One strict-JSON line (non-finite numbers as null)."""
    return json.dumps({k: _plain(v) for k, v in record.items()}, allow_nan=False) + "\n"
