"""Training: the step (step.py) and the loop (loop.py), the optimizer (optim.py), the loss
(losses.py), checkpoints and run folders (checkpoint.py, workdir.py, workdir_lock.py), what
a run writes (metrics_writer.py, telemetry.py, run_record.py, progress_log.py), starting from
another run (init_from.py), the checks before compiling (run_checks.py), and stopping
cleanly (interrupts.py, watchdog.py).
"""
