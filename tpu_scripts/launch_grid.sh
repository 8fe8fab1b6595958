#!/usr/bin/env bash
# Run a whole experiments grid on the pod, one run after another (experiments.run_grid), every
# worker taking part in each run; results under $BUCKET/grids/NAME.
#   tpu_scripts/launch_grid.sh --grid experiments/grids/table1.py --name NAME
#       [--config PATH] [--dry-run] [-- --scale small --seeds 0,1 ...]
# Flags after `--` go to `python -m experiments.run_grid`. Launching it again resumes the grid:
# finished runs are skipped, interrupted ones resume from their checkpoints.
# shellcheck source=common.sh
source "$(cd "${BASH_SOURCE[0]%/*}" && pwd)/common.sh"
parse_common_flags "$@"
FLAG_name="" FLAG_grid=""
parse_flags name grid
load_settings
require BUCKET
check_name --name "$FLAG_name"
[[ -n "$FLAG_grid" ]] || die "--grid is required (a file under experiments/grids/)"
[[ -f "$REPO_ROOT/$FLAG_grid" ]] || die "--grid $FLAG_grid is not a file of this checkout" \
  "(choose one of: $(cd "$REPO_ROOT" && echo experiments/grids/*.py))"
require_gcloud

root="${BUCKET%/}/grids/$FLAG_name"
grid=".venv/bin/python -m experiments.run_grid $(printf '%q' "$FLAG_grid")"
grid+=" --root $(printf '%q' "$root") --parallel 1$(quoted_passthrough)"
log="$REMOTE_LOGS/grid-$FLAG_name.log"
remote="mkdir -p $REMOTE_LOGS && cd $REMOTE_DIR && GATED_ATTENTION_MULTIHOST=1 setsid nohup"
remote+=" $grid > $log 2>&1 < /dev/null &"
tpu_ssh all "$remote"
echo "# Started grid $FLAG_name on every worker; results in $root, log $log." >&2
