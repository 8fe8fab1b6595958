"""Pods that run themselves: the supervisor that keeps a run or grid alive on spot TPU slices.

- `cloud`: the gcloud calls and the parsing of queued-resource and TPU VM states;
- `supervisor`: the loop (watch the slice, recreate, set up, relaunch, stop when done);
- `events`: the supervisor's event log beside the run in the bucket;
- `claims`: claims on grid runs that two slices cannot both win (object preconditions);
- `worker_log`: runs a command on a worker and copies its log into the bucket as it goes.
"""
