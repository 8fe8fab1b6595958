#!/usr/bin/env bash
# Stream a run's (or grid's) log from one worker (default 0, the one that writes metrics).
#   tpu_scripts/logs.sh --name NAME [--grid] [--worker N] [--lines N] [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_worker=0 FLAG_lines=100 FLAG_grid=0
parse_flags name worker lines grid!
load_settings
check_name --name "$FLAG_name"
[[ "$FLAG_worker" =~ ^([0-9]+|all)$ ]] || die "--worker $FLAG_worker must be a number or 'all'"
[[ "$FLAG_lines" =~ ^[0-9]+$ ]] || die "--lines $FLAG_lines must be a number"
require_gcloud

file="$FLAG_name.log"
((FLAG_grid)) && file="grid-$FLAG_name.log"
tpu_ssh "$FLAG_worker" "tail -n $FLAG_lines -F $REMOTE_LOGS/$file"
