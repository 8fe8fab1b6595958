#!/usr/bin/env bash
# Create the TPU (through queued resources, or `tpu-vm create` with QUEUED=false), with the
# TPU VM image of its generation (RUNTIME_VERSION, by default the one Google documents for JAX
# on TPU_TYPE: v2-alpha-tpuv6e, v2-alpha-tpuv5, v2-alpha-tpuv5-lite, tpu-ubuntu2204-base).
#   tpu_scripts/create.sh [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
parse_flags ""  # no flags of its own
load_settings
require TPU_TYPE
resolve_runtime_version
require_gcloud

spot=()
[[ "$SPOT" == true ]] && spot=(--spot)
if [[ "$QUEUED" == true ]]; then
  run gcloud compute tpus queued-resources create "$TPU_NAME" --node-id="$TPU_NAME" \
    --project="$PROJECT" --zone="$ZONE" --accelerator-type="$TPU_TYPE" \
    --runtime-version="$RUNTIME_VERSION" "${spot[@]+"${spot[@]}"}"
  echo "# Queued. When 'state' is ACTIVE, run tpu_scripts/setup.sh:" >&2
  run gcloud compute tpus queued-resources describe "$TPU_NAME" --project="$PROJECT" \
    --zone="$ZONE"
else
  run gcloud compute tpus tpu-vm create "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --accelerator-type="$TPU_TYPE" --version="$RUNTIME_VERSION" "${spot[@]+"${spot[@]}"}"
fi
