"""The plain progress line pods log every train.log_every steps: MFU and ETA by hand."""

import types

import pytest

from gated_attention.config import run_config
from gated_attention.training.progress_log import ProgressLine


def test_progress_line_counts_mfu_over_the_devices_peak_and_the_time_left():
    config = run_config.base_config("tiny", "baseline")
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


@pytest.mark.slow  # a 3-step run of a tiny model: one compile
@pytest.mark.reference("independent")  # the steps counted by hand: 1 before the bar, 2 on it
def test_the_progress_bar_starts_after_the_first_step_and_its_compile(tmp_path, monkeypatch):
    """tqdm's rate and ETA come from the steps it sees: a bar made before the first step
    counted the compile as a step. It is made once step 1 is done (initial=1) and sees the
    other 2 steps."""
    import jax
    import tqdm.auto

    from gated_attention.training import loop

    bars = []

    class Recorder:
        def __init__(self, total, initial, **kwargs):
            self.total, self.initial, self.n = total, initial, initial
            bars.append(self)

        def update(self, n):
            self.n += n

        def set_postfix(self, **kwargs):
            pass

        def write(self, text):
            pass

        def close(self):
            pass

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    config = run_config.base_config("tiny", "baseline")
    config.model.update(vocab_size=64, num_layers=1, d_model=32, num_heads=2, num_kv_heads=1,
                        head_dim=16, mlp_dim=64)
    config.data.update(source="synthetic", seq_len=16)
    config.train.update(steps=3, batch_size=2, eval_every=0, log_every=1, checkpoint_every=0,
                        telemetry_every=0)
    config.optimizer.warmup_steps = 1
    loop.run(config, tmp_path / "run", progress=True, devices=jax.devices()[:1])
    assert [(b.total, b.initial, b.n) for b in bars] == [(3, 1, 3)]
