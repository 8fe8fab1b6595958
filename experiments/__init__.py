"""Grids of training runs (experiments/grids/*.py), a local runner and the summary tables.

    python -m experiments.run_grid experiments/grids/table1.py --root runs/table1 --scale tiny
    python -m experiments.summarize runs/table1
"""
