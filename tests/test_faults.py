"""Runs that survive faults: kill -9 at any moment, damaged checkpoints, SIGTERM / SIGINT,
non-finite losses, a second launch in a live workdir, a torn metrics line, more steps.

Every check compares with an uninterrupted run of the same config (the reference), which
these tests do not modify: parameters bit for bit, losses and the set of metric steps.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_train import mini_config

from gated_attention.parallel import distributed
from gated_attention.training import checkpoint, interrupts, loop, losses, workdir, workdir_lock
from gated_attention.training.metrics_writer import read_jsonl

HERE = Path(__file__).resolve().parent
STEPS, EVERY = 12, 4  # checkpoints at 4, 8, 12; logs every 3 steps (not at checkpoints)


def fault_config(root, **overrides):
    return mini_config(root, **{"steps": STEPS, "checkpoint_every": EVERY, "log_every": 3,
                                "eval_every": 6, "keep_checkpoints": 3, **overrides})


def run(config, run_dir, **kwargs):
    return loop.run(config, run_dir, progress=False, devices=jax.devices()[:1], **kwargs)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """(root, config, run dir) of an uninterrupted run; compiled steps cached on disk for the
    other runs and the worker processes."""
    root = tmp_path_factory.mktemp("faults")
    cache = root / "jax_cache"
    jax.config.update("jax_compilation_cache_dir", str(cache))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    config = fault_config(root)
    run(config, root / "reference")
    return root, config, root / "reference"


def params_of(run_dir, step=None):
    model, _ = loop.load_params(run_dir, step=step)
    from flax import nnx

    return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def assert_same_run(run_dir, reference_dir):
    """Same final parameters (bit for bit), same metric records (kind, step, loss)."""
    for a, b in zip(params_of(run_dir), params_of(reference_dir), strict=True):
        np.testing.assert_array_equal(a, b)
    key = lambda r: (r["kind"], r["step"], r["loss"])  # noqa: E731
    assert ([key(r) for r in read_jsonl(run_dir / "metrics.jsonl")]
            == [key(r) for r in read_jsonl(reference_dir / "metrics.jsonl")])


# ----------------------------------------------------------------------------- kill -9

@pytest.mark.slow
def test_kill_9_at_any_moment_then_resume_equals_an_uninterrupted_run(reference):
    """Three workers killed at once: right after a checkpoint (its write in flight), inside
    the final evaluation, and at a random moment; each run, resumed, equals the reference."""
    root, config, reference_dir = reference
    config_json = root / "config.json"
    config_json.write_text(json.dumps(workdir.config_dict(config)))
    # the workers compile as this process does (tests/conftest.py: FAST_COMPILE_MODULES)
    fast = jax.config.values["jax_disable_most_optimizations"]
    env = {**os.environ, "JAX_COMPILATION_CACHE_DIR": str(root / "jax_cache"),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_DISABLE_MOST_OPTIMIZATIONS": "1" if fast else "0"}
    moments = ["after_checkpoint:8", "final_eval", "random:2.0"]
    workers = [subprocess.Popen([sys.executable, str(HERE / "kill_worker.py"), str(config_json),
                                 str(root / f"killed_{i}"), moment], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
               for i, moment in enumerate(moments)]
    outputs = [w.communicate(timeout=300)[0] for w in workers]
    for moment, worker, output in zip(moments, workers, outputs):
        assert worker.returncode == -signal.SIGKILL, f"{moment}: {output[-2000:]}"
    assert "kill after" in outputs[2], outputs[2][-2000:]
    assert not (root / "killed_2" / "summary.json").exists()  # killed before the run ended
    # killed right after the save of step 8 returned: steps 7 and 8 (no log step) were
    # written with that checkpoint, not left pending
    assert max(r["step"] for r in read_jsonl(root / "killed_0" / "metrics.jsonl")) == 8
    final_eval_dir = root / "killed_1"
    assert max(r["step"] for r in read_jsonl(final_eval_dir / "metrics.jsonl")) == STEPS
    assert not (final_eval_dir / "summary.json").exists()
    for i in range(len(moments)):
        run(config, root / f"killed_{i}")
        assert_same_run(root / f"killed_{i}", reference_dir)


# ----------------------------------------------------------------------------- checkpoints

def _copy(reference_dir, target):
    shutil.copytree(reference_dir, target)
    (target / ".lock").unlink(missing_ok=True)
    return target


def _array_files(step_dir):
    return sorted((p for p in (step_dir / "state").rglob("*") if p.is_file()
                   and p.parent.name == "d"), key=lambda p: -p.stat().st_size)


def flip_bytes(step_dir):
    """Same size, different bytes: the largest array file, in its middle."""
    path = _array_files(step_dir)[0]
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 16):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(step_dir):
    path = _array_files(step_dir)[0]
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def delete_metadata(step_dir):
    (step_dir / "state" / "_METADATA").unlink()


def empty_folder(step_dir):
    shutil.rmtree(step_dir)
    step_dir.mkdir()


def garbage_iterator_state(step_dir):
    for path in (step_dir / "data").glob("*.json"):
        path.write_text("{not json")


def forged_fingerprint(step_dir):
    """Intact arrays, but the fingerprints recorded at save time say otherwise."""
    path = next((step_dir / "integrity").glob("*"))
    record = json.loads(path.read_text())
    first = sorted(record["fingerprints"])[0]
    record["fingerprints"][first] = (record["fingerprints"][first] + 1) % 2**32
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("damage_12, damage_8", [
    (flip_bytes, truncate),
    (delete_metadata, garbage_iterator_state),
    (empty_folder, forged_fingerprint),
])
def test_damaged_checkpoints_are_reported_moved_aside_and_skipped(reference, damage_12,
                                                                  damage_8, capsys):
    """Steps 12 and 8 damaged: the run falls back to step 4 and ends as the reference."""
    root, config, reference_dir = reference
    run_dir = _copy(reference_dir, root / f"damaged_{damage_12.__name__}")
    damage_12(run_dir / "checkpoints" / "12")
    damage_8(run_dir / "checkpoints" / "8")
    run(config, run_dir)
    out = capsys.readouterr().out
    assert f"Checkpoint {run_dir / 'checkpoints' / '12'} is unusable" in out
    assert f"Checkpoint {run_dir / 'checkpoints' / '8'} is unusable" in out
    assert "Resumed" in out and "at step 4." in out
    moved = sorted(p.name.split("-")[0] for p in (run_dir / checkpoint.DAMAGED_DIR).iterdir())
    assert moved == ["12", "8"]  # kept for inspection, out of the way
    assert_same_run(run_dir, reference_dir)


def test_no_usable_checkpoint_starts_again_from_step_0(reference, capsys):
    root, config, reference_dir = reference
    run_dir = _copy(reference_dir, root / "all_damaged")
    for step in ("4", "8", "12"):
        flip_bytes(run_dir / "checkpoints" / step)
    run(config, run_dir)
    assert "No usable checkpoint left" in capsys.readouterr().out
    assert_same_run(run_dir, reference_dir)


def test_checkpoints_verify_what_they_read_and_never_hold_non_finite_values(tmp_path):
    ckpt = checkpoint.Checkpointer(tmp_path, keep=2, async_save=False)
    state = {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3), "n": jnp.int32(3)}
    ckpt.save(1, state, None)
    restored = ckpt.restore(1, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                            state), None)
    np.testing.assert_array_equal(restored["w"], state["w"])
    with pytest.raises(checkpoint.CheckpointError, match=r"refusing to save step 2: "
                       r"non-finite values in \['w'\]"):
        ckpt.save(2, {"w": state["w"].at[1, 1].set(jnp.nan), "n": state["n"]}, None)
    assert ckpt.all_steps() == [1]
    ckpt.close()
    # The fingerprint is a position-weighted sum of the bits: a checksum written out here.
    bits = np.arange(6, dtype=np.float32).view(np.uint32).astype(np.uint64)
    weights = (np.arange(6, dtype=np.uint64) * 2654435761 + 1) % 2**32
    sums, bad = checkpoint.fingerprint(state)
    assert sums["['w']"] == int(np.sum(bits * weights) % 2**32) and bad == []
    swapped = jnp.asarray(np.arange(6, dtype=np.float32)[[1, 0, 2, 3, 4, 5]].reshape(2, 3))
    assert checkpoint.fingerprint({"w": swapped, "n": state["n"]})[0]["['w']"] != sums["['w']"]


def _written_out_checksum(words: np.ndarray) -> int:
    """The fingerprint's rule by hand, in exact integers: sum of word_i * (i * 2654435761 + 1)
    mod 2**32, each weight taken mod 2**32."""
    total = 0
    for i, word in enumerate(words.tolist()):
        total += int(word) * ((i * 2654435761 + 1) % 2**32)
    return total % 2**32


@pytest.mark.parametrize("host_bytes", [checkpoint.HOST_FINGERPRINT_BYTES, 0],
                         ids=["on_the_host", "on_the_device"])
def test_the_fingerprint_is_the_written_out_checksum_on_host_and_device(host_bytes):
    """Small states are fingerprinted with numpy, large ones by a compiled reduction: both give
    the checksum written out by hand, for every dtype a state holds, and both flag NaN/inf."""
    rng = np.random.default_rng(0)
    values = rng.normal(size=(3, 5)).astype(np.float32)
    tree = {"f32": jnp.asarray(values), "bf16": jnp.asarray(values, jnp.bfloat16),
            "f16": jnp.asarray(values, jnp.float16), "i32": jnp.arange(7, dtype=jnp.int32) - 3,
            "u8": jnp.arange(250, 256, dtype=jnp.uint8), "i8": jnp.arange(-3, 3, dtype=jnp.int8),
            "bool": jnp.asarray([True, False, True]), "scalar": jnp.int32(-5)}
    words = {"f32": values.view(np.uint32).ravel(),
             "bf16": np.asarray(tree["bf16"]).view(np.uint16).ravel(),
             "f16": values.astype(np.float16).view(np.uint16).ravel(),
             "i32": (np.arange(7, dtype=np.int32) - 3).view(np.uint32),
             "u8": np.arange(250, 256), "i8": np.arange(-3, 3, dtype=np.int8).view(np.uint8),
             "bool": np.array([1, 0, 1]), "scalar": np.array([2**32 - 5])}
    sums, bad = checkpoint.fingerprint(tree, host_bytes=host_bytes)
    assert sums == {f"['{name}']": _written_out_checksum(w) for name, w in words.items()}
    assert bad == []
    broken = {**tree, "f32": tree["f32"].at[2, 4].set(jnp.inf),
              "bf16": tree["bf16"].at[0, 0].set(jnp.nan)}
    assert checkpoint.fingerprint(broken, host_bytes=host_bytes)[1] == ["['bf16']", "['f32']"]


def test_the_fingerprint_of_8_byte_values_is_the_same_on_host_and_device(x64):
    """float64 / int64 leaves (jax's 64-bit mode) give two words each, in the same order."""
    tree = {"f64": jnp.linspace(-1.0, 2.0, 5, dtype=jnp.float64),
            "i64": jnp.arange(-2, 3, dtype=jnp.int64) * 2**40}
    host = checkpoint.fingerprint(tree)
    device = checkpoint.fingerprint(tree, host_bytes=0)
    words = np.asarray(tree["f64"]).view(np.uint32)  # little-endian: low word first
    assert host == device and host[0]["['f64']"] == _written_out_checksum(words)


# ----------------------------------------------------------------------------- signals

@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_saves_that_step_then_resumes_exactly(reference, monkeypatch, signum):
    """The signal arrives while step 6 is being prepared (no checkpoint is due there). The
    resumed run also meets a metrics line torn by a kill, which it drops with a warning."""
    root, config, reference_dir = reference
    run_dir = root / f"signal_{signum.name}"
    calls = []
    global_batch = distributed.global_batch

    def batch_then_signal(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 + 6:  # after the 2 eval batches, the 6th training batch
            os.kill(os.getpid(), signum)
        return global_batch(*args, **kwargs)

    monkeypatch.setattr(distributed, "global_batch", batch_then_signal)
    with pytest.raises(interrupts.Interrupted, match=f"stopped by {signum.name} at step 6") as err:
        run(config, run_dir)
    assert err.value.exit_code == 128 + signum
    assert signal.getsignal(signum) is not None  # the handlers were put back
    assert sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir()) == [4, 6]
    assert max(r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")) == 6  # flushed
    monkeypatch.setattr(distributed, "global_batch", global_batch)
    with open(run_dir / "metrics.jsonl", "a") as f:  # as if killed while writing step 7
        f.write('{"step": 7, "kind": "tra')
    with pytest.warns(UserWarning, match="dropped an unfinished last line"):
        run(config, run_dir)
    assert_same_run(run_dir, reference_dir)


def test_a_second_ctrl_c_exits_at_once(monkeypatch):
    exits = []
    monkeypatch.setattr(interrupts.os, "_exit", exits.append)
    with interrupts.StopRequest() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.should_stop(1, sync_point=False) and exits == []
        os.kill(os.getpid(), signal.SIGINT)
        assert exits == [130]


# ----------------------------------------------------------------------------- non-finite

BAD_STEPS = (3, 4, 8)


def nan_at_bad_steps(monkeypatch):
    """A NaN loss at BAD_STEPS only: those batches carry mask[0, 0] = 2 (a mark the loss
    reads, then drops), so both modes below share one compiled step."""
    cross_entropy = losses.cross_entropy
    global_batch = distributed.global_batch
    calls = []

    def sometimes_nan(logits, targets, mask, **kwargs):
        loss, info = cross_entropy(logits, targets, jnp.minimum(mask, 1), **kwargs)
        return loss * jnp.where(mask[0, 0] == 2, jnp.nan, 1.0), info

    def marked_batch(local, *args, **kwargs):
        calls.append(1)
        step = len(calls) - 2  # the first two calls are the held-out batches
        if step in BAD_STEPS:
            local = {**local, "mask": np.where(np.arange(local["mask"].size).reshape(
                local["mask"].shape) == 0, 2, local["mask"]).astype(local["mask"].dtype)}
        return global_batch(local, *args, **kwargs)

    monkeypatch.setattr(losses, "cross_entropy", sometimes_nan)
    monkeypatch.setattr(distributed, "global_batch", marked_batch)


def test_stop_mode_ends_at_the_first_bad_step_with_finite_checkpoints(reference, monkeypatch):
    root, _, _ = reference
    nan_at_bad_steps(monkeypatch)
    run_dir = root / "diverged"
    with pytest.raises(loop.NonFiniteError, match=r"^step 3: non-finite loss or gradients "
                       r"\(first in the gradient of [a-z_.0-9]+\).*on_nonfinite='stop'"):
        run(fault_config(root, on_nonfinite="stop"), run_dir)
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [(r["step"], r.get("skipped", 0)) for r in records] == [(1, 0), (2, 0), (3, 1)]
    assert np.isnan(records[-1]["loss"]) and np.isnan(records[-1]["grad_norm"])
    text = (run_dir / "metrics.jsonl").read_text()
    assert '"loss": null' in text and "NaN" not in text  # strict JSON
    for line in text.splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"{c} in metrics"))
    assert not (run_dir / "checkpoints").exists() or not any(
        (run_dir / "checkpoints").iterdir())  # the first checkpoint was due at step 4


