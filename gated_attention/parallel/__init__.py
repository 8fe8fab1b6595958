"""Device meshes and logical-axis sharding rules (sharding.py), and multi-process start-up
and per-host data slices (distributed.py).
"""
