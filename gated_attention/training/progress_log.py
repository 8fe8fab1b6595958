"""The run's progress: a tqdm bar, or a plain line every train.log_every steps for logs read
without one.

The bar is made after the first step, which compiles the train step: made before it, its
first rate and ETA counted the compile as one step's time (hours for a run of minutes).

On a pod the run's output goes to a file (tpu_scripts/logs.sh tails it), where a tqdm bar is
off; this line says the same: step, loss, tokens/s, model FLOPs utilisation and time left.
MFU = model FLOPs per token (6 N + attention, as `accounting` counts) x tokens/s over the
devices' peak bf16 FLOP/s; "n/a" on a device whose peak is not listed here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

# Peak dense bf16 FLOP/s per device, as the vendors publish them.
PEAK_BF16_FLOPS = {"TPU v4": 275e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
                   "TPU v5": 459e12, "TPU v5p": 459e12, "TPU v6 lite": 918e12,
                   "TPU v6e": 918e12, "H100": 989e12, "H200": 989e12}


def peak_flops(device_kind: str) -> float | None:
    if device_kind in PEAK_BF16_FLOPS:
        return PEAK_BF16_FLOPS[device_kind]
    return next((v for k, v in PEAK_BF16_FLOPS.items() if k.startswith("H") and k in device_kind),
                None)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    minutes, s = divmod(int(seconds), 60)
    hours, m = divmod(minutes, 60)
    return f"{hours}h{m:02d}m" if hours else f"{m}m{s:02d}s"


class ProgressLine:
    """`line(step, loss, tokens_per_sec, seconds_per_step)` for one run on `devices`."""

    def __init__(self, config: Any, devices: Sequence[Any]):
        from gated_attention.config.run_config import model_config
        from gated_attention.model.accounting import train_flops_per_token

        self.total_steps = config.train.steps
        self.flops_per_token = train_flops_per_token(model_config(config), config.data.seq_len)
        peaks = [peak_flops(d.device_kind) for d in devices]
        self.peak = sum(peaks) if peaks and None not in peaks else None

    def line(self, step: int, loss: float, tokens_per_sec: float,
             seconds_per_step: float) -> str:
        mfu = ("n/a" if self.peak is None or not math.isfinite(tokens_per_sec)
               else f"{100 * tokens_per_sec * self.flops_per_token / self.peak:.1f}%")
        eta = _duration((self.total_steps - step) * seconds_per_step)
        return (f"step {step}/{self.total_steps}  loss {loss:.4f}  tokens/s {tokens_per_sec:,.0f}"
                f"  MFU {mfu}  ETA {eta}")


def progress_bar(total: int, done: int, desc: str) -> Any:
    """A tqdm bar of `total` steps, `done` of them already behind it (resumed, or the first
    step with its compile): its rate and ETA count the steps from here on."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=done, unit="step", dynamic_ncols=True, desc=desc)
