#!/usr/bin/env bash
# Run a whole experiments grid on the pod, one run after another (experiments.run_grid), every
# worker taking part in each run; results under $BUCKET/grids/NAME.
#   tpu_scripts/launch_grid.sh --grid experiments/grids/table1.py --name NAME [--claim]
#       [--no-preflight] [--config PATH] [--dry-run] [-- --scale small --seeds 0,1 ...]
# Flags after `--` go to `python -m experiments.run_grid`. First, here and before touching the
# pod, every distinct run config of the grid (seeds aside) is checked and compiled for
# TPU_TYPE (python -m gated_attention.preflight); one refusal stops the launch with its error.
# Launching it again resumes the grid: finished runs are skipped, interrupted ones resume
# from their checkpoints.
# Each worker asks the TPU VM metadata server for its worker number and passes it as --worker:
# all workers launch the same commands, only worker 0 writes status files and logs to $BUCKET;
# each worker's own output is copied to $BUCKET/grids/NAME/_worker_logs/ as it runs.
# --claim: several slices (one settings file each, same BUCKET and NAME) share the grid: each
# takes the next pending run by a claim in the bucket that two slices cannot both win, and
# analyses once nothing is left to train (experiments.run_grid --slice $TPU_NAME).
# --no-preflight: skip the compile (a relaunch of what was checked, or a type it cannot
# compile for).
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_grid="" FLAG_claim=0 FLAG_no_preflight=0
parse_flags name grid claim! no-preflight!
load_settings
require BUCKET TPU_TYPE
check_name --name "$FLAG_name"
[[ -n "$FLAG_grid" ]] || die "--grid is required (a file under experiments/grids/)"
[[ -f "$REPO_ROOT/$FLAG_grid" ]] || die "--grid $FLAG_grid is not a file of this checkout" \
  "(choose one of: $(cd "$REPO_ROOT" && echo experiments/grids/*.py))"
require_gcloud

# The grid's runs as run_grid plans them (its dry run writes nothing), one config per line.
[[ -x "$LOCAL_PYTHON" ]] || die "no Python at $LOCAL_PYTHON for the pre-flight: run" \
  "'make install-test' in this checkout, or set GATED_ATTENTION_PYTHON"
# (--command last: a training command of the user's own, even one spanning lines, is not what
# the pre-flight reads)
planned="$(cd "$REPO_ROOT" && PYTHONPATH="$REPO_ROOT" "$LOCAL_PYTHON" -m experiments.run_grid \
  "$FLAG_grid" --root "${TMPDIR:-/tmp}/preflight-grid" --dry_run --no_analyze \
  "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}" --command '{config} {overrides}')" ||
  die "the grid $FLAG_grid could not be planned with these flags (error above)"
declare -A seen=()
words=()
while IFS= read -r line; do
  [[ -z "$line" || "$line" == "#"* ]] && continue
  eval "words=($line)"  # run_grid prints shell-quoted words
  config="${words[0]#*configs/ablation.py:}"
  key="$config"
  overrides=()
  for arg in "${words[@]:1}"; do
    # a grid seed sets the weights and the data order: one pre-flight serves every seed
    [[ "$arg" == --config.seed=* || "$arg" == --config.data.shuffle_seed=* ]] && continue
    overrides+=("$arg")
    key+=" $arg"
  done
  [[ -n "${seen[$key]:-}" ]] && continue
  seen[$key]=1
  ((FLAG_no_preflight)) && continue
  preflight_or_die "configs/ablation.py:$config" "${overrides[@]+"${overrides[@]}"}"
done <<<"$planned"

root="${BUCKET%/}/grids/$FLAG_name"
metadata="http://metadata.google.internal/computeMetadata/v1/instance/attributes"
worker_id="curl -sf -H 'Metadata-Flavor: Google' $metadata/agent-worker-number"
# The remote shell expands $GATED_ATTENTION_WORKER_ID, not this one.
# shellcheck disable=SC2016
grid_worker=' --worker "$GATED_ATTENTION_WORKER_ID"'
grid=".venv/bin/python -m experiments.run_grid $(printf '%q' "$FLAG_grid")"
grid+=" --root $(printf '%q' "$root") --parallel 1$grid_worker$(quoted_passthrough)"
((FLAG_claim)) && grid+=" --slice $(printf '%q' "$TPU_NAME")"
log="$REMOTE_LOGS/grid-$FLAG_name.log"
# The grid runner's output in $log and in $root/_worker_logs/$TPU_NAME-worker-N.log; the
# remote shell expands $GATED_ATTENTION_WORKER_ID.
# shellcheck disable=SC2016
wrapped=$(with_worker_log "$root/_worker_logs" \
  "$(printf '%q' "$TPU_NAME")"'-worker-$GATED_ATTENTION_WORKER_ID.log' "$grid")
# Every worker: its number from the metadata server (or stop with a message, launching
# nothing), then the grid runner in the background (setsid + nohup: it survives the ssh connection).
remote="mkdir -p $REMOTE_LOGS && cd $REMOTE_DIR"
remote+=" && if GATED_ATTENTION_WORKER_ID=\$($worker_id); then export GATED_ATTENTION_WORKER_ID;"
# Only worker 0 analyses each run (one host's job); meanwhile the others wait to join the
# next run, for up to an hour instead of jax's 5 minutes.
remote+=" GATED_ATTENTION_MULTIHOST=1 GATED_ATTENTION_INIT_TIMEOUT_S=3600"
remote+=" setsid nohup $wrapped > $log 2>&1 < /dev/null &"
remote+=" else echo \"error: \$(hostname): no worker number from the TPU metadata server\" >&2;"
remote+=" exit 1; fi"
tpu_ssh all "$remote"
if ((DRY_RUN)); then
  echo "# Would start grid $FLAG_name on every worker; results in $root, log $log." >&2
else
  echo "# Started grid $FLAG_name on every worker; results in $root, log $log." >&2
fi
