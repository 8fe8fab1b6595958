#!/usr/bin/env bash
# Stream a run's log from one worker (default 0, the one that writes metrics) of one slice
# (default 0; --slice K with SLICES=N). The logs are also in the bucket, one object per
# attempt: $BUCKET/runs/NAME/logs/worker-N.<start time>.<host>.<pid>.log, copied every 30 s
# while the run lives; read them all in order with
# `gcloud storage cat 'gs://.../runs/NAME/logs/worker-0.*.log'`.
#   tpu_scripts/logs.sh --name NAME [--worker N] [--slice K] [--lines N]
#       [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_worker=0 FLAG_lines=100 FLAG_slice=0
parse_flags name worker lines slice
load_settings
check_name --name "$FLAG_name"
[[ "$FLAG_worker" =~ ^([0-9]+|all)$ ]] || die "--worker $FLAG_worker must be a number or 'all'"
[[ "$FLAG_lines" =~ ^[0-9]+$ ]] || die "--lines $FLAG_lines must be a number"
if ! [[ "$FLAG_slice" =~ ^[0-9]+$ ]] || ((FLAG_slice >= SLICES)); then
  die "--slice $FLAG_slice must be a slice number from 0 to $((SLICES - 1)) (SLICES=$SLICES)"
fi
require_gcloud

file="$FLAG_name.log"
node="$TPU_NAME"
((SLICES == 1)) || node="$TPU_NAME-$FLAG_slice"
tpu_ssh "$FLAG_worker" "tail -n $FLAG_lines -F $REMOTE_LOGS/$file" "$node"
