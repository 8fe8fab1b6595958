#!/usr/bin/env bash
# Delete the TPU (and its queued resource, with every slice of it). Workdirs on $BUCKET are
# kept; anything left on the workers' disks (~/logs) is lost, so this asks for --yes.
#   tpu_scripts/teardown.sh --yes [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_yes=0
parse_flags yes!
load_settings
((FLAG_yes || DRY_RUN)) || die "this deletes TPU $TPU_NAME in $ZONE with its workers' disks" \
  "(~/logs; runs on the bucket are kept): pass --yes to confirm"
require_gcloud

if [[ "$QUEUED" == true ]]; then
  run gcloud compute tpus queued-resources delete "$TPU_NAME" --project="$PROJECT" \
    --zone="$ZONE" --force --quiet
else
  run gcloud compute tpus tpu-vm delete "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" --quiet
fi
