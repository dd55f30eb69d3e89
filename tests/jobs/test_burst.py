"""When burst moves a waiting job (burst.py), over a real ledger and jobs table, with a
stand-in for Slurm's ``scontrol update`` that records each move (the real one:
test_burst_slurm.py): after the configured share of its expected run time, or at once
once the cluster has stayed above the allocation threshold for 10 minutes; never a job
that is not burstable; back to its own partition after a requeue there; its GPU-hours
there counted."""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from gpuslice_hub import clock
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.burst import Burst
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.jobs.states import transition
from gpuslice_hub.ledger import Caller
from tests.jobs.test_jobs_hub import nb_json
from tests.service.conftest import build_ledger

HOMES = {"preemptible": "batch", "normal": "batch", "high": "batch"}


class FakeSlurm:
    """Slurm's queue as a test drives it: ``status[slurm id]`` is what the next pass sees;
    ``move`` records each ``scontrol update Partition=`` (and fails while ``refuse``)."""

    name = "slurm"
    schedules_itself = True
    engine = "Slurm"
    ref_key = "slurm_job_id"

    def __init__(self) -> None:
        self.moves: list[tuple[str, str]] = []
        self.status: dict[str, RunStatus] = {}
        self.refuse = ""
        self.killed: list[str] = []

    def home_partition(self, priority: str) -> str:
        return HOMES[priority]

    def move(self, ref: dict[str, Any], partition: str) -> None:
        if self.refuse:
            raise RuntimeError(self.refuse)
        self.moves.append((ref["slurm_job_id"], partition))

    def submit(self, job_id: int, job_dir: str, *args: Any, **kw: Any) -> dict[str, Any]:
        sid = str(100 + job_id)
        self.status[sid] = RunStatus(
            True, waiting="pending in Slurm (Resources)", partition="batch"
        )
        return {"slurm_job_id": sid, "job_dir": job_dir, "attempt_id": kw.get("attempt", "")}

    def poll_many(self, refs: Any) -> list[RunStatus]:
        return [self.status.get(str(r.get("slurm_job_id")), RunStatus(False)) for r in refs]

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return self.poll_many([ref])[0]

    def find(self, job_id: int, account: Any) -> str:
        return ""

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        pass

    def kill(self, ref: dict[str, Any]) -> None:
        self.killed.append(ref["slurm_job_id"])


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


def test_a_run_in_the_burst_partition_is_counted_once_when_it_ends(setup):
    _, jobs, _, _ = setup
    job_id = submit(jobs, "41", max_runtime=600, burstable=True)
    now = utcnow()
    with jobs.db.writing() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        row.state = "running"
        row.backend_ref = {
            **row.backend_ref,
            "burst_started_at": (now - timedelta(hours=1)).isoformat(),
            "burst_milli": 2000,  # two whole GPUs
        }
    with jobs.db.writing() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        transition(s, row, "queued", "requeued")
        transition(s, row, "cancelled", "no longer wanted")  # nothing more to count
    row = jobs.row(job_id)
    assert row is not None and row.burst_gpu_seconds == pytest.approx(2 * 3600, rel=1e-3)
    assert "burst_started_at" not in row.backend_ref


def test_a_refused_move_is_said_and_tried_again_later(setup):
    _, jobs, slurm, burst = setup
    job_id = submit(jobs, "51", max_runtime=600, burstable=True)
    t0 = rows(jobs)[0].submitted_at + timedelta(seconds=301)
    slurm.refuse = "Access/permission denied"
    burst.pass_(rows(jobs), waiting(jobs), t0)
    row = jobs.row(job_id)
    assert row is not None and row.bursts == 0
    assert "could not be sent to the burst partition cloud" in (row.waiting_reason or "")
    slurm.refuse = ""
    burst.pass_(rows(jobs), waiting(jobs), t0 + timedelta(minutes=9))
    assert slurm.moves == []
    burst.pass_(rows(jobs), waiting(jobs), t0 + timedelta(minutes=10))
    assert slurm.moves == [("51", "cloud")]


