"""One file per grid: each defines `runs(scale: str, seeds: Sequence[int]) -> list[Run]`."""
