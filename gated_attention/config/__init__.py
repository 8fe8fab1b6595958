"""The run config: its schema, defaults, architectures and recipes (run_config.py) and the
checks of each section's fields (train_config.py, optimizer_config.py, harness_fields.py).
"""
