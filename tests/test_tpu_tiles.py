"""benchmarks/tpu_tiles.py: the backward tiles' traffic and work, counted off the kernel's
own grid and index maps, against hand counts (no compile, no device)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import tpu_tiles  # noqa: E402 - benchmarks/tpu_tiles.py

TILE = 128
BF16_TILE = TILE * TILE * 2  # one [128, 128] bf16 block of q, k, v, do, dq, dk or dv
ROW = TILE * 4  # one [1, 128] float32 row of lse or delta


@pytest.fixture(scope="module")
def calls():
    """S512 (4 blocks of 128), 2 query heads sharing 1 kv head, head_dim 128, causal."""
    sizes = dict(block_q_dq=TILE, block_kv_dq=TILE, block_q_dkv=TILE, block_kv_dkv=TILE)
    return tpu_tiles.backward_calls(512, 2, 1, TILE, False, sizes)


def test_dq_traffic_and_work_match_a_hand_count(calls):
    call = calls["gated_flash_dq"]
    # Per head, q block i visits kv blocks 0..i; the k/v index map clamps skipped steps to
    # the last visible block, so the block index runs 0000 0111 0122 0123: 1 + 8 changes.
    # The second head (same kv head) starts again at 0: one more change, then 8.
    kv_copies = 2 * (9 + 9)
    q_do_dq_copies = 3 * 2 * 4  # q, do in and dq out: once per (head, q block)
    stats = 2 * 2 * 4 * ROW  # lse and delta rows, once per (head, q block)
    assert tpu_tiles.traffic(call) == (kv_copies + q_do_dq_copies) * BF16_TILE + stats
    tiles, steps = tpu_tiles.visited(call, "dq")
    assert (tiles, steps) == (2 * (1 + 2 + 3 + 4), 2 * 4 * 4)


def test_dkv_traffic_and_work_match_a_hand_count(calls):
    call = calls["gated_flash_dkv"]
    # Grid (kv block j, group member x q block r); kv block j is seen by q blocks j..3. The
    # q-side index (head, clamped q block) per j: j=0: 0123 0123 (head 0 then 1): 8 changes
    # counting the first; j=1: 1123 1123 -> from (1, 3) to (0, 1): 1 + 2 + 1 + 2 = 6;
    # j=2: 2223 2223 -> 1 + 1 + 1 + 1 = 4; j=3: 3333 3333 -> 1 + 0 + 1 + 0 = 2.
    q_side = 8 + 6 + 4 + 2  # per q-side array: q, do (bf16) and lse, delta (rows)
    kv_side = 4 * 4  # k, v in and dk, dv out: once per kv block
    assert tpu_tiles.traffic(call) == (2 * q_side + kv_side) * BF16_TILE + 2 * q_side * ROW
    tiles, steps = tpu_tiles.visited(call, "dkv")
    assert (tiles, steps) == (2 * (4 + 3 + 2 + 1), 4 * 8)
