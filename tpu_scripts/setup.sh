#!/usr/bin/env bash
# Install the project (the committed HEAD of this checkout) on every TPU worker, in a venv
# with jax[tpu]. Run it again after each commit you want on the pod.
# The TPU VM images ship a Python older than the project needs: uv (installed on first use)
# brings Python PYTHON_VERSION (default 3.11) for the venv. jax[tpu] is pinned to the jax of
# this checkout's venv (JAX_VERSION in pod.env overrides), so the pod runs what the
# pre-flight compiled. With SLICES=N it installs on every worker of every slice.
# MOUNT=BUCKET_NAME:/dir mounts that bucket at /dir on every worker with gcsfuse (installed
# from Google's apt repository on first use); run after a recreate, it mounts it again.
#   tpu_scripts/setup.sh [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
parse_flags ""  # no flags of its own
load_settings
require_gcloud

if [[ -z "${JAX_VERSION:-}" ]]; then
  JAX_VERSION="$("$LOCAL_PYTHON" -c \
    'from importlib.metadata import version; print(version("jax"))' 2>/dev/null)" ||
    die "cannot read the jax version of $LOCAL_PYTHON: set JAX_VERSION in $CONFIG_FILE"
fi
[[ "$JAX_VERSION" =~ ^[0-9]+(\.[0-9]+)+$ ]] || die "JAX_VERSION=$JAX_VERSION must look like 0.10.2"

archive="${TMPDIR:-/tmp}/gated_attention-$TPU_NAME.tar.gz"
run git -C "$REPO_ROOT" archive --format=tar.gz --output="$archive" HEAD
tpu_scp_all "$archive" gated_attention.tar.gz
# Unpacks over the previous copy (code only: runs live on $BUCKET, logs in ~/logs) and keeps
# its venv.
install="mkdir -p $REMOTE_DIR $REMOTE_LOGS && tar -xzf ~/gated_attention.tar.gz -C $REMOTE_DIR"
# uv and its Python: a venv made by an older setup (or with an old Python) is made anew.
install+=" && cd $REMOTE_DIR && export PATH=\$HOME/.local/bin:\$PATH"
install+=" && { command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh; }"
install+=" && { .venv/bin/python -c 'import sys; assert \"%d.%d\" % sys.version_info[:2] == \"$PYTHON_VERSION\"'"
install+=" 2>/dev/null || uv venv --clear --python $PYTHON_VERSION .venv; }"
# gcs: gcsfs, through which etils.epath reaches the gs:// workdirs (tensorflow does too, if
# the seqio extra brings it).
install+=" && uv pip install --python .venv/bin/python -q -e '.[gcs${EXTRAS:+,$EXTRAS}]'"
install+=" 'jax[tpu]==$JAX_VERSION'"
install+=" && .venv/bin/python -c 'import jax; print(jax.process_index(), jax.local_devices())'"
if [[ -n "$MOUNT" ]]; then
  bucket_name="${MOUNT%%:*}" mount_dir="${MOUNT#*:}"
  # gcsfuse's package source, as Google's gcsfuse install page adds it, then the mount
  # (skipped where it is already mounted).
  repo="https://packages.cloud.google.com/apt"
  install+=" && { command -v gcsfuse >/dev/null || { echo 'deb [signed-by=/usr/share/keyrings/cloud.google.asc]"
  install+=" $repo gcsfuse-'\$(lsb_release -c -s)' main' | sudo tee /etc/apt/sources.list.d/gcsfuse.list >/dev/null"
  install+=" && curl -fsSL $repo/doc/apt-key.gpg | sudo tee /usr/share/keyrings/cloud.google.asc >/dev/null"
  install+=" && sudo apt-get update -q && sudo apt-get install -y -q fuse gcsfuse; }; }"
  install+=" && mkdir -p $mount_dir && { mountpoint -q $mount_dir ||"
  install+=" gcsfuse --implicit-dirs $bucket_name $mount_dir; }"
fi
tpu_ssh_all "$install"
