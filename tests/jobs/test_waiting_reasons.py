"""A queued job's waiting reason says why it waits and nothing that changes with every
allocation: it names no other profile's free count (a person picks another profile in the
spawn form; a queued job cannot), so a pass after an unrelated allocation rewrites no
reason, and the refusal is not counted out under the ledger lock for nothing."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from sqlalchemy import Table, select

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from tests.jobs.full_cluster import PROFILES as JOB_PROFILES
from tests.jobs.full_cluster import IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger

JOBS = cast(Table, JobRow.__table__)


def test_a_waiting_reason_names_no_other_profile_and_an_unrelated_change_rewrites_none(
    tmp_path: Path,
):
    ledger = build_ledger(
        f"sqlite:///{tmp_path}/l.sqlite", profiles=JOB_PROFILES, hosts=hosts(1), policy="best-fit"
    )
    for i in range(7):
        ledger.allocate(Caller(f"u{i}", (), f"u{i}"), "gpu-1", "")
    ledger.allocate(Caller("sam", (), "sam"), "share-250", "")
    jobs = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
    jobs.run_jobs_as_service_user = True
    scheduler = Scheduler(jobs)
    insert_queued(ledger.db, tmp_path, [("ann", "gpu-1", c) for c in ("normal", "preemptible")])
    scheduler.tick()

    def reasons() -> dict[int, tuple[str, int]]:
        with ledger.db.reading() as s:
            rows = s.connection().execute(select(JOBS.c.id, JOBS.c.waiting_reason, JOBS.c.revision))
            return {r.id: (r.waiting_reason, r.revision) for r in rows}

    before = reasons()
    assert {why for why, _ in before.values()} == {"No gpu-1 free (8 of 8 in use)"}
    # a person still sees what else is free
    with pytest.raises(Refused, match="share-250 has 3 free"):
        ledger.allocate(Caller("bob", (), "bob"), "gpu-1", "")

    ledger.allocate(Caller("sue", (), "sue"), "share-250", "")  # share-250: 3 -> 2 free
    scheduler.tick()
    assert reasons() == before  # same reasons, not written again
