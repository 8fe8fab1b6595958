"""The plain progress line pods log every train.log_every steps: MFU and ETA by hand."""

import types

from gated_attention import config_lib
from gated_attention.progress_log import ProgressLine


def test_progress_line_counts_mfu_over_the_devices_peak_and_the_time_left():
    config = config_lib.base_config("tiny", "baseline")
    config.train.steps = 1000
    devices = [types.SimpleNamespace(device_kind="TPU v5 lite")] * 4  # 197 TFLOP/s each
    line = ProgressLine(config, devices)
    per_token = line.flops_per_token
    tokens_per_sec = 0.25 * 4 * 197e12 / per_token  # exactly 25% MFU
    text = line.line(400, 2.5, tokens_per_sec, seconds_per_step=6.0)  # 600 steps x 6 s left
    assert text == (f"step 400/1000  loss 2.5000  tokens/s {tokens_per_sec:,.0f}  MFU 25.0%"
                    "  ETA 1h00m")
    unknown = ProgressLine(config, [types.SimpleNamespace(device_kind="cpu")])
    assert "MFU n/a  ETA 0m30s" in unknown.line(995, 1.0, 10.0, seconds_per_step=6.0)
