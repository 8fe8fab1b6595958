#!/usr/bin/env bash
# Start a training run (or, with --grid, every run of a grid) on a GKE cluster's TPUs through
# xpk: one JobSet workload per run, queued by Kueue until its slices are free; JobSet restarts
# it after a preemption or a host failure (up to MAX_RESTARTS), and it resumes from its last
# checkpoint in the bucket. TPU7x (Ironwood) is offered on GKE only.
#   tpu_scripts/gke_launch.sh --name NAME [--arch ARCH] [--variant VARIANT] [--image IMAGE]
#       [--no-preflight] [--config PATH] [--dry-run] [-- --config.train.steps=1000 ...]
#   tpu_scripts/gke_launch.sh --grid experiments/grids/FILE.py --name NAME [--scale tiny]
#       [--seeds 0,1] [--only RUN,...] [--image IMAGE] [--no-preflight] [...]
#       [-- flags for every run]
# A run's workdir is $BUCKET/runs/NAME; a grid's runs are $BUCKET/grids/NAME/<run name>, as
# experiments.run_grid names them. Settings (pod.env): PROJECT, ZONE, BUCKET, TPU_NAME
# (prefixes each workload's name), TPU_TYPE as xpk names it (v5p-128, v6e-256, tpu7x-128),
# GKE_CLUSTER; optionally SLICES (--num-slices), MAX_RESTARTS (default 10), SPOT,
# TERMINATION_GRACE_S (default 30: the seconds a pod has to save after its SIGTERM),
# IMAGE_REPO (default gcr.io/PROJECT/gated-attention), BASE_IMAGE (default
# python:3.11-slim), EXTRAS, JAX_VERSION and EXTRA_XPK_ARGS (e.g. (--reservation=R), (--flex),
# (--priority=high)).
# First, here, the same pre-flight as launch.sh (each distinct run config, seeds aside,
# compiled for SLICES x TPU_TYPE); --no-preflight skips it. Then the image: the Dockerfile of
# a clean tree of HEAD (the project as a wheel, jax[tpu] pinned to this checkout's jax),
# built and pushed once as IMAGE_REPO:<commit>; --image IMAGE names one built before. Each
# container execs the log wrapper (it gets the pod's SIGTERM, passes it to main and waits for
# the save; each attempt's log goes to <workdir>/logs/) and main. Follow the workloads with
# `xpk workload list --cluster GKE_CLUSTER`.
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_arch="tiny" FLAG_variant="baseline" FLAG_no_preflight=0 FLAG_image=""
FLAG_grid="" FLAG_scale="tiny" FLAG_seeds="0" FLAG_only=""
parse_flags name arch variant no-preflight! image grid scale seeds only
load_settings
require BUCKET TPU_TYPE GKE_CLUSTER
check_name --name "$FLAG_name"
[[ "$FLAG_arch$FLAG_variant$FLAG_scale" =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "--arch, --variant and --scale may only hold letters, digits, '.', '-' and '_'"
[[ "$FLAG_seeds" =~ ^[0-9]+(,[0-9]+)*$ ]] || die "--seeds $FLAG_seeds must look like 0 or 0,1,2"
if [[ -n "$FLAG_grid" && ! -f "$REPO_ROOT/$FLAG_grid" ]]; then
  die "--grid $FLAG_grid is not a file of this checkout (choose one of:" \
    "$(cd "$REPO_ROOT" && echo experiments/grids/*.py))"
fi
MAX_RESTARTS="${MAX_RESTARTS:-10}"
[[ "$MAX_RESTARTS" =~ ^[0-9]+$ ]] || die "MAX_RESTARTS=$MAX_RESTARTS in $CONFIG_FILE must be a number"
TERMINATION_GRACE_S="${TERMINATION_GRACE_S:-30}"
[[ "$TERMINATION_GRACE_S" =~ ^[0-9]+$ ]] ||
  die "TERMINATION_GRACE_S=$TERMINATION_GRACE_S in $CONFIG_FILE must be a number of seconds"
BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim}"
IMAGE_REPO="${IMAGE_REPO:-gcr.io/$PROJECT/gated-attention}"
settings_array EXTRA_XPK_ARGS EXTRA_XPK
if ((!DRY_RUN)); then
  command -v xpk >/dev/null 2>&1 || die "xpk is not on the PATH: pip install xpk" \
    "(https://github.com/AI-Hypercomputer/xpk), or add --dry-run to print the commands"
  [[ -n "$FLAG_image" ]] || command -v docker >/dev/null 2>&1 || die "docker is not on the" \
    "PATH to build the image: install it, name a built image with --image, or add --dry-run"
fi

# The runs: NAME, config spec and flags each (a grid's from experiments.grid_workloads).
runs=()
if [[ -n "$FLAG_grid" ]]; then
  root="${BUCKET%/}/grids/$FLAG_name"
  listing="$(cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" "$LOCAL_PYTHON" -m \
    experiments.grid_workloads "$FLAG_grid" --root "$root" --scale "$FLAG_scale" \
    --seeds "$FLAG_seeds" --only "$FLAG_only")" ||
    die "the grid $FLAG_grid could not be listed (error above)"
  mapfile -t runs <<<"$listing"
