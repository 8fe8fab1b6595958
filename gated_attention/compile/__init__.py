"""Compiling for targets that are not attached: a TPU slice or a GPU node described from a
CPU (target.py, cuda.py, tpu_topologies.py, gpu_targets.py), the memory it needs and the
levers that make it fit (memory.py), and the pre-flight that runs them (preflight.py).
"""
