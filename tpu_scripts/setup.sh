#!/usr/bin/env bash
# Install the project (the committed HEAD of this checkout) on every TPU worker, in a venv
# with jax[tpu]. Run it again after each commit you want on the pod.
#   tpu_scripts/setup.sh [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
parse_flags ""  # no flags of its own
load_settings
require_gcloud

archive="${TMPDIR:-/tmp}/gated_attention-$TPU_NAME.tar.gz"
run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" HEAD
run gcloud compute tpus tpu-vm scp "$archive" "$TPU_NAME:gated_attention.tar.gz" \
  --project="$PROJECT" --zone="$ZONE" --worker=all
# Unpacks over the previous copy (code only: runs live on $BUCKET, logs in ~/logs) and keeps
# its venv.
install="mkdir -p $REMOTE_DIR $REMOTE_LOGS && tar -xzf ~/gated_attention.tar.gz -C $REMOTE_DIR"
install+=" && cd $REMOTE_DIR && { test -x .venv/bin/python || python3 -m venv .venv; }"
install+=" && .venv/bin/pip install -q --upgrade pip"
# gcs: gcsfs, through which etils.epath reaches the gs:// workdirs (tensorflow does too, if
# the seqio extra brings it).
install+=" && .venv/bin/pip install -q -e '.[gcs${EXTRAS:+,$EXTRAS}]' 'jax[tpu]'"
install+=" && .venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_devices())'"
tpu_ssh all "$install"
