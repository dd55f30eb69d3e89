"""Fixtures shared by the whole suite live in tests/harness/; this file only wires them in.

Every process the tests start gets tests/fakes/site on its PYTHONPATH: its
``sitecustomize`` puts the fake NVML driver in place of ``pynvml`` where a test sets
$GPUSLICE_FAKE_NVML (gpuslice itself has no such switch, and ships no test code)."""

import os
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(_REPO / "tests" / "fakes" / "site"), str(_REPO)]
    + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
)

# Every statement the ledger runs on SQLite's cursor (gpuslice_hub/db/lean.py) is checked
# against SQLAlchemy's own execution: the same SQL and parameters, the same rows.
os.environ["GPUSLICE_LEAN_CHECK"] = "1"

pytest_plugins = [
    "tests.harness.postgres",
    "tests.harness.hub",
    "tests.harness.slurm",
    "tests.harness.slurm_nodes",
    "tests.harness.accounts",
]
