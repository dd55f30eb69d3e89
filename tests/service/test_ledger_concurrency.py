"""No slice is ever held twice, whatever the interleaving: many processes race on one ledger.

Each process has its own Ledger (its own connections), so nothing in-process serialises
them: only the database lock and constraints stand between them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import defaultdict

from sqlalchemy import select

from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.models import AllocationRow

from .conftest import build_ledger

WORKER = textwrap.dedent(
    """
    import json, sys
    from gpuslice_hub.errors import Refused
    from gpuslice_hub.ledger import Caller
    from tests.service.conftest import build_ledger
    url, worker = sys.argv[1], int(sys.argv[2])
    ledger = build_ledger(url)
    got = []
    for i in range(12):
        profile = ["mig-1g.10gb", "share-250", "gpu-1"][(i + worker) % 3]
        try:
            a, _ = ledger.allocate(Caller(f"u{worker}", (), "t"), profile, f"s{i}")
            got.append(a["id"])
        except Refused as e:
            assert e.code == "no_capacity", e.message
    print(json.dumps(got))
    """
)


def test_racing_processes_never_share_a_slice(db_url, tmp_path):
    build_ledger(db_url).db.dispose()  # create the schema once, before the race
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, db_url, str(w)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(8)
    ]
    granted = []
    for p in procs:
        out, err = p.communicate(timeout=240)
        assert p.returncode == 0, err
        granted += json.loads(out.strip().splitlines()[-1])
    assert len(granted) == len(set(granted))

    db = open_database(db_url)
    try:
        with db.reading() as s:
            active = list(s.scalars(select(AllocationRow).where(AllocationRow.active)))
        assert len(active) == len(granted)
        exclusive = [c.exclusive_key for a in active for c in a.claims if c.exclusive_key]
        assert len(exclusive) == len(set(exclusive)), "an exclusive slice is held twice"
        milli: dict[str, int] = defaultdict(int)
        whole: set[str] = set()
        for a in active:
            for c in a.claims:
                if not c.mig_uuid:
                    milli[c.gpu_uuid] += c.milli
                if a.kind == "gpu":
                    whole.add(c.gpu_uuid)
        assert all(v <= 1000 for v in milli.values()), milli
        # a whole GPU shares with nobody
        assert all(milli[g] == 1000 for g in whole)
        # every profile was still asked for after capacity ran out, so nothing is left over
        migs = sum(1 for a in active if a.profile == "mig-1g.10gb")
        assert migs == 2
        assert sum(milli.values()) == 2000
    finally:
        db.dispose()
