#!/bin/bash
# One call on a GPU machine (an H200) for the attention kernels: benchmark table, training
# step, correctness, block-size sweep, each under its own timeout, all inside one time budget.
# What matters most runs first: the table (baselines before our rows) and the train-step MFU.
#
# Usage, from the repository root:
#   bash benchmarks/device_benchmark.sh [STEP ...]   # steps: env table train check memory
#                                                  # sweep (default: these six, in this order)
#   train_pallas (only when named): the G1 step with attention_impl=pallas_gpu (fused gate)
# Environment:
#   OUT       results folder (default runs/device_benchmark)
#   BUDGET_S  wall-clock seconds for the whole script (default 600); each step gets the smaller
#             of its own cap and what is left, and a step with under 15 s left is skipped.
#             The caps add up to the default budget: env 40, table 180, train 3 x 70,
#             check 60, memory 60, sweep 50
#   SMALL=1   CPU rehearsal: --small everywhere, a tiny training step, caps and budget x4
#   DRY_RUN=1 print each step's command instead of running it
#   INSTALL_WHEELS=auto|0  auto (default): install .whl/*.whl into .site when there are any
#   PYTHON    the interpreter (default python3)
#
# Steps and what they write under $OUT:
#   env    nvidia-smi, python, jax and its devices                     -> env.txt
#   table  attention.py: every path at B4 S4096 H16 (and KV4) and B1 S16384, packed cuDNN
#          (cudnn_packed) next to pallas_gpu on packed rows                 -> table.txt
#   train  train_step.py, 1.7B-28L at 4x4096 bf16: baseline, G1 elementwise, G1 headwise
#                                                                       -> train.txt
#   check  attention.py --check: float32 values and gradients vs XLA, and packed cuDNN's
#          (bfloat16) on a GPU                                          -> check.txt
#   memory preflight_memory.py: the GPU pre-flight's per-GPU total (deviceless) against the
#          same step compiled and run here (peak bytes in use)          -> memory.txt
#   sweep  sweep_blocks.py: forward, then forward+backward block sizes, timed by the table's
#          harness; prints the winner to paste into ops/block_sizes.py  -> sweep.txt, sweep.json
#   every step's exit status and seconds (124: timed out)              -> summary.txt
# A failing or timed-out step does not stop the next; the script exits 1 if any failed. The
# end of the output repeats the results (for remote consoles that keep only the last 12,000
# characters).
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/runs/device_benchmark}
SMALL=${SMALL:-0}
# The CPU rehearsal interprets the kernels: every cap and the default budget 4x longer.
SCALE=1
[ "$SMALL" = 1 ] && SCALE=4
BUDGET_S=${BUDGET_S:-$((600 * SCALE))}
DRY_RUN=${DRY_RUN:-0}
INSTALL_WHEELS=${INSTALL_WHEELS:-auto}
PYTHON=${PYTHON:-python3}
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(env table train check memory sweep)
for step in "${STEPS[@]}"; do
  case "$step" in
    env | check | memory | sweep | table | train | train_pallas) ;;
    *) echo "unknown step '$step'; choose from: env table train check memory sweep train_pallas" >&2
       exit 2 ;;
  esac
done
mkdir -p "$OUT"
: > "$OUT/summary.txt"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
START=$SECONDS
FAILED=0