def test_skip_mode_drops_bad_updates_and_finishes_finite(reference, monkeypatch):
    root, _, reference_dir = reference
    nan_at_bad_steps(monkeypatch)
    run(fault_config(root, on_nonfinite="skip", max_skipped=3), root / "skipping")
    records = [r for r in read_jsonl(root / "skipping" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in records if r.get("skipped")] == list(BAD_STEPS)
    assert all(np.isnan(r["loss"]) for r in records if r.get("skipped"))
    final = params_of(root / "skipping")
    assert all(np.isfinite(x).all() for x in final)
    # steps 1-2 are the reference's; from the dropped update at step 3 on, the run differs
    straight = [r for r in read_jsonl(reference_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["loss"] for r in records[:2]] == [r["loss"] for r in straight[:2]]
    assert any(not np.array_equal(a, b) for a, b in zip(final, params_of(reference_dir)))


def test_a_diverging_learning_rate_stops_after_max_skipped(reference):
    """A learning rate of 1e9: every step after the first bad one is bad too (the parameters
    are the problem), so skip mode stops after train.max_skipped of them in a row."""
    root, _, _ = reference
    config = fault_config(root, on_nonfinite="skip", max_skipped=2)
    config.optimizer.update(dict(peak_lr=1e9, final_lr=0.0, warmup_steps=0))
    with pytest.raises(loop.NonFiniteError, match=r"2 steps in a row were skipped "
                       r"\(train.max_skipped=2\)"):
        run(config, root / "lr_1e9")
    records = read_jsonl(root / "lr_1e9" / "metrics.jsonl")
    assert [r.get("skipped", 0) for r in records[-2:]] == [1, 1]


# ----------------------------------------------------------------------------- workdir

def test_a_live_run_holds_its_workdir_and_a_stale_lock_is_taken_over(reference, capsys):
    root, config, _ = reference
    run_dir = root / "locked"
    run_dir.mkdir()
    held = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, json, os, sys, time\n"
        f"f = open({str(run_dir / '.lock')!r}, 'w')\n"
        "fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write(json.dumps({'host': 'h', 'pid': os.getpid(), 'started': 's'})); f.flush()\n"
        "print('held', flush=True); time.sleep(60)\n")], stdout=subprocess.PIPE, text=True)
    try:
        assert held.stdout.readline().strip() == "held"
        with pytest.raises(workdir_lock.WorkdirBusyError, match=f"pid {held.pid} on h"):
            run(config, run_dir)
        assert sorted(p.name for p in run_dir.iterdir()) == [".lock"]  # nothing written
    finally:
        held.kill()
        held.wait()
    lock = workdir_lock.WorkdirLock(run_dir)  # the holder was killed: its lock is stale
    assert "took over the stale lock" in lock.acquire()
    lock.release()


