#!/usr/bin/env bash
# Start one training run on every worker of the pod, its workdir on $BUCKET/runs/NAME.
#   tpu_scripts/launch.sh --name NAME [--arch ARCH] [--variant VARIANT] [--config PATH]
#       [--dry-run] [-- --config.train.steps=1000 ...]
# Flags after `--` go to `python -m gated_attention.main`. First, here and before touching the
# pod, the run's config is checked and its train and eval steps are compiled for TPU_TYPE
# (python -m gated_attention.preflight, with the --config.* flags after `--`); a config that
# is wrong, does not compile or does not fit stops the launch with the error. The run keeps
# going after you log out; its log prints a line every train.log_every steps; follow it with
# tpu_scripts/logs.sh --name NAME. Launching the same NAME again resumes.
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_arch="tiny" FLAG_variant="baseline"
parse_flags name arch variant
load_settings
require BUCKET TPU_TYPE
check_name --name "$FLAG_name"
[[ "$FLAG_arch$FLAG_variant" =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "--arch and --variant may only hold letters, digits, '.', '-' and '_'"
require_gcloud
preflight_or_die "configs/ablation.py:arch=$FLAG_arch,variant=$FLAG_variant" \
  "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}"

workdir="${BUCKET%/}/runs/$FLAG_name"
main=".venv/bin/python -m gated_attention.main"
main+=" --config=configs/ablation.py:arch=$FLAG_arch,variant=$FLAG_variant"
main+=" --workdir=$(printf '%q' "$workdir") --progress=false$(quoted_passthrough)"
log="$REMOTE_LOGS/$FLAG_name.log"
# Every worker runs the same command; GATED_ATTENTION_MULTIHOST=1 makes main.py join them with
# jax.distributed.initialize(). setsid + nohup: the run survives the ssh connection.
remote="mkdir -p $REMOTE_LOGS && cd $REMOTE_DIR && GATED_ATTENTION_MULTIHOST=1 setsid nohup"
remote+=" $main > $log 2>&1 < /dev/null &"
tpu_ssh all "$remote"
echo "# Started $FLAG_name on every worker; workdir $workdir, log $log on each worker." >&2
