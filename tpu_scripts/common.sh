# shellcheck shell=bash
# Shared by every tpu_scripts/*.sh: flags, settings, checks, and running or printing commands.
#   --config PATH   settings file (default: tpu_scripts/pod.env; see pod.env.example)
#   --dry-run       print the exact gcloud commands instead of running them (gcloud not
#                   needed); local checks such as the pre-flight still run
#   --help          say what the script does and which flags it takes
set -euo pipefail

SCRIPTS_DIR="$(cd "${BASH_SOURCE[0]%/*}" && pwd)"
# shellcheck disable=SC2034  # used by the scripts that source this file
REPO_ROOT="$(cd "$SCRIPTS_DIR/.." && pwd)"
# On every TPU worker; the remote shell expands the tilde.
# shellcheck disable=SC2088,SC2034
REMOTE_DIR='~/gated_attention'
# shellcheck disable=SC2088,SC2034
REMOTE_LOGS='~/logs'
DRY_RUN=0
CONFIG_FILE="$SCRIPTS_DIR/pod.env"
ARGS=()
# The Python of this checkout, for the local config check and pre-flight compile.
LOCAL_PYTHON="${GATED_ATTENTION_PYTHON:-$REPO_ROOT/.venv/bin/python}"

die() {
  echo "error: $*" >&2
  exit 2
}

# The calling script's leading comment block (after the shebang), as its --help.
usage() {
  awk 'NR == 1 { next } /^# shellcheck/ { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' \
    "$0"
  echo "Flags every script takes: --config PATH (default tpu_scripts/pod.env), --dry-run, --help."
}

# Split the flags every script shares from the script's own (left in ARGS).
parse_common_flags() {
  while (($#)); do
    case "$1" in
      -h | --help) usage; exit 0 ;;
      --dry-run) DRY_RUN=1 ;;
      --config) (($# > 1)) || die "--config needs a path"; CONFIG_FILE="$2"; shift ;;
      --config=*) CONFIG_FILE="${1#--config=}" ;;
      *) ARGS+=("$1") ;;
    esac
    shift
  done
}

# Read the settings file; name each missing setting.
load_settings() {
  [[ -f "$CONFIG_FILE" ]] || die "settings file $CONFIG_FILE not found: copy" \
    "tpu_scripts/pod.env.example to tpu_scripts/pod.env and edit it, or pass --config PATH"
  # Settings come from the file alone: a variable of the same name in your shell (a MOUNT
  # path, a BUCKET of another project) is not taken for one it leaves out.
  unset PROJECT ZONE BUCKET TPU_NAME TPU_TYPE SPOT QUEUED EXTRAS PYTHON_VERSION SLICES \
    MEGASCALE_PORT EXTRA_CREATE_ARGS EXTRA_SSH_ARGS GCLOUD_TRACK MOUNT RUNTIME_VERSION \
    JAX_VERSION GKE_CLUSTER MAX_RESTARTS TERMINATION_GRACE_S IMAGE_REPO BASE_IMAGE EXTRA_XPK_ARGS
  # shellcheck disable=SC1090
  source "$CONFIG_FILE"
  require PROJECT ZONE TPU_NAME
  SPOT="${SPOT:-false}"
  QUEUED="${QUEUED:-true}"
  EXTRAS="${EXTRAS:-}"
  [[ "$SPOT" == true || "$SPOT" == false ]] || die "SPOT=$SPOT in $CONFIG_FILE must be true or false"
  [[ "$QUEUED" == true || "$QUEUED" == false ]] ||
    die "QUEUED=$QUEUED in $CONFIG_FILE must be true or false"
  PYTHON_VERSION="${PYTHON_VERSION:-3.11}"
  [[ "$PYTHON_VERSION" =~ ^3\.[0-9]+$ ]] ||
    die "PYTHON_VERSION=$PYTHON_VERSION in $CONFIG_FILE must look like 3.11"
  SLICES="${SLICES:-1}"
  [[ "$SLICES" =~ ^[1-9][0-9]*$ ]] ||
    die "SLICES=$SLICES in $CONFIG_FILE must be a whole number of slices (1, 2, ...)"
  ((SLICES == 1)) || [[ "$QUEUED" == true ]] ||
    die "SLICES=$SLICES in $CONFIG_FILE needs QUEUED=true (one queued resource holds the slices)"
  MEGASCALE_PORT="${MEGASCALE_PORT:-8080}"
  [[ "$MEGASCALE_PORT" =~ ^[0-9]+$ ]] || die "MEGASCALE_PORT=$MEGASCALE_PORT must be a port number"
  settings_array EXTRA_CREATE_ARGS EXTRA_CREATE
  settings_array EXTRA_SSH_ARGS EXTRA_SSH
  GCLOUD_TRACK="${GCLOUD_TRACK:-}"
  [[ -z "$GCLOUD_TRACK" || "$GCLOUD_TRACK" == alpha || "$GCLOUD_TRACK" == beta ]] ||
    die "GCLOUD_TRACK=$GCLOUD_TRACK in $CONFIG_FILE must be empty, alpha or beta"
  MOUNT="${MOUNT:-}"
  if [[ -n "$MOUNT" && ! "$MOUNT" =~ ^[a-z0-9][a-z0-9._-]*:/[A-Za-z0-9._-][A-Za-z0-9._/-]*$ ]]; then
    die "MOUNT=$MOUNT in $CONFIG_FILE must be BUCKET_NAME:/absolute/dir (e.g." \
      "my-bucket:/tmp/gcs/my-bucket), the bucket gcsfuse mounts on every worker"
  fi
}

# EXTRA_*_ARGS may be a bash array in the settings file, EXTRA_SSH_ARGS=(--internal-ip), or
# a string of words, EXTRA_SSH_ARGS="--internal-ip"; either way they reach gcloud word by
# word. settings_array SETTING ARRAY copies SETTING into the array ARRAY.
settings_array() {
  if [[ "$(declare -p "$1" 2>/dev/null)" == "declare -a"* ]]; then
    eval "$2=(\"\${$1[@]+\"\${$1[@]}\"}\")"  # $1 and $2 are fixed names, never user input
  else
    read -r -a "$2" <<<"${!1:-}"
  fi
}

# The TPU VMs: TPU_NAME, or with SLICES=N the N nodes of the queued resource, named as gcloud
# names them from --node-prefix: TPU_NAME-0 ... TPU_NAME-(N-1).
node_names() {
  if ((SLICES == 1)); then
    echo "$TPU_NAME"
  else
    local i
    for ((i = 0; i < SLICES; i++)); do echo "$TPU_NAME-$i"; done
  fi
}

# Stop unless the pre-flight can describe TPU_TYPE (python -m gated_attention.compile.tpu_topologies):
# a slice that is created but cannot be launched on bills for nothing. --no-preflight skips.
check_type_or_die() {
  [[ -x "$LOCAL_PYTHON" ]] || die "no Python at $LOCAL_PYTHON to check TPU_TYPE=$TPU_TYPE: run" \
    "'make install-test' in this checkout, set GATED_ATTENTION_PYTHON, or pass --no-preflight"
  local answer
  if ! answer="$(cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" "$LOCAL_PYTHON" -c \
    'import sys; from gated_attention.compile.tpu_topologies import main; sys.exit(main(sys.argv[1:]))' \
    "$TPU_TYPE" 2>&1)"; then
    die "TPU_TYPE=$TPU_TYPE in $CONFIG_FILE: the pre-flight cannot compile for it, so" \
      "launch.sh could not check a run on it (${answer#error: }). Nothing was created; pass" \
      "--no-preflight to create it anyway (then launch with --no-preflight)"
  fi
  echo "# $answer" >&2
}

# TPU VM image for an accelerator type: the versions Google's Cloud TPU documentation lists
# for JAX per generation (page "TPU software versions"): v6e, v5p and v5e each have their own.
runtime_for_type() {
  case "$1" in
    v6e-*) echo v2-alpha-tpuv6e ;;
    v5p-*) echo v2-alpha-tpuv5 ;;
    v5litepod-*) echo v2-alpha-tpuv5-lite ;;
    v4-* | v3-* | v2-*) echo tpu-ubuntu2204-base ;;
    *) return 1 ;;
  esac
}

# TPU7x (Ironwood) has no TPU VMs: Google offers it on GKE only.
refuse_gke_only_type() {
  [[ "$TPU_TYPE" != tpu7x-* ]] || die "TPU_TYPE=$TPU_TYPE in $CONFIG_FILE: TPU7x (Ironwood) is" \
    "offered on GKE only; launch on it with tpu_scripts/gke_launch.sh"
}

# RUNTIME_VERSION from pod.env, else the documented image for TPU_TYPE's generation; an
# image documented for another generation is refused.
resolve_runtime_version() {
  local expected known
  refuse_gke_only_type
  expected="$(runtime_for_type "$TPU_TYPE")" ||
    die "TPU_TYPE=$TPU_TYPE in $CONFIG_FILE: no runtime image known for it; set RUNTIME_VERSION"
  if [[ -z "${RUNTIME_VERSION:-}" ]]; then
    RUNTIME_VERSION="$expected"
    return 0
  fi
  for known in v2-alpha-tpuv6e v2-alpha-tpuv5 v2-alpha-tpuv5-lite tpu-ubuntu2204-base; do
    if [[ "$RUNTIME_VERSION" == "$known" && "$known" != "$expected" ]]; then
      die "RUNTIME_VERSION=$RUNTIME_VERSION in $CONFIG_FILE is the image for another TPU" \
        "generation; $TPU_TYPE needs $expected (or leave RUNTIME_VERSION unset)"
    fi
  done
}

# The config check and the pre-flight compile of one run for $TPU_TYPE, here, before anything
# is created or started: on failure stop with its error. Only --config.* flags apply to it.
preflight_or_die() {
  local config="$1" overrides=() arg
  shift
  for arg in "$@"; do
    [[ "$arg" == --config.* ]] && overrides+=("$arg")
  done
  ((SLICES == 1)) || overrides+=("--slices=$SLICES")
  [[ -x "$LOCAL_PYTHON" ]] || die "no Python at $LOCAL_PYTHON for the pre-flight: run" \
    "'make install-test' in this checkout, or set GATED_ATTENTION_PYTHON"
  echo "# Pre-flight: $config on $SLICES x $TPU_TYPE (compiled here, no TPU used)" >&2
  if ! (cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" "$LOCAL_PYTHON" -m gated_attention.preflight \
    --config="$config" --accelerator="$TPU_TYPE" "${overrides[@]+"${overrides[@]}"}" >&2); then
    die "pre-flight refused $config on $TPU_TYPE (its error is above); nothing was started"
  fi
}

require() {
  local name
  for name in "$@"; do
    [[ -n "${!name:-}" ]] || die "$name is not set in $CONFIG_FILE (see tpu_scripts/pod.env.example)"
  done
  if [[ " $* " == *" BUCKET "* && "$BUCKET" != gs://* ]]; then
    die "BUCKET=$BUCKET in $CONFIG_FILE must be a gs:// path every TPU worker can write"
  fi
  if [[ " $* " == *" TPU_TYPE "* && ! "$TPU_TYPE" =~ ^(v|tpu)[0-9][a-z0-9]*-[0-9]+$ ]]; then
    die "TPU_TYPE=$TPU_TYPE in $CONFIG_FILE is not an accelerator type such as v4-32," \
      "v5litepod-8, v5p-16, v6e-16 or tpu7x-8"
  fi
}

require_gcloud() {
  ((DRY_RUN)) && return 0
  command -v gcloud >/dev/null 2>&1 || die "gcloud is not on the PATH: install the Google" \
    "Cloud CLI (https://cloud.google.com/sdk/docs/install), or add --dry-run to print the commands"
}

# Run a command, or print it shell-quoted (one line, ready to paste) in dry-run mode.
run() {
  if ((DRY_RUN)); then
    local out=() arg
    for arg in "$@"; do
      if [[ "$arg" =~ ^[A-Za-z0-9_./:=@%+,-]+$ ]]; then
        out+=("$arg")
      else  # single quotes, each ' written as '\''
        out+=("'${arg//\'/\'\\\'\'}'")
      fi
    done
    echo "${out[*]}"
  else
    "$@"
  fi
}

# Parse the script's own flags from ARGS. Each SPEC is "name" (takes a value, sets
# FLAG_name) or "name!" (a switch, sets FLAG_name=1); words after `--` go to PASSTHROUGH.
parse_flags() {
  local specs=" $* " i=0 arg key value var
  PASSTHROUGH=()
  while ((i < ${#ARGS[@]})); do
    arg="${ARGS[i]}"
    if [[ "$arg" == -- ]]; then
      # shellcheck disable=SC2034  # read by the scripts that source this file
      PASSTHROUGH=("${ARGS[@]:i+1}")
      break
    fi
    [[ "$arg" == --* ]] || die "unexpected argument '$arg' (flags: ${specs//!/} --config --dry-run)"
    key="${arg%%=*}"
    key="${key#--}"
    var="FLAG_${key//-/_}"
    if [[ "$specs" == *" $key! "* ]]; then
      printf -v "$var" 1
    elif [[ "$specs" == *" $key "* ]]; then
      if [[ "$arg" == *=* ]]; then
        value="${arg#*=}"
      else
        ((i + 1 < ${#ARGS[@]})) || die "--$key needs a value"
        i=$((i + 1))
        value="${ARGS[i]}"
      fi
      printf -v "$var" '%s' "$value"
    else
      die "unknown flag '$arg' (flags: ${specs//!/} --config --dry-run)"
    fi
    i=$((i + 1))
  done
}

# with_worker_log DEST NAME COMMAND: COMMAND run under gated_attention.pods.worker_log, which
# keeps its output and copies it to this attempt's own object under DEST (NAME with the
# attempt's start time: never over an earlier attempt's log) at least every 30 s and when it
# ends. It passes SIGTERM on to COMMAND and waits for it (a trainer saves first), then records
# the exit with an `### exit N` line and exits with COMMAND's code. NAME goes to the remote
# shell as given (it may name a variable there).
with_worker_log() {
  printf '.venv/bin/python -m gated_attention.pods.worker_log --dest %q --name %s -- %s' \
    "$1" "$2" "$3"
}

# The code a pod runs: a wheel of the project and the configs/ it reads, built from a clean
# tree of one commit (never the working tree's uncommitted edits), once: in
# build/pods/<commit>/ (git-ignored; GATED_ATTENTION_BUILD_ROOT moves it), found there by
# every later call.
BUILD_ROOT="${GATED_ATTENTION_BUILD_ROOT:-$REPO_ROOT/build/pods}"

head_commit() {
  git -C "$REPO_ROOT" rev-parse --short=12 HEAD 2>/dev/null ||
    die "$REPO_ROOT is not a git checkout with a commit: the pod runs a committed tree"
}

# build_bundle COMMIT: build/pods/COMMIT/{dist/*.whl,configs/,COMMIT} (printed, or in a dry
# run the commands that would build it); nothing is built when it is there already.
build_bundle() {
  local commit="$1" dir="$BUILD_ROOT/$1"
  [[ -f "$dir/COMMIT" ]] && return 0
  [[ -n "$(git -C "$REPO_ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ]] &&
    echo "# Uncommitted changes are not in the build: it is commit $commit as committed." >&2
  run rm -rf "$dir.partial"
  run mkdir -p "$dir.partial/src"
  run git -C "$REPO_ROOT" archive --format=tar --output="$dir.partial/src.tar" "$commit"
  run tar -xf "$dir.partial/src.tar" -C "$dir.partial/src"
  run "$LOCAL_PYTHON" -m pip wheel -q --no-deps --no-build-isolation \
    --wheel-dir="$dir.partial/dist" "$dir.partial/src"
  run cp -r "$dir.partial/src/configs" "$dir.partial/configs"
  run rm -rf "$dir.partial/src" "$dir.partial/src.tar"
  if ((DRY_RUN)); then
    echo "echo $commit > $dir.partial/COMMIT && mv $dir.partial $dir"
  else
    echo "$commit" >"$dir.partial/COMMIT"
    mv "$dir.partial" "$dir"
  fi
}

# jax[tpu] pinned to the jax of this checkout's venv (JAX_VERSION in pod.env overrides), so
# the pod runs what the pre-flight compiled.
resolve_jax_version() {
  if [[ -z "${JAX_VERSION:-}" ]]; then
    JAX_VERSION="$("$LOCAL_PYTHON" -c \
      'from importlib.metadata import version; print(version("jax"))' 2>/dev/null)" ||
      die "cannot read the jax version of $LOCAL_PYTHON: set JAX_VERSION in $CONFIG_FILE"
  fi
  [[ "$JAX_VERSION" =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "JAX_VERSION=$JAX_VERSION must look like 0.10.2"
}

# train_command CONFIG WORKDIR PYTHON [FLAG...]: the training command, one shell-quoted line,
# as gated_attention/cli/train_command.py builds it for every launcher.
train_command() {
  local config="$1" workdir="$2" python="$3"
  shift 3
  (cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" "$LOCAL_PYTHON" -c \
    'import sys; from gated_attention.cli.train_command import main; sys.exit(main(sys.argv[1:]))' \
    --python="$python" --config="$config" --workdir="$workdir" --progress=false -- "$@") ||
    die "cannot build the training command with $LOCAL_PYTHON"
}

# A run or grid name goes into paths: keep it to letters, digits, dot, dash and underscore.
check_name() {
  [[ -n "$2" ]] || die "$1 is required (e.g. $1 table1_tiny)"
  [[ "$2" =~ ^[A-Za-z0-9._-]+$ ]] || die "$1 $2 may only hold letters, digits, '.', '-' and '_'"
}

tpu_ssh() {  # tpu_ssh WORKER COMMAND [NODE]: one command on one worker (or all) of a node
  run gcloud compute tpus tpu-vm ssh "${3:-$TPU_NAME}" --project="$PROJECT" --zone="$ZONE" \
    --worker="$1" "${EXTRA_SSH[@]+"${EXTRA_SSH[@]}"}" --command="$2"
}

tpu_ssh_all() {  # tpu_ssh_all COMMAND: the same command on every worker of every slice
  local node
  while read -r node; do
    tpu_ssh all "$1" "$node"
  done < <(node_names)
}

tpu_scp_all() {  # tpu_scp_all LOCAL REMOTE: a file to every worker of every slice
  local node
  while read -r node; do
    run gcloud compute tpus tpu-vm scp "$1" "$node:$2" --project="$PROJECT" --zone="$ZONE" \
      --worker=all "${EXTRA_SSH[@]+"${EXTRA_SSH[@]}"}"
  done < <(node_names)
}
