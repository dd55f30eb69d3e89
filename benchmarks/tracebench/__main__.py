"""``python -m benchmarks.tracebench openb ...`` from the repository's root."""

from .cli import main

main()
