#!/usr/bin/env bash
# Submit one training run to SLURM: the pre-flight first, here (the config checked and its
# train and eval steps compiled for the nodes' GPUs on this machine's CPU, no GPU used), then
# `sbatch gpu_scripts/train.sbatch`. A config that is wrong, does not compile or does not
# fit is refused before it waits in the queue or holds an allocation.
#   gpu_scripts/submit.sh NAME ARCH VARIANT [--config.train.steps=1000 ...]
# Environment: NODES (default 2), GPU (h100-8, h200-8, b200-8, a100-80gb-8; default h200-8),
# RUNS (default runs: on storage every node sees), PYTHON (default .venv/bin/python),
# NO_PREFLIGHT=1 to skip the compile. sbatch's own variables choose the rest, e.g.
# SBATCH_PARTITION, SBATCH_TIMELIMIT, SBATCH_ACCOUNT. Submitting the same NAME again resumes.
set -euo pipefail

if [[ $# -lt 3 || "$1" == -h || "$1" == --help ]]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
fi
name=$1 arch=$2 variant=$3
shift 3
[[ "$name$arch$variant" =~ ^[A-Za-z0-9._-]+$ ]] || {
  echo "error: NAME, ARCH and VARIANT may only hold letters, digits, '.', '-' and '_'" >&2
  exit 2
}
nodes=${NODES:-2} gpu=${GPU:-h200-8} runs=${RUNS:-runs} python=${PYTHON:-.venv/bin/python}
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || { echo "error: NODES=$nodes must be a number of nodes" >&2; exit 2; }
config="configs/ablation.py:arch=$arch,variant=$variant"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [[ "${NO_PREFLIGHT:-0}" == 1 ]]; then
  echo "# Pre-flight skipped (NO_PREFLIGHT=1): $config is not checked for $nodes x $gpu" >&2
elif ! "$python" -m gated_attention.preflight --config="$config" --accelerator="$gpu" \
    --hosts="$nodes" "$@"; then
  echo "error: the pre-flight refused $config on $nodes x $gpu (its error is above);" \
    "nothing was submitted" >&2
  exit 2
fi
exec sbatch --nodes="$nodes" --export="ALL,RUNS=$runs,PYTHON=$python" \
  gpu_scripts/train.sbatch "$name" "$arch" "$variant" "$@"
