#!/usr/bin/env bash
# Stream a run's (or grid's) log from one worker (default 0, the one that writes metrics) of
# one slice (default 0; --slice K with SLICES=N). A single run's logs are also in the bucket,
# $BUCKET/runs/NAME/logs/, copied there every minute while it runs.
#   tpu_scripts/logs.sh --name NAME [--grid] [--worker N] [--slice K] [--lines N]
#       [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_worker=0 FLAG_lines=100 FLAG_grid=0 FLAG_slice=0
parse_flags name worker lines grid! slice
load_settings
check_name --name "$FLAG_name"
[[ "$FLAG_worker" =~ ^([0-9]+|all)$ ]] || die "--worker $FLAG_worker must be a number or 'all'"
[[ "$FLAG_lines" =~ ^[0-9]+$ ]] || die "--lines $FLAG_lines must be a number"
if ! [[ "$FLAG_slice" =~ ^[0-9]+$ ]] || ((FLAG_slice >= SLICES)); then
  die "--slice $FLAG_slice must be a slice number from 0 to $((SLICES - 1)) (SLICES=$SLICES)"
fi
require_gcloud

file="$FLAG_name.log"
((FLAG_grid)) && file="grid-$FLAG_name.log"
node="$TPU_NAME"
((SLICES == 1)) || node="$TPU_NAME-$FLAG_slice"
tpu_ssh "$FLAG_worker" "tail -n $FLAG_lines -F $REMOTE_LOGS/$file" "$node"