def test_the_pass_sends_records_where_slurm_runs_it_and_brings_it_back(setup):
    """The whole path through the service's delegated pass, Slurm's answers scripted, on
    the service's clock moved by the test."""
    ledger, jobs, slurm, _ = setup
    at = clock.ManualClock(utcnow())
    with clock.installed(at):
        scheduler = Scheduler(jobs)
        body = {"notebook": nb_json(["1"]), "profile": "gpu-1", "max_runtime": 600}
        job_id = int(jobs.submit(Caller("ann", (), "ann"), {**body, "burstable": True})["id"])
        scheduler.tick(at.now())  # submitted to Slurm: pending in batch
        sid = jobs.row(job_id).backend_ref["slurm_job_id"]  # type: ignore[union-attr]
        at.advance(299)
        scheduler.tick(at.now())
        assert slurm.moves == []
        at.advance(2)
        scheduler.tick(at.now())
        assert slurm.moves == [(sid, "cloud")]
        slurm.status[sid] = RunStatus(
            True, node="node-a", run=0, state="RUNNING", partition="cloud"
        )
        at.advance(60)
        scheduler.tick(at.now())
        j = jobs.get(job_id)
        assert j is not None and j["state"] == "starting" and j["on_burst"]
        reason = j["transitions"][-1]["reason"]
        assert reason == "Slurm started it on node-a in the burst partition cloud"
        assert ledger.snapshot()[2] == []  # nothing held in this cluster's ledger
        # requeued there (its spot instance taken back): back to batch, its hour counted
        slurm.status[sid] = RunStatus(
            True, waiting="pending in Slurm (Resources)", run=1, partition="cloud"
        )
        at.advance(3600)
        scheduler.tick(at.now())
        assert slurm.moves[-1] == (sid, "batch")
        j = jobs.get(job_id)
        assert j is not None and j["state"] == "queued" and not j["on_burst"]
        assert j["burst_gpu_hours"] == pytest.approx(1.0, rel=1e-3)
        assert "back in batch's queue" in j["log_tail"]
        # it waits from its requeue: not sent again 299 s later, sent at 300 s
        slurm.status[sid] = RunStatus(True, waiting="pending", run=1, partition="batch")
        at.advance(299)
        scheduler.tick(at.now())
        assert len(slurm.moves) == 2
        at.advance(2)
        scheduler.tick(at.now())
        assert slurm.moves[-1] == (sid, "cloud") and jobs.get(job_id)["bursts"] == 2  # type: ignore[index]


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


def test_a_burst_run_past_its_max_runtime_is_stopped_in_slurm_and_counted(setup):
    _, jobs, slurm, _ = setup
    at = clock.ManualClock(utcnow())
    with clock.installed(at):
        scheduler = Scheduler(jobs)
        body = {"notebook": nb_json(["1"]), "profile": "gpu-1", "max_runtime": 600}
        job_id = int(jobs.submit(Caller("ann", (), "ann"), {**body, "burstable": True})["id"])
        scheduler.tick(at.now())
        sid = jobs.row(job_id).backend_ref["slurm_job_id"]  # type: ignore[union-attr]
        at.advance(301)
        scheduler.tick(at.now())  # sent
        slurm.status[sid] = RunStatus(
            True, node="node-a", run=0, state="RUNNING", partition="cloud"
        )
        scheduler.tick(at.now())  # started there: it holds nothing here
        ref = jobs.row(job_id).backend_ref  # type: ignore[union-attr]
        state = {"attempt_id": ref["attempt_id"], "status": "running", "attempt": 1}
        (Path(ref["job_dir"]) / "state.json").write_text(json.dumps(state))
        scheduler.tick(at.now())  # its runner says it runs
        assert jobs.get(job_id)["state"] == "running"  # type: ignore[index]
        at.advance(601)
        scheduler.tick(at.now())
        j = jobs.get(job_id)
        assert j is not None and j["state"] == "timed-out", j["transitions"]
        assert slurm.killed == [sid]
        assert j["burst_gpu_hours"] == pytest.approx(601 / 3600, rel=1e-3)
