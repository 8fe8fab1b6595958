#!/usr/bin/env bash
# Start one training run on a GKE cluster's TPUs through xpk (for capacity on GKE; TPU7x,
# Ironwood, is offered on GKE only), its workdir on $BUCKET/runs/NAME.
#   tpu_scripts/gke_launch.sh --name NAME [--arch ARCH] [--variant VARIANT] [--no-preflight]
#       [--config PATH] [--dry-run] [-- --config.train.steps=1000 ...]
# Settings (pod.env): PROJECT, ZONE, BUCKET, TPU_NAME (prefixes the workload's name),
# TPU_TYPE as xpk names it (v5p-128, v6e-256, tpu7x-128, ...), GKE_CLUSTER, and optionally
# SLICES (--num-slices), MAX_RESTARTS (default 10: JobSet restarts after a failure or a
# preemption, which resume from the last checkpoint), SPOT, BASE_DOCKER_IMAGE (default
# python:3.11), EXTRAS and EXTRA_XPK_ARGS (e.g. (--reservation=R), (--flex), (--priority=high)).
# First, here, the same pre-flight as launch.sh (the config checked, its steps compiled for
# SLICES x TPU_TYPE); --no-preflight skips it. xpk builds the image from the committed HEAD
# of this checkout (git archive, as setup.sh ships it); each container installs the project
# with jax[tpu] pinned to this checkout's jax, then runs main through the log wrapper that
# copies each worker's log to $BUCKET/runs/NAME/logs/. Follow it with `xpk workload list`.
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_arch="tiny" FLAG_variant="baseline" FLAG_no_preflight=0
parse_flags name arch variant no-preflight!
load_settings
require BUCKET TPU_TYPE GKE_CLUSTER
check_name --name "$FLAG_name"
[[ "$FLAG_arch$FLAG_variant" =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "--arch and --variant may only hold letters, digits, '.', '-' and '_'"
MAX_RESTARTS="${MAX_RESTARTS:-10}"
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS=$MAX_RESTARTS in $CONFIG_FILE must be a number"
BASE_DOCKER_IMAGE="${BASE_DOCKER_IMAGE:-python:3.11}"
settings_array EXTRA_XPK_ARGS EXTRA_XPK
# xpk's workload names: lower-case letters, digits and '-', under 40 characters.
workload="$(printf '%s-%s' "$TPU_NAME" "$FLAG_name" | tr 'A-Z_.' 'a-z--')"
[[ "$workload" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && ${#workload} -lt 40 ]] ||
  die "workload name '$workload' (TPU_NAME-NAME) must start with a letter, end with a letter" \
    "or digit and be under 40 characters, as xpk requires: shorten TPU_NAME or --name"
if ((!DRY_RUN)); then
  command -v xpk >/dev/null 2>&1 || die "xpk is not on the PATH: pip install xpk" \
    "(https://github.com/AI-Hypercomputer/xpk), or add --dry-run to print the commands"
fi
config="configs/ablation.py:arch=$FLAG_arch,variant=$FLAG_variant"
if ((FLAG_no_preflight)); then
  echo "# Pre-flight skipped (--no-preflight): $config is not checked for $TPU_TYPE" >&2
else
  preflight_or_die "$config" "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}"
fi
if [[ -z "${JAX_VERSION:-}" ]]; then
  JAX_VERSION="$("$LOCAL_PYTHON" -c \
    'from importlib.metadata import version; print(version("jax"))' 2>/dev/null)" ||
    die "cannot read the jax version of $LOCAL_PYTHON: set JAX_VERSION in $CONFIG_FILE"
fi

workdir="${BUCKET%/}/runs/$FLAG_name"
# The training command, as gated_attention/train_command.py builds it for every launcher.
main="$(cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" "$LOCAL_PYTHON" -c \
  'import sys; from gated_attention.train_command import main; sys.exit(main(sys.argv[1:]))' \
  --python=python --config="$config" --workdir="$workdir" --progress=false \
  -- "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}")" ||
  die "cannot build the training command with $LOCAL_PYTHON"
# GKE sets TPU_WORKER_ID and TPU_WORKER_HOSTNAMES in every pod (and, with several slices,
# MEGASCALE_SLICE_ID): --multihost=auto joins the other pods from GKE's variables.
# shellcheck disable=SC2016  # expanded by the container's shell, not here
logname='slice-${MEGASCALE_SLICE_ID:-0}-worker-${TPU_WORKER_ID:-0}.log'
command=""
# Several slices: GKE gives every pod its slice's coordinator and id; the slice count is
# exported here, as Google's MaxText recipes for xpk do.
((SLICES == 1)) || command="export MEGASCALE_NUM_SLICES=$SLICES && "
command+="pip install -q -e '.[gcs${EXTRAS:+,$EXTRAS}]' 'jax[tpu]==$JAX_VERSION'"
command+=" && python -m gated_attention.pods.worker_log --dest $(printf '%q' "$workdir/logs")"
command+=" --name \"$logname\" -- $main"

source_dir="${TMPDIR:-/tmp}/gated_attention-xpk-$workload"
run rm -rf "$source_dir"
run mkdir -p "$source_dir"
run git -C "$REPO_ROOT" archive --format=tar --output="$source_dir.tar" HEAD
run tar -xf "$source_dir.tar" -C "$source_dir"
spot=()
[[ "$SPOT" == true ]] && spot=(--spot)
run xpk workload create --cluster="$GKE_CLUSTER" --project="$PROJECT" --zone="$ZONE" \
  --workload="$workload" --tpu-type="$TPU_TYPE" --num-slices="$SLICES" \
  --max-restarts="$MAX_RESTARTS" --base-docker-image="$BASE_DOCKER_IMAGE" \
  --script-dir="$source_dir" "${spot[@]+"${spot[@]}"}" "${EXTRA_XPK[@]+"${EXTRA_XPK[@]}"}" \
  --command="$command"
if ((DRY_RUN)); then
  echo "# Would start $FLAG_name as xpk workload $workload on $GKE_CLUSTER; workdir $workdir." >&2
else
  echo "# Submitted $FLAG_name as xpk workload $workload on $GKE_CLUSTER; workdir $workdir" \
    "(worker logs in $workdir/logs/). Follow it: xpk workload list --cluster=$GKE_CLUSTER" >&2
fi