# A GPU machine without a package index: wheels copied into .whl/ (`pip download -d .whl
# ml-collections grain` on a machine with one) provide what train_step.py needs.
shopt -s nullglob
wheels=(.whl/*.whl)
shopt -u nullglob
if [ "$INSTALL_WHEELS" != 0 ] && [ ${#wheels[@]} -gt 0 ]; then
  if [ "$DRY_RUN" = 1 ]; then
    echo "+ $PYTHON -m pip install ... --target .site ${wheels[*]}"
  else
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target .site "${wheels[@]}" || echo "wheel install failed; train may not import"
  fi
  export PYTHONPATH="$PWD/.site:$PYTHONPATH"
fi

if [ "$SMALL" = 1 ]; then
  small=(--small)
  train_args=(--steps=2 --warmup=1)
else
  small=()
  train_args=(--arch=dense_1p7b_28l --seq_len=4096 --batch=4 --dtype=bfloat16
              --remat=dots_with_no_batch_dims_saveable --steps=10 --warmup=2)
fi

left() { echo $((BUDGET_S - (SECONDS - START))); }

# run_step NAME CAP_S LOG CMD...: CMD under `timeout min(CAP_S, time left)`, tee'd into $OUT/LOG.
run_step() {
  local name=$1 cap=$2 log=$3
  shift 3
  local limit t0 rc cmd="$*"
  cap=$((cap * SCALE))
  limit=$(left)
  ((cap < limit)) && limit=$cap
  cmd=${cmd//$'\n'/ }
  ((${#cmd} > 200)) && cmd="${cmd:0:200}..."
  echo "=== $name (timeout ${limit} s): $cmd" | tee -a "$OUT/$log"
  [ "$DRY_RUN" = 1 ] && return 0
  if ((limit < 15)); then
    echo "$name: skipped, ${limit} s left of BUDGET_S=$BUDGET_S" | tee -a "$OUT/$log" "$OUT/summary.txt"
    return 0
  fi
  t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$OUT/$log"
  rc=${PIPESTATUS[0]}
  ((rc == 0)) || FAILED=1
  echo "$name: exit $rc$( ((rc == 124 || rc == 137)) && echo ' (timed out)') after $((SECONDS - t0)) s" \
    | tee -a "$OUT/summary.txt"
}

step_env() {
  run_step env 10 env.txt nvidia-smi
  run_step "env python" 30 env.txt "$PYTHON" -c '
import sys, jax
from gated_attention.ops.block_sizes import device_kind_key
print("python", sys.version.split()[0], "| jax", jax.__version__, "| backend",
      jax.default_backend(), "| block-size table key", device_kind_key())
for d in jax.devices():
    print(" ", d, "|", d.device_kind)
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton: not importable")
'
}

step_check() {
  run_step check 60 check.txt "$PYTHON" benchmarks/attention.py --check "${small[@]}"
}

step_memory() {
  run_step memory 60 memory.txt "$PYTHON" benchmarks/preflight_memory.py "${small[@]}"
}

step_sweep() {
  local budget=$(($(left) - 20))
  ((budget > 30 * SCALE)) && budget=$((30 * SCALE))
  ((budget < 20)) && budget=20
  run_step sweep 50 sweep.txt "$PYTHON" benchmarks/sweep_blocks.py "${small[@]}" \
    --budget_s="$budget" --out="$OUT/sweep.json"
}

step_table() {
  run_step table 180 table.txt "$PYTHON" benchmarks/attention.py "${small[@]}"
}

step_train() {
  local variant
  for variant in baseline g1_sdpa_elementwise g1_sdpa_headwise; do
    run_step "train $variant" 70 train.txt "$PYTHON" benchmarks/train_step.py \
      "${train_args[@]}" --variants="$variant"
  done
}

step_train_pallas() {
  run_step "train g1_sdpa_elementwise pallas_gpu" 70 train.txt "$PYTHON" \
    benchmarks/train_step.py "${train_args[@]}" --variants=g1_sdpa_elementwise \
    --attention_impl=pallas_gpu
}

recap() {
  echo
  echo "=================== recap (full logs in $OUT) ==================="
  # Lines cut at 180 characters so that the recap fits in the tool's 12,000-character tail.
  [ -f "$OUT/check.txt" ] && grep -E '^\| |^# check' "$OUT/check.txt" | cut -c1-180
  [ -f "$OUT/memory.txt" ] && grep -E '^\| |^# train' "$OUT/memory.txt" | cut -c1-180
  [ -f "$OUT/sweep.txt" ] && grep -E '^\| (fwd|fwd\+bwd) |^#|^ ' "$OUT/sweep.txt" | cut -c1-180
  [ -f "$OUT/table.txt" ] && grep -E '^\||^# this' "$OUT/table.txt" | cut -c1-180
  [ -f "$OUT/train.txt" ] && grep -E '^\| (baseline|g1)|^device' "$OUT/train.txt" | cut -c1-180
  [ -f "$OUT/train.txt" ] && awk -F'|' '$2 ~ /^ baseline / {b = $4}
    $2 ~ /^ g1_sdpa_elementwise / && !g {g = $4}
    END {if (b > 0 && g > 0) printf "gate overhead (g1 / baseline step time): %.3f\n", g / b}' \
    "$OUT/train.txt"
  echo "--- steps ($((SECONDS - START)) s in all, BUDGET_S=$BUDGET_S) ---"
  cat "$OUT/summary.txt"
}

for step in "${STEPS[@]}"; do
  case "$step" in
    env) step_env ;;
    check) step_check ;;
    memory) step_memory ;;
    sweep) step_sweep ;;
    table) step_table ;;
    train) step_train ;;
    train_pallas) step_train_pallas ;;
  esac
done
[ "$DRY_RUN" = 1 ] || recap
exit "$FAILED"
