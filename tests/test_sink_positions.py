"""experiments.sink_positions: M-Act by position kind and the gate at the first key, checked
against hand-computed values and plain float64 loops that share no code with the module."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from experiments import sink_positions as sp


def _loop_max(resid: np.ndarray, mask: np.ndarray) -> list[float]:
    """Per layer, the largest |value| at the masked positions, by explicit loops."""
    out = []
    for layer in range(resid.shape[0]):
        best = -math.inf
        for b in range(resid.shape[1]):
            for s in range(resid.shape[2]):
                if mask[b, s]:
                    for d in range(resid.shape[3]):
                        best = max(best, abs(float(resid[layer, b, s, d])))
        out.append(best)
    return out


def test_position_kinds_partition_by_hand():
    copy = np.array([[False, False, True, False], [True, False, False, True]])
    trigger = np.array([[False, True, True, False], [True, False, False, True]])
    kinds = sp.position_kinds(copy, trigger)
    np.testing.assert_array_equal(kinds["bos"], [[1, 0, 0, 0], [1, 0, 0, 0]])
    # a copy flag at position 0 is BOS's, not a copy position
    np.testing.assert_array_equal(kinds["copy"], [[0, 0, 1, 0], [0, 0, 0, 1]])
    # a trigger at position 1 (row 0) has nothing to copy: its own kind
    np.testing.assert_array_equal(kinds["first_trigger"], [[0, 1, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(kinds["other"], [[0, 0, 0, 1], [0, 1, 1, 0]])
    total = sum(kinds[k].astype(int) for k in sp.KINDS)
    np.testing.assert_array_equal(total, np.ones_like(total))


def test_max_abs_by_kind_hand_case():
    # one layer, one row, three positions (BOS, copy, other), two dimensions
    resid = np.array([[[[1.0, -5.0], [4.0, -6.0], [2.0, 3.0], [-7.0, 0.5]]]])
    kinds = sp.position_kinds(np.array([[False, False, True, False]]),
                              np.array([[False, True, True, False]]))
    peaks = sp.max_abs_by_kind(resid, kinds)
    assert peaks["bos"].tolist() == [5.0]
    assert peaks["first_trigger"].tolist() == [6.0]
    assert peaks["copy"].tolist() == [3.0]
    assert peaks["other"].tolist() == [7.0]


def test_max_abs_by_kind_matches_loops_and_whole_sequence():
    rng = np.random.default_rng(3)
    resid = rng.standard_normal((2, 3, 6, 4)) * rng.uniform(0.1, 9.0, (2, 3, 6, 1))
    copy = rng.random((3, 6)) < 0.3
    copy[0, 2] = True  # at least one copy position
    trigger = copy | (rng.random((3, 6)) < 0.3)
    trigger[1, 1] = True  # at least one trigger right after BOS
    kinds = sp.position_kinds(copy, trigger)
    peaks = sp.max_abs_by_kind(resid, kinds)
    for kind, mask in kinds.items():
        np.testing.assert_allclose(peaks[kind], _loop_max(resid, mask), rtol=0, atol=0)
    # the three kinds together are the whole sequence: their max is the layer's M-Act
    whole = np.max(np.stack([peaks[k] for k in sp.KINDS]), axis=0)
    np.testing.assert_array_equal(whole, np.abs(resid).max(axis=(1, 2, 3)))


def test_max_abs_by_kind_empty_kind_is_nan():
    resid = np.ones((1, 1, 3, 2))
    none = np.zeros((1, 3), bool)
    peaks = sp.max_abs_by_kind(resid, sp.position_kinds(none, none))
    assert np.isnan(peaks["copy"]).all()
    assert peaks["other"].tolist() == [1.0]


def test_gate_sums_by_key_hand_case():
    # [L=1, b=2, s=3, heads=1, d=2]: per-position means 0.1, 0.5, 0.9 and 0.3, 0.7, 0.2
    gates = np.array([[[[[0.0, 0.2]], [[0.4, 0.6]], [[0.8, 1.0]]],
                       [[[0.3, 0.3]], [[0.6, 0.8]], [[0.1, 0.3]]]]])
    sums = sp.gate_sums_by_key(gates)
    total, count = sums["first"]
    assert count == 2 and total.tolist() == pytest.approx([0.1 + 0.3])
    total, count = sums["rest"]
    assert count == 4 and total.tolist() == pytest.approx([0.5 + 0.9 + 0.7 + 0.2])


def test_measure_batches_pools_like_one_big_batch():
    rng = np.random.default_rng(11)
    layers, rows, length, dim = 2, 3, 8, 5
    batches, resids, gates_all = [], [], []
    for _ in range(3):
        inputs = rng.integers(0, 10, (rows, length))
        batches.append({"inputs": inputs})
        resids.append(rng.standard_normal((layers, rows, length, dim)) * 3)
        gates_all.append(rng.random((layers, rows, length, 2, 4)))
    lookup = {id(b["inputs"]): (r, g) for b, r, g in zip(batches, resids, gates_all)}

    def kinds_of(inputs):
        trigger = inputs % 3 == 0
        return sp.position_kinds(trigger & (np.arange(inputs.shape[1]) >= 2), trigger)

    out = sp.measure_batches(lambda batch: lookup[id(batch["inputs"])], batches, kinds_of)
    inputs = np.concatenate([b["inputs"] for b in batches])
    resid = np.concatenate(resids, axis=1)
    gates = np.concatenate(gates_all, axis=1)
    # the kinds by hand, position by position
    masks = {k: np.zeros(inputs.shape, bool) for k in sp.KINDS}
    for b in range(inputs.shape[0]):
        for s in range(inputs.shape[1]):
            trig = inputs[b, s] % 3 == 0
            kind = ("bos" if s == 0 else "first_trigger" if s == 1 and trig else
                    "copy" if trig else "other")
            masks[kind][b, s] = True
    for kind, mask in masks.items():
        assert out[f"positions_{kind}"] == mask.sum()
        per_layer = _loop_max(resid, mask)
        assert out[f"m_act_{kind}_per_layer"] == pytest.approx(per_layer, abs=0)
        assert out[f"m_act_{kind}"] == pytest.approx(np.mean(per_layer), rel=1e-15)
    per_position = gates.mean(axis=(3, 4))  # [L, b, s]
    assert out["gate_first_key_per_layer"] == pytest.approx(
        per_position[:, :, 0].mean(axis=1).tolist(), rel=1e-12)
    assert out["gate_rest_key_per_layer"] == pytest.approx(
        per_position[:, :, 1:].mean(axis=(1, 2)).tolist(), rel=1e-12)


def test_measure_batches_without_gates_has_no_gate_keys():
    batch = {"inputs": np.zeros((1, 4), int)}
    out = sp.measure_batches(lambda b: (np.ones((1, 1, 4, 2)), None), [batch],
                             lambda x: sp.position_kinds(np.zeros(x.shape, bool),
                                                         np.zeros(x.shape, bool)))
    assert "gate_first_key" not in out
    assert out["m_act_copy"] is None and out["m_act_other"] == 1.0  # no copy position
    with pytest.raises(ValueError):
        sp.measure_batches(lambda b: (None, None), [], lambda x: x)


def test_compare_pairs_by_seed_and_counts_missing_runs():
    def run(bos, copy, other, first=None, rest=None):
        out = {"m_act_bos": bos, "m_act_copy": copy, "m_act_other": other,
               "m_act_first_trigger": None}
        if first is not None:
            out.update(gate_first_key=first, gate_rest_key=rest,
                       gate_first_key_per_layer=[first], gate_rest_key_per_layer=[rest])
        return out

    base = {0: run(2.0, 1.0, 0.5), 1: run(2.2, 1.1, 0.4), 2: run(1.8, 0.9, 0.6)}
    g1 = {0: run(0.5, 5.0, 0.7), 1: run(0.4, 7.0, 0.9), 2: None}
    g2 = {0: run(1, 1, 1, 0.3, 0.2), 1: run(1, 1, 1, 0.35, 0.22), 2: run(1, 1, 1, 0.28, 0.21)}
    result = sp.compare({"baseline": base, "g1_sdpa_elementwise": g1,
                         "g2_value_elementwise": g2}, [0, 1, 2])
    copy = result["m_act"]["copy"]["difference"]
    assert copy["n"] == 2 and copy["failed"] == 1  # seed 2's G1 run is missing
    assert copy["diffs"][:2] == pytest.approx([4.0, 5.9])
    assert copy["mean"] == pytest.approx(4.95)
    assert result["m_act"]["first_trigger"]["difference"]["failed"] == 3  # never measured
    gate = result["g2_gate"]["difference"]
    diffs = [0.1, 0.13, 0.07]
    assert gate["diffs"] == pytest.approx(diffs)
    t = stats.ttest_1samp(diffs, 0.0)
    assert gate["p"] == pytest.approx(t.pvalue, rel=1e-9)
    half = stats.t.ppf(0.975, 2) * np.std(diffs, ddof=1) / np.sqrt(3)
    assert (gate["low"], gate["high"]) == pytest.approx((0.1 - half, 0.1 + half), rel=1e-9)


def test_difference_text_and_markdown_say_what_the_numbers_are():
    entry = sp.paired_entry([0.1, 0.13, 0.07])
    text = sp.difference_text(entry)
    half = stats.t.ppf(0.975, 2) * np.std([0.1, 0.13, 0.07], ddof=1) / np.sqrt(3)
    assert text.startswith(f"+0.100 [{0.1 - half:+.3f}, {0.1 + half:+.3f}], p ")
    assert "sign-flip p 0.25" in text  # 2 / 2^3: all three differences positive
    degenerate = sp.difference_text(sp.paired_entry([0.5, 0.5]))
    assert degenerate == "+0.500 (all 2 equal), sign-flip p 0.5"
    assert sp.difference_text(sp.paired_entry([None, 0.2])) == "+0.200 (one seed), 1 of 2 missing"
    result = sp.compare({}, [0, 1])
    table = sp.markdown(result)
    assert "| first token (BOS) | - / - | - / - | - (2 failed) |" in table
