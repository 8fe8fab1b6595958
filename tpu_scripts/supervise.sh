#!/usr/bin/env bash
# Keep a run (or, with --grid, a grid) alive on the TPU until it is done, with no human: it
# watches the slice, and on SUSPENDED, PREEMPTED or FAILED deletes it once its workers had
# --broken-grace seconds to save their checkpoint and logs (or once every worker's log in the
# bucket records its exit; a vanished VM: at once), creates
# it again, waits for ACTIVE, sets it up and launches again (the run resumes from its last
# checkpoint, a grid skips its finished runs); a run that died on a healthy slice is launched
# again. It stops when the bucket records completion (exit 0), or after --max-restarts
# recreates + relaunches, or when the slice waits for capacity longer than --active-timeout
# (exit 1). Each event (time, state seen, action, attempt) is printed and written to
# $BUCKET/runs/NAME/supervisor/events.jsonl (a grid: $BUCKET/grids/NAME/supervisor/).
# Start it in tmux or on a small always-on VM; it may create the TPU itself.
#   tpu_scripts/supervise.sh --name NAME [--arch ARCH] [--variant VARIANT]
#       [--grid experiments/grids/FILE.py [--claim]] [--max-restarts 10] [--poll 60]
#       [--active-timeout 86400] [--broken-grace 30] [--config PATH] [--dry-run] [-- flags for launch]
# Flags after `--` go to launch.sh's run (or launch_grid.sh's grid) as there. --dry-run
# prints the loop's commands (every script's dry run) and changes nothing. A grid over K
# slices: one settings file per slice (its own TPU_NAME, the same BUCKET), one supervisor
# each with --grid FILE --name NAME --claim; each slice takes the next pending run.
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_arch="tiny" FLAG_variant="baseline" FLAG_grid="" FLAG_claim=0
FLAG_max_restarts=10 FLAG_poll=60 FLAG_active_timeout=86400 FLAG_broken_grace=30
FLAG_max_polls=""
parse_flags name arch variant grid claim! max-restarts poll active-timeout broken-grace \
  max-polls
load_settings
require BUCKET TPU_TYPE
check_name --name "$FLAG_name"
[[ "$FLAG_max_restarts" =~ ^[0-9]+$ ]] ||
  die "--max-restarts=$FLAG_max_restarts must be a whole number (0 = never restart)"
require_gcloud
[[ -x "$LOCAL_PYTHON" ]] || die "no Python at $LOCAL_PYTHON for the supervisor: run" \
  "'make install-test' in this checkout, or set GATED_ATTENTION_PYTHON"

supervisor=(-m gated_attention.pods.supervisor --config "$CONFIG_FILE" --project "$PROJECT"
  --zone "$ZONE" --tpu-name "$TPU_NAME" --queued "$QUEUED" --bucket "$BUCKET"
  --max-restarts "$FLAG_max_restarts" --poll "$FLAG_poll" --active-timeout "$FLAG_active_timeout"
  --broken-grace "$FLAG_broken_grace"
  --extra-ssh-args "${EXTRA_SSH_ARGS:-}")
[[ -n "$FLAG_max_polls" ]] && supervisor+=(--max-polls "$FLAG_max_polls")
((DRY_RUN)) && supervisor+=(--dry-run)
if [[ -n "$FLAG_grid" ]]; then
  supervisor+=(grid --name "$FLAG_name" --grid "$FLAG_grid")
  ((FLAG_claim)) && supervisor+=(--claim)
else
  supervisor+=(run --name "$FLAG_name" --arch "$FLAG_arch" --variant "$FLAG_variant")
fi
cd "$REPO_ROOT"
PYTHONPATH="$REPO_ROOT" exec "$LOCAL_PYTHON" "${supervisor[@]}" -- \
  "${PASSTHROUGH[@]+"${PASSTHROUGH[@]}"}"