def test_more_steps_extend_a_finished_run(reference, capsys):
    root, config, reference_dir = reference
    run_dir = _copy(reference_dir, root / "extended")
    longer = fault_config(root, steps=STEPS + 2)
    summary = run(longer, run_dir)
    out = capsys.readouterr().out
    assert f"at step {STEPS}." in out and f"train.steps grew to {STEPS + 2}" in out
    assert f"schedule of a {STEPS + 2}-step run from here on" in out  # the span follows steps
    assert summary["train"]["step"] == STEPS + 2
    assert json.loads((run_dir / f"config.steps-{STEPS}.json").read_text()
                      )["train"]["steps"] == STEPS
    steps = [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    assert steps == list(range(1, STEPS + 3))


def test_a_run_saved_before_new_fields_resumes_with_their_values(tmp_path, capsys):
    """config.json of an older version (no train.on_nonfinite / max_skipped) is the same
    run; a field that differs is still a different run."""
    config = fault_config(tmp_path)
    saved = workdir.config_dict(config)
    del saved["train"]["on_nonfinite"], saved["train"]["max_skipped"]
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps(saved))
    assert workdir.prepare(tmp_path / "old", config) == "resume"
    assert "train.max_skipped: 10; train.on_nonfinite: 'stop'" in capsys.readouterr().out
    config.train.z_loss = 1e-4
    with pytest.raises(workdir.WorkdirError, match=r"train.z_loss: 0.0 -> 0.0001"):
        workdir.prepare(tmp_path / "old", config)
