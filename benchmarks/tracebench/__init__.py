"""The openb trace benchmark over the placement engine
(``python -m benchmarks.tracebench openb``, from the repository's root)."""
