"""Fixtures shared by the whole suite live in tests/harness/; this file only wires them in."""

pytest_plugins = [
    "tests.harness.postgres",
    "tests.harness.hub",
    "tests.harness.slurm",
]
