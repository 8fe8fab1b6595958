# shellcheck shell=bash
# Shared by every tpu_scripts/*.sh: flags, settings, checks, and running or printing commands.
#   --config PATH   settings file (default: tpu_scripts/pod.env; see pod.env.example)
#   --dry-run       print the exact commands instead of running them (gcloud not needed)
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

die() {
  echo "error: $*" >&2
  exit 2
}

# Split the flags every script shares from the script's own (left in ARGS).
parse_common_flags() {
  while (($#)); do
    case "$1" in
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
  # shellcheck disable=SC1090
  source "$CONFIG_FILE"
  require PROJECT ZONE TPU_NAME
  SPOT="${SPOT:-false}"
  QUEUED="${QUEUED:-true}"
  EXTRAS="${EXTRAS:-}"
  [[ "$SPOT" == true || "$SPOT" == false ]] || die "SPOT=$SPOT in $CONFIG_FILE must be true or false"
  [[ "$QUEUED" == true || "$QUEUED" == false ]] ||
    die "QUEUED=$QUEUED in $CONFIG_FILE must be true or false"
}

require() {
  local name
  for name in "$@"; do
    [[ -n "${!name:-}" ]] || die "$name is not set in $CONFIG_FILE (see tpu_scripts/pod.env.example)"
  done
  if [[ " $* " == *" BUCKET "* && "$BUCKET" != gs://* ]]; then
    die "BUCKET=$BUCKET in $CONFIG_FILE must be a gs:// path every TPU worker can write"
  fi
  if [[ " $* " == *" TPU_TYPE "* && ! "$TPU_TYPE" =~ ^v[0-9][a-z0-9]*-[0-9]+$ ]]; then
    die "TPU_TYPE=$TPU_TYPE in $CONFIG_FILE is not an accelerator type such as v4-32," \
      "v5litepod-8, v5p-16 or v6e-16"
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

# PASSTHROUGH quoted for the remote shell, with a leading space (empty when none).
quoted_passthrough() {
  ((${#PASSTHROUGH[@]})) || return 0
  printf ' %q' "${PASSTHROUGH[@]}"
}

# A run or grid name goes into paths: keep it to letters, digits, dot, dash and underscore.
check_name() {
  [[ -n "$2" ]] || die "$1 is required (e.g. $1 table1_tiny)"
  [[ "$2" =~ ^[A-Za-z0-9._-]+$ ]] || die "$1 $2 may only hold letters, digits, '.', '-' and '_'"
}

tpu_ssh() {  # tpu_ssh WORKER COMMAND: one command on one worker (or all)
  run gcloud compute tpus tpu-vm ssh "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --worker="$1" --command="$2"
}
