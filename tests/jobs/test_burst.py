"""When burst moves a waiting job (burst.py), over a real ledger and jobs table, with a
stand-in for Slurm's ``scontrol update`` that records each move (the real one:
test_burst_slurm.py): after the configured share of its expected run time, or at once
once the cluster has stayed above the allocation threshold for 10 minutes; never a job
that is not burstable; back to its own partition after a requeue there; its GPU-hours
there counted."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.burst import Burst
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.ledger import Caller
from tests.jobs.test_jobs_hub import nb_json
from tests.service.conftest import build_ledger

HOMES = {"preemptible": "batch", "normal": "batch", "high": "batch"}


class FakeSlurm:
    name = "slurm"

    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []

    def home_partition(self, priority: str) -> str:
        return HOMES[priority]

    def move(self, ref: dict[str, Any], partition: str) -> None:
        self.moves.append((ref["slurm_job_id"], partition))


@pytest.fixture
def setup(tmp_path: Path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite")
    slurm = FakeSlurm()
    jobs = JobManager(
        ledger,
        ledger.db,
        slurm,  # type: ignore[arg-type]
        tmp_path / "jobs",
        burst_partition="cloud",
        slurm_partitions=HOMES,
        burst_after_wait=0.5,
        burst_when_allocated_above=0.8,
    )
    jobs.run_jobs_as_service_user = True
    yield ledger, jobs, slurm, Burst(jobs, logging.getLogger("test"))
    ledger.db.dispose()


def submit(jobs: JobManager, slurm_id: str, **body: Any) -> int:
    body = {"notebook": nb_json(["1"]), "profile": "gpu-1", **body}
    job_id = int(jobs.submit(Caller("ann", (), "ann"), body)["id"])
    with jobs.db.writing() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        row.backend_ref = {"slurm_job_id": slurm_id, "attempt_id": "a"}
    return job_id


def rows(jobs: JobManager) -> list[JobRow]:
    with jobs.db.reading() as s:
        return list(s.scalars(select(JobRow).order_by(JobRow.id)))


def waiting(jobs: JobManager) -> dict[int, RunStatus]:
    return {r.id: RunStatus(True, waiting="pending in Slurm (Resources)") for r in rows(jobs)}


def test_a_job_waiting_half_its_expected_run_time_is_sent(setup):
    _, jobs, slurm, burst = setup
    sent = submit(jobs, "11", max_runtime=600, burstable=True)
    submit(jobs, "12", max_runtime=600)  # not burstable: never moved
    t0 = rows(jobs)[0].submitted_at
    burst.pass_(rows(jobs), waiting(jobs), t0 + timedelta(seconds=299))
    assert slurm.moves == []
    burst.pass_(rows(jobs), waiting(jobs), t0 + timedelta(seconds=301))
    burst.pass_(rows(jobs), waiting(jobs), t0 + timedelta(seconds=400))  # sent once
    assert slurm.moves == [("11", "cloud")]
    row = jobs.row(sent)
    assert row is not None and row.bursts == 1 and row.backend_ref["burst"] is True
    assert row.waiting_reason == (
        "sent to the burst partition cloud: it waited 5 min, 0.5 of its expected run time (10 min)"
    )


def test_a_cluster_allocated_above_the_threshold_for_ten_minutes_sends_at_once(setup):
    ledger, jobs, slurm, burst = setup
    # 2 whole GPUs and a 3g.40gb instance (428 milli) of 3 GPUs: 81 % allocated
    for profile, user in (("gpu-1", "a"), ("gpu-1", "b"), ("mig-3g.40gb", "c")):
        ledger.allocate(Caller(user, ("physics",), user), profile, "")
    submit(jobs, "21", max_runtime=86400, burstable=True)
    submit(jobs, "22", max_runtime=86400)
    now = utcnow()
    burst.pass_(rows(jobs), waiting(jobs), now)
    burst.pass_(rows(jobs), waiting(jobs), now + timedelta(minutes=9, seconds=59))
    assert slurm.moves == []
    burst.pass_(rows(jobs), waiting(jobs), now + timedelta(minutes=10))
    assert slurm.moves == [("21", "cloud")]
    assert "more than 80% allocated for 10 minutes" in (rows(jobs)[0].waiting_reason or "")


def test_allocation_that_drops_below_the_threshold_starts_the_ten_minutes_again(setup):
    ledger, jobs, slurm, burst = setup
    held = [
        ledger.allocate(Caller(u, ("physics",), u), p, "")[0]
        for p, u in (("gpu-1", "a"), ("gpu-1", "b"), ("mig-3g.40gb", "c"))
    ]
    submit(jobs, "31", max_runtime=86400, burstable=True)
    now = utcnow()
    burst.pass_(rows(jobs), waiting(jobs), now)
    ledger.release(held[2]["id"], "c", "done")  # 67 %
    burst.pass_(rows(jobs), waiting(jobs), now + timedelta(minutes=5))
    ledger.allocate(Caller("c", ("physics",), "c"), "mig-3g.40gb", "")
    burst.pass_(rows(jobs), waiting(jobs), now + timedelta(minutes=6))
    burst.pass_(rows(jobs), waiting(jobs), now + timedelta(minutes=15))
    assert slurm.moves == []
    burst.pass_(rows(jobs), waiting(jobs), now + timedelta(minutes=16))
    assert slurm.moves == [("31", "cloud")]


def test_a_job_requeued_in_the_burst_partition_comes_back_and_its_hours_count(setup):
    _, jobs, slurm, burst = setup
    job_id = submit(jobs, "41", max_runtime=600, burstable=True)
    now = utcnow()
    with jobs.db.writing() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        row.backend_ref = {**row.backend_ref, "burst": True}
        row.attempt_started_at = now - timedelta(hours=1)
    row = jobs.row(job_id)
    burst.account(row, now)  # one whole GPU for an hour there
    burst.come_back(job_id, "preemptible")
    assert slurm.moves == [("41", "batch")]
    row = jobs.row(job_id)
    assert row is not None and row.backend_ref["burst"] is False
    assert row.burst_gpu_seconds == pytest.approx(3600)
    assert row.waiting_reason == "preempted in the burst partition cloud; back in batch's queue"


def test_asking_to_burst_where_there_is_no_burst_partition_is_refused(setup, tmp_path: Path):
    ledger, jobs, _, _ = setup
    plain = JobManager(ledger, ledger.db, FakeSlurm(), tmp_path / "plain")  # type: ignore[arg-type]
    plain.run_jobs_as_service_user = True
    body = {"notebook": nb_json(["1"]), "profile": "gpu-1", "burstable": True}
    with pytest.raises(Refused) as refused:
        plain.submit(Caller("ann", (), "ann"), body)
    assert "no burst partition" in refused.value.message
    for value in ("yes", 1, None):
        with pytest.raises(Refused) as refused:
            jobs.submit(Caller("ann", (), "ann"), {**body, "burstable": value})
        assert refused.value.message == "field 'burstable' must be true or false"
    assert rows(jobs) == [] and rows(plain) == []
