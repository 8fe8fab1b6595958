"""Helpers for runs on pods. Keeping a run or a grid alive is an engine's job: Ray
(experiments/run_grid.py) retries a grid's runs on other hosts, JobSet (through xpk on GKE)
restarts a pod's jobs, SLURM requeues; docs/pods.md tells which to use where.

- `worker_log`: runs a command on a worker and copies its log into the bucket as it goes.
"""
