"""The pass's watch of running jobs does only what can have changed: a job whose row and
runner files are as the last pass left them is not compared field by field again, yet its
time-bound checks (max runtime) still turn on time, and a change the runner writes is
still copied. A backend that wrote the folder itself and vouches it wrote nothing since
(the simulator's) saves the ``stat`` too.

The scheduler is driven at chosen instants (``tick(now)``) over a real SQLite ledger."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

from gpuslice.run.jobdir import JobDir
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.durations import spoken
from gpuslice_hub.jobs import runner_files
from gpuslice_hub.jobs import scheduler as scheduler_module
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.runner_files import RunnerFiles
from gpuslice_hub.jobs.runner_state import ATTEMPT_ID
from gpuslice_hub.jobs.scheduler import Scheduler
from tests.jobs.full_cluster import PROFILES, IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger


class WatchedBackend(IdleBackend):
    """Runs are alive until killed; ``unchanged`` is what it vouches of their folders."""

    def __init__(self) -> None:
        super().__init__()
        self.unchanged = False
        self.killed: list[dict[str, Any]] = []
        self.attempts: dict[int, str] = {}

    def start(self, job_id: int, job_dir: str, env: dict[str, str], **kw: Any) -> dict[str, Any]:
        self.attempts[job_id] = env[ATTEMPT_ID]
        return super().start(job_id)

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        if ref in self.killed:
            return RunStatus(False, None)
        return RunStatus(True, files_unchanged=self.unchanged)

    def kill(self, ref: dict[str, Any]) -> None:
        self.killed.append(ref)


@pytest.fixture
def running(tmp_path: Path, monkeypatch):
    """A job started and running (its runner said so), and a count of the field-by-field
    comparisons and of the stats of runner files made since."""
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    backend = WatchedBackend()
    manager = JobManager(ledger, ledger.db, backend, tmp_path / "jobs")  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    scheduler = Scheduler(manager)
    (job_id,) = insert_queued(ledger.db, tmp_path, [("alice", "gpu-1", "normal")])
    with ledger.db.writing() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(max_runtime=3600.0))
    t0 = utcnow()
    scheduler.tick(t0)
    assert backend.started == [job_id]
    folder = JobDir(Path(str(tmp_path / f"job-{job_id}")))
    folder.root.mkdir(exist_ok=True)
    folder.checkpoints.mkdir(exist_ok=True)
    folder.write_state(status="running", attempt_id=backend.attempts[job_id], cells_done=1)
    scheduler.tick(t0 + timedelta(seconds=1))
    assert manager.get(job_id)["state"] == "running"
    counts = {"compared": 0, "stat": 0}
    compare, key = scheduler_module._progress_changed, runner_files._key

    def counted_compare(*a: Any) -> bool:
        counts["compared"] += 1
        return compare(*a)

    def counted_key(*a: Any) -> Any:
        counts["stat"] += 1
        return key(*a)

    monkeypatch.setattr(scheduler_module, "_progress_changed", counted_compare)
    monkeypatch.setattr(runner_files, "_key", counted_key)
    try:
        yield scheduler, backend, job_id, folder, t0, counts
    finally:
        ledger.db.dispose()


def test_a_job_nothing_changed_for_is_not_compared_again(running):
    scheduler, _backend, _job_id, _folder, t0, counts = running
    scheduler.tick(t0 + timedelta(seconds=2))  # the first pass that finds nothing to write
    assert counts["compared"] == 1
    for i in range(3, 10):
        scheduler.tick(t0 + timedelta(seconds=i))
    assert counts["compared"] == 1
    assert counts["stat"] == 2 * 8  # its two files are still stat'ed every pass


def test_what_the_runner_writes_is_still_copied(running):
    scheduler, _backend, job_id, folder, t0, _counts = running
    scheduler.tick(t0 + timedelta(seconds=2))
    folder.write_state(
        status="running", attempt_id=scheduler.jobs.backend.attempts[job_id], cells_done=4
    )
    scheduler.tick(t0 + timedelta(seconds=3))
    assert scheduler.jobs.get(job_id)["cells_done"] == 4


def test_the_max_runtime_still_stops_a_job_nothing_changed_for(running):
    scheduler, backend, job_id, _folder, t0, _counts = running
    scheduler.tick(t0 + timedelta(seconds=2))
    scheduler.tick(t0 + timedelta(seconds=3000))
    assert scheduler.jobs.get(job_id)["state"] == "running"
    scheduler.tick(t0 + timedelta(seconds=3602))  # past its 3 600 s from the start at t0
    assert scheduler.jobs.get(job_id)["state"] == "timed-out"
    assert backend.killed


def test_a_backend_that_vouches_for_the_folder_saves_the_stat(running):
    scheduler, backend, job_id, folder, t0, counts = running
    backend.unchanged = True
    for i in range(2, 6):
        scheduler.tick(t0 + timedelta(seconds=i))
    assert counts["stat"] == 0
    assert scheduler.jobs.get(job_id)["cells_done"] == 1
    # a backend that does not vouch: the folder is looked at, and the change found
    backend.unchanged = False
    folder.write_state(status="running", attempt_id=backend.attempts[job_id], cells_done=2)
    scheduler.tick(t0 + timedelta(seconds=6))
    assert counts["stat"] == 2
    assert scheduler.jobs.get(job_id)["cells_done"] == 2


def test_a_vouched_job_nothing_changed_for_is_skipped_until_its_max_runtime(running):
    scheduler, backend, job_id, _folder, t0, _counts = running
    backend.unchanged = True
    scheduler.tick(t0 + timedelta(seconds=2))  # the look that finds nothing to write
    watched: list[int] = []
    real = scheduler._watch

    def counted(job: Any, now: Any, status: RunStatus) -> None:
        watched.append(job.id)
        real(job, now, status)

    scheduler._watch = counted  # type: ignore[method-assign]
    for i in range(3, 10):
        scheduler.tick(t0 + timedelta(seconds=i))
    assert watched == []  # not even looked at: its row, folder and time bound as they were
    scheduler.tick(t0 + timedelta(seconds=3602))  # its max runtime ran out
    assert watched == [job_id]
    assert scheduler.jobs.get(job_id)["state"] == "timed-out"


def test_a_backend_that_names_changed_runs_is_asked_only_about_those(running):
    """(jobs/watchlist.py) With a backend that names the runs that changed, a job the last
    look found nothing to write for is neither asked about nor looked at, until the backend
    names it or its max runtime runs out."""
    scheduler, backend, job_id, folder, t0, _counts = running
    backend.unchanged = True
    named: set[int] = set()
    asked: list[int] = []
    watched: list[int] = []
    poll_many, watch = backend.poll_many, scheduler._watch
    backend.changed_jobs = lambda: named  # type: ignore[attr-defined]

    def counted_poll(refs: Any) -> Any:
        asked.append(len(refs))
        return poll_many(refs)

    def counted_watch(job: Any, now: Any, status: RunStatus) -> None:
        watched.append(job.id)
        watch(job, now, status)

    backend.poll_many = counted_poll  # type: ignore[method-assign]
    scheduler._watch = counted_watch  # type: ignore[method-assign]
    scheduler.tick(t0 + timedelta(seconds=2))  # after a look at all: the memo is made
    scheduler.tick(t0 + timedelta(seconds=3))  # the job looked at last pass, skipped
    assert watched == [job_id]
    for i in range(4, 10):
        scheduler.tick(t0 + timedelta(seconds=i))
    assert asked[-6:] == [0] * 6 and watched == [job_id]
    # the backend names it (its runner wrote): asked about and looked at, the change copied
    backend.unchanged = False
    folder.write_state(status="running", attempt_id=backend.attempts[job_id], cells_done=3)
    named.add(job_id)
    scheduler.tick(t0 + timedelta(seconds=10))
    assert asked[-1] == 1 and watched[-1] == job_id
    assert scheduler.jobs.get(job_id)["cells_done"] == 3
    named.clear()
    backend.unchanged = True
    for i in range(11, 20):
        scheduler.tick(t0 + timedelta(seconds=i))
    assert asked[-1] == 0
    looks = len(watched)
    scheduler.tick(t0 + timedelta(seconds=3602))  # its max runtime ran out: looked at
    assert len(watched) == looks + 1
    assert scheduler.jobs.get(job_id)["state"] == "timed-out"


def test_the_same_claims_are_answered_while_the_files_stay_the_same(tmp_path: Path):
    jd = JobDir(tmp_path / "job")
    jd.root.mkdir()
    jd.checkpoints.mkdir()
    jd.write_state(status="running", cells_done=1)
    files = RunnerFiles()
    first = files.claims(str(jd.root))
    assert files.claims(str(jd.root)) is first
    assert files.claims(str(jd.root), unchanged=True) is first
    jd.last_save_marker.write_text("2000.5")
    second = files.claims(str(jd.root))
    assert second is not first and second["last_checkpoint_at"] == 2000.5
    # a run that ended is read afresh: new claims, even from the same bytes
    assert files.claims(str(jd.root), fresh=True) is not second
    assert files.answers(str(jd.root), second) is False  # read afresh since
    third = files.claims(str(jd.root))
    assert files.answers(str(jd.root), third)
    # a runner's checkpoint time ahead of the clock: the answer moves with the clock, so
    # no pass may take it as settled
    jd.write_state(status="running", cells_done=1, last_checkpoint_at=time.time() + 3600)
    ahead = files.claims(str(jd.root))
    assert files.claims(str(jd.root)) is not ahead
    assert not files.answers(str(jd.root), ahead)


def preempted_how(scheduler: Scheduler, job_id: int) -> str:
    history = scheduler.jobs.get(job_id)["transitions"]
    return next(t["reason"] for t in history if t["state"] == "preempted")


def test_a_run_that_died_during_its_grace_is_not_said_to_be_killed_after_it(running):
    # found by a crash attack: a runner SIGKILLed by someone else while it was being
    # preempted was recorded as "killed after the grace period", which the service had not
    scheduler, backend, job_id, _folder, t0, _counts = running
    scheduler.jobs.preempt(job_id, "admin", "an interactive server needs its slice")
    with scheduler.jobs.db.reading() as s:
        ref = s.get(JobRow, job_id).backend_ref  # type: ignore[union-attr]
    backend.killed.append(ref)  # it dies, unasked
    scheduler.tick(t0 + timedelta(seconds=2))  # requeued (and started again: room is free)
    assert preempted_how(scheduler, job_id).startswith(
        "stopped without a checkpoint before its grace period ended;"
    )


def test_a_run_killed_at_the_end_of_its_grace_is_said_to_be(running):
    scheduler, backend, job_id, _folder, t0, _counts = running
    scheduler.jobs.preempt(job_id, "admin", "an interactive server needs its slice")
    past = t0 + timedelta(seconds=scheduler.jobs.preempt_grace + 5)
    scheduler.tick(past)  # the grace is over: the service kills it
    assert backend.killed
    scheduler.tick(past + timedelta(seconds=1))
    grace = scheduler.jobs.preempt_grace
    how = preempted_how(scheduler, job_id)
    # the grace and the lost work, to the second as the lab and the admin panel write it
    said = rf"killed after its {spoken(grace)} grace period; 1m 0\ds of work to redo"
    assert re.fullmatch(said, how), how