else
  root="${BUCKET%/}/runs"
  runs=("$(printf '%q %q' "$FLAG_name" "configs/ablation.py:arch=$FLAG_arch,variant=$FLAG_variant")")
fi

# xpk's workload names: lower-case letters, digits and '-', under 40 characters; a grid's
# runs are numbered in the grid's order.
workload_name() {
  local workload
  if [[ -n "$FLAG_grid" ]]; then
    workload="$(printf '%s-%s-%d' "$TPU_NAME" "$FLAG_name" "$1" | tr 'A-Z_.' 'a-z--')"
  else
    workload="$(printf '%s-%s' "$TPU_NAME" "$FLAG_name" | tr 'A-Z_.' 'a-z--')"
  fi
  [[ "$workload" =~ ^[a-z]([-a-z0-9]*[a-z0-9])?$ && ${#workload} -lt 40 ]] ||
    die "workload name '$workload' (TPU_NAME-NAME) must start with a letter, end with a" \
      "letter or digit and be under 40 characters, as xpk requires: shorten TPU_NAME or --name"
  echo "$workload"
}
workload_name $((${#runs[@]} - 1)) >/dev/null  # the longest name, checked before anything

# The pre-flight of each distinct run config: a grid seed sets the weights and the data order
# only, so one compile serves every seed.
declare -A checked=()
words=()
for line in "${runs[@]}"; do
  eval "words=($line)"  # shell-quoted words, from this checkout's own code
  key=""
  overrides=()
  for arg in "${words[@]:2}" "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}"; do
    [[ "$arg" == --config.seed=* || "$arg" == --config.data.shuffle_seed=* ]] && continue
    overrides+=("$arg")
    key+=" $arg"
  done
  key="${words[1]}$key"
  [[ -n "${checked[$key]:-}" ]] && continue
  checked[$key]=1
  if ((FLAG_no_preflight)); then
    echo "# Pre-flight skipped (--no-preflight): ${words[1]} is not checked for $TPU_TYPE" >&2
  else
    preflight_or_die "${words[1]}" "${overrides[@]+"${overrides[@]}"}"
  fi
done

# The image, built once per commit from a clean tree (the Dockerfile's wheel stage builds
# the project from it).
image="$FLAG_image"
if [[ -z "$image" ]]; then
  resolve_jax_version
  commit="$(head_commit)"
  image="$IMAGE_REPO:$commit"
  context="$BUILD_ROOT/image-$commit"
  run rm -rf "$context"
  run mkdir -p "$context"
  run git -C "$REPO_ROOT" archive --format=tar --output="$context.tar" "$commit"
  run tar -xf "$context.tar" -C "$context"
  run docker build --build-arg="BASE_IMAGE=$BASE_IMAGE" --build-arg="JAX_VERSION=$JAX_VERSION" \
    --build-arg="EXTRAS=gcs${EXTRAS:+,$EXTRAS}" --tag="$image" "$context"
  run docker push "$image"
fi

spot=()
[[ "$SPOT" == true ]] && spot=(--spot)
# GKE sets TPU_WORKER_ID and TPU_WORKER_HOSTNAMES in every pod (and, with several slices,
# MEGASCALE_SLICE_ID): --multihost=auto joins the other pods from GKE's variables.
# shellcheck disable=SC2016  # expanded by the container's shell, not here
logname='slice-${MEGASCALE_SLICE_ID:-0}-worker-${TPU_WORKER_ID:-0}.log'
index=0
for line in "${runs[@]}"; do
  eval "words=($line)"
  run_name="${words[0]}"
  workdir="$root/$run_name"
  workload="$(workload_name "$index")"
  main="$(train_command "${words[1]}" "$workdir" python "${words[@]:2}" \
    "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}")"
  command=""
  # Several slices: GKE gives every pod its slice's coordinator and id; the slice count is
  # exported here, as Google's MaxText recipes for xpk do.
  ((SLICES == 1)) || command="export MEGASCALE_NUM_SLICES=$SLICES && "
  # exec: the log wrapper is the process xpk's container script sends the pod's SIGTERM to.
  command+="exec python -m gated_attention.pods.worker_log --dest $(printf '%q' "$workdir/logs")"
  command+=" --name \"$logname\" -- $main"
  run xpk workload create --cluster="$GKE_CLUSTER" --project="$PROJECT" --zone="$ZONE" \
    --workload="$workload" --tpu-type="$TPU_TYPE" --num-slices="$SLICES" \
    --max-restarts="$MAX_RESTARTS" --termination-grace-period-seconds="$TERMINATION_GRACE_S" \
    --docker-image="$image" "${spot[@]+"${spot[@]}"}" "${EXTRA_XPK[@]+"${EXTRA_XPK[@]}"}" \
    --command="$command"
  echo "# ${run_name}: xpk workload $workload, workdir $workdir (logs in $workdir/logs/)." >&2
  index=$((index + 1))
done
if ((DRY_RUN)); then
  echo "# Would submit ${#runs[@]} workload(s) on $GKE_CLUSTER with image $image." >&2
else
  echo "# Submitted ${#runs[@]} workload(s) on $GKE_CLUSTER with image $image; Kueue starts" \
    "each when its slices are free. Follow them: xpk workload list --cluster=$GKE_CLUSTER" >&2
fi
