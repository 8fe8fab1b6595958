#!/usr/bin/env bash
# Create the TPU (through queued resources, or `tpu-vm create` with QUEUED=false), with the
# TPU VM image of its generation (RUNTIME_VERSION, by default the one Google documents for JAX
# on TPU_TYPE: v2-alpha-tpuv6e, v2-alpha-tpuv5, v2-alpha-tpuv5-lite, tpu-ubuntu2204-base).
# SLICES=N asks for N slices of TPU_TYPE in one queued resource (multislice: nodes
# TPU_NAME-0 ... TPU_NAME-(N-1)); EXTRA_CREATE_ARGS go to the create command as they are
# (reservation, best-effort, flex-start, --valid-until-duration, service account, network).
# First, before any gcloud call, it checks that the pre-flight can describe TPU_TYPE (so that
# launch.sh can compile a run for it); --no-preflight creates a type it cannot describe.
#   tpu_scripts/create.sh [--no-preflight] [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_no_preflight=0
parse_flags no-preflight!
load_settings
require TPU_TYPE
resolve_runtime_version
((FLAG_no_preflight)) || check_type_or_die
require_gcloud

spot=()
[[ "$SPOT" == true ]] && spot=(--spot)
extra=("${spot[@]+"${spot[@]}"}" "${EXTRA_CREATE[@]+"${EXTRA_CREATE[@]}"}")
# GCLOUD_TRACK=alpha or beta: for create flags still in preview (flex-start's, for one).
gcloud_tpus=(gcloud ${GCLOUD_TRACK:+"$GCLOUD_TRACK"} compute tpus)
if [[ "$QUEUED" == true ]]; then
  nodes=(--node-id="$TPU_NAME")
  ((SLICES == 1)) || nodes=(--node-count="$SLICES" --node-prefix="$TPU_NAME")
  run "${gcloud_tpus[@]}" queued-resources create "$TPU_NAME" "${nodes[@]}" \
    --project="$PROJECT" --zone="$ZONE" --accelerator-type="$TPU_TYPE" \
    --runtime-version="$RUNTIME_VERSION" "${extra[@]+"${extra[@]}"}"
  echo "# Queued. When 'state' is ACTIVE, run tpu_scripts/setup.sh:" >&2
  run gcloud compute tpus queued-resources describe "$TPU_NAME" --project="$PROJECT" \
    --zone="$ZONE"
else
  run "${gcloud_tpus[@]}" tpu-vm create "$TPU_NAME" --project="$PROJECT" --zone="$ZONE" \
    --accelerator-type="$TPU_TYPE" --version="$RUNTIME_VERSION" "${extra[@]+"${extra[@]}"}"
fi
