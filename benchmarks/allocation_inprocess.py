"""Allocate + release cycles of the ledger itself, without HTTP: the part of the allocation
API's latency that is the ledger's (see ``allocation_api.py`` for the whole).

    .venv/bin/python benchmarks/allocation_inprocess.py [--cycles 500]

Same inventory and profile as ``allocation_api.py``, SQLite file in a temp dir.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.allocation_api import HOSTS, PROFILES  # noqa: E402
from gpuslice_hub.ledger import Caller  # noqa: E402
from tests.service.conftest import build_ledger  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ledger = build_ledger(
            f"sqlite:///{tmp}/ledger.sqlite", PROFILES, hosts=HOSTS, policy="default"
        )
        caller = Caller("bench00", (), "gpuslice")
        for i in range(20):  # warm the caches
            a, _ = ledger.allocate(caller, "share-100", f"warm{i}")
            ledger.release(a["id"], "gpuslice", "benchmark")
        alloc, release = [], []
        t0 = time.perf_counter()
        for i in range(args.cycles):
            t1 = time.perf_counter()
            a, _ = ledger.allocate(caller, "share-100", f"s{i}")
            t2 = time.perf_counter()
            ledger.release(a["id"], "gpuslice", "benchmark")
            alloc.append(t2 - t1)
            release.append(time.perf_counter() - t2)
        dt = time.perf_counter() - t0
        ledger.db.dispose()
    print(
        f"in process: {args.cycles / dt:.0f} alloc+release/s  "
        f"alloc p50 {statistics.median(alloc) * 1000:.2f} ms  "
        f"release p50 {statistics.median(release) * 1000:.2f} ms"
    )


if __name__ == "__main__":
    main()
