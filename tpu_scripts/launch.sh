#!/usr/bin/env bash
# Start one training run on every worker of the pod (of every slice, with SLICES=N), its
# workdir on $BUCKET/runs/NAME: a thin door for one run on TPU VMs you created (create.sh,
# setup.sh); for restarts after a preemption without you, use GKE (gke_launch.sh) or a Ray
# cluster (docs/pods.md).
#   tpu_scripts/launch.sh --name NAME [--arch ARCH] [--variant VARIANT] [--no-preflight]
#       [--config PATH] [--dry-run] [-- --config.train.steps=1000 ...]
# Flags after `--` go to `python -m gated_attention.main`. First, here and before touching the
# pod, the run's config is checked and its train and eval steps are compiled for TPU_TYPE
# (python -m gated_attention.preflight, with the --config.* flags after `--`, and --slices N
# with SLICES=N); a config that is wrong, does not compile or does not fit stops the launch
# with the error. --no-preflight skips it, for a type the pre-flight cannot compile for.
# A worker where a training of NAME is still alive refuses to start a second one (its log
# wrapper holds ~/logs/NAME.lock while it lives); the launch then stops with that error.
# The run keeps going after you log out; its log prints a line every train.log_every steps;
# follow it with tpu_scripts/logs.sh --name NAME. Each worker's log is also copied to
# $BUCKET/runs/NAME/logs/ (one object per attempt) every 30 s and when the run ends; a
# preempted VM's SIGTERM reaches the trainer, which saves before the exit is recorded.
# Launching the same NAME again, once the last training ended, resumes.
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_arch="tiny" FLAG_variant="baseline" FLAG_no_preflight=0
parse_flags name arch variant no-preflight!
load_settings
require BUCKET TPU_TYPE
refuse_gke_only_type
check_name --name "$FLAG_name"
[[ "$FLAG_arch$FLAG_variant" =~ ^[A-Za-z0-9._-]+$ ]] ||
  die "--arch and --variant may only hold letters, digits, '.', '-' and '_'"
require_gcloud
config="configs/ablation.py:arch=$FLAG_arch,variant=$FLAG_variant"
if ((FLAG_no_preflight)); then
  echo "# Pre-flight skipped (--no-preflight): $config is not checked for $TPU_TYPE" >&2
else
  preflight_or_die "$config" "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}"
fi

workdir="${BUCKET%/}/runs/$FLAG_name"
main="$(train_command "$config" "$workdir" .venv/bin/python \
  "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}")"
log="$REMOTE_LOGS/$FLAG_name.log" lock="$REMOTE_LOGS/$FLAG_name.lock"

# Multislice: every worker of slice s gets the MEGASCALE variables libtpu and
# jax.distributed read: the coordinator (worker 0 of slice 0; jax's own coordinator runs on
# the same host), the number of slices and this slice's index.
coordinator=""
if ((SLICES > 1)); then
  describe=(gcloud compute tpus tpu-vm describe "$TPU_NAME-0" --project="$PROJECT"
    --zone="$ZONE" "--format=value(networkEndpoints[0].ipAddress)")
  if ((DRY_RUN)); then
    run "${describe[@]}"
    coordinator="SLICE0_WORKER0_IP"  # what the command above prints, in a real launch
  else
    coordinator="$("${describe[@]}")" || die "cannot read the address of $TPU_NAME-0"
    [[ "$coordinator" =~ ^[0-9A-Za-z.:-]+$ ]] ||
      die "no network address for $TPU_NAME-0 (got '$coordinator'): is the slice ACTIVE?"
  fi
fi

slice=0
while read -r node; do
  env="GATED_ATTENTION_MULTIHOST=1"
  logname="worker-{worker}.log"
  if ((SLICES > 1)); then
    env+=" MEGASCALE_COORDINATOR_ADDRESS=$coordinator:$MEGASCALE_PORT"
    env+=" MEGASCALE_NUM_SLICES=$SLICES MEGASCALE_SLICE_ID=$slice MEGASCALE_PORT=$MEGASCALE_PORT"
    logname="slice-$slice-worker-{worker}.log"
  fi
  # main's output in $log and in $workdir/logs ({worker} becomes the worker's number)
  wrapped=$(with_worker_log "$workdir/logs" "$logname" "$main")
  # Every worker runs the same command; GATED_ATTENTION_MULTIHOST=1 makes main.py join them
  # with jax.distributed.initialize(). The lock on fd 9 goes with the log wrapper (setsid +
  # nohup: it survives the ssh connection) and is dropped by the kernel when it ends.
  remote="mkdir -p $REMOTE_LOGS && cd $REMOTE_DIR && exec 9>>$lock && if ! flock -n 9; then"
  remote+=" echo \"error: \$(hostname): a training of $FLAG_name is alive on this worker"
  remote+=" ($lock is held); follow it with tpu_scripts/logs.sh --name $FLAG_name, or wait"
  remote+=" for it to end\" >&2; exit 3; fi;"
  remote+=" $env setsid nohup $wrapped >> $log 2>&1 < /dev/null &"
  tpu_ssh all "$remote" "$node"
  slice=$((slice + 1))
done < <(node_names)
where="every worker"
((SLICES == 1)) || where="every worker of $SLICES slices"
if ((DRY_RUN)); then
  echo "# Would start $FLAG_name on $where; workdir $workdir, log $log on each worker." >&2
else
  echo "# Started $FLAG_name on $where; workdir $workdir, log $log on each worker" \
    "(copied to $workdir/logs/)." >&2
fi
