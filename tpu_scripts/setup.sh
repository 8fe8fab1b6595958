#!/usr/bin/env bash
# Install the project on every TPU worker, in a venv with jax[tpu]: a wheel built once from a
# clean tree of one commit (build/pods/<commit>/, with the configs/ runs read), the same build
# at every later setup of this TPU_NAME (after a recreate, a resumed run runs the code it
# started with, whatever was committed since). --rebuild builds HEAD and installs that.
# The TPU VM images ship a Python older than the project needs: uv (installed on first use)
# brings Python PYTHON_VERSION (default 3.11) for the venv. jax[tpu] is pinned to the jax of
# this checkout's venv (JAX_VERSION in pod.env overrides), so the pod runs what the
# pre-flight compiled. With SLICES=N it installs on every worker of every slice.
# MOUNT=BUCKET_NAME:/dir mounts that bucket at /dir on every worker with gcsfuse (installed
# from Google's apt repository on first use); run after a recreate, it mounts it again.
#   tpu_scripts/setup.sh [--rebuild] [--config PATH] [--dry-run]
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_rebuild=0
parse_flags rebuild!
load_settings
require_gcloud
resolve_jax_version

# The commit this TPU_NAME runs: pinned at its first setup (or --rebuild), kept after.
pin="$BUILD_ROOT/pins/$TPU_NAME"
head="$(head_commit)"
if ((FLAG_rebuild)) || [[ ! -f "$pin" ]]; then
  commit="$head"
  ((DRY_RUN)) || { mkdir -p "${pin%/*}" && echo "$commit" >"$pin"; }
else
  commit="$(<"$pin")"
  [[ "$commit" == "$head" ]] || echo "# $TPU_NAME runs commit $commit (pinned at its first" \
    "setup); HEAD is $head: pass --rebuild to install HEAD." >&2
fi
build_bundle "$commit"
bundle="$BUILD_ROOT/$commit"
archive="$BUILD_ROOT/gated_attention-$commit.tar.gz"
[[ -f "$archive" ]] || run tar -czf "$archive" -C "$bundle" .
tpu_scp_all "$archive" gated_attention.tar.gz
# A fresh copy of the build (configs/, dist/); runs live on $BUCKET, logs in ~/logs.
install="mkdir -p $REMOTE_LOGS && rm -rf $REMOTE_DIR/configs $REMOTE_DIR/dist"
install+=" && mkdir -p $REMOTE_DIR && tar -xzf ~/gated_attention.tar.gz -C $REMOTE_DIR"
# uv and its Python: a venv made by an older setup (or with an old Python) is made anew.
install+=" && cd $REMOTE_DIR && export PATH=\$HOME/.local/bin:\$PATH"
install+=" && { command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh; }"
install+=" && { .venv/bin/python -c 'import sys; assert \"%d.%d\" % sys.version_info[:2] == \"$PYTHON_VERSION\"'"
install+=" 2>/dev/null || uv venv --clear --python $PYTHON_VERSION .venv; }"
# gcs: gcsfs, through which etils.epath reaches the gs:// workdirs (tensorflow does too, if
# the seqio extra brings it). --reinstall: the wheel's version number is the same at every
# commit.
install+=" && uv pip install --python .venv/bin/python -q --reinstall-package gated_attention"
install+=" \"\$(ls dist/*.whl)[gcs${EXTRAS:+,$EXTRAS}]\" 'jax[tpu]==$JAX_VERSION'"
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
echo "# $TPU_NAME: commit $commit installed (build $bundle)." >&2
