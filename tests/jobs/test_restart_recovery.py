"""A service killed mid-operation, and started again (jobs/recovery.py): real runners (the
local backend's subprocesses) over a real SQLite ledger. The kill is a BaseException
raised where the service would die: what was committed before it stays, nothing after
it runs, and a second JobManager on the same ledger is the restarted service.

Found by an independent crash attack (SIGKILL of the real service at the moment a state
was committed): a job cancelled, timed out or completed just before the kill kept its
slice for good, and a start cut short left a runner nobody knew of, the job started
again beside it."""

from __future__ import annotations

import contextlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from sqlalchemy import select

from gpuslice.run.jobdir import JobDir
from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.backends.local import LocalBackend
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.recovery import recover
from gpuslice_hub.jobs.runner_state import ATTEMPT_ID
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from tests.harness.hub import wait_for
from tests.jobs.full_cluster import PROFILES, hosts
from tests.jobs.test_jobs_hub import nb_json
from tests.service.conftest import build_ledger

ANN = Caller("ann", (), "ann")
SLEEPS = ["import time\ntime.sleep(120)"]


class ServiceKilled(BaseException):
    """The service dies here: no ``except Exception`` of its own runs."""


class DiesAfterStarting(LocalBackend):
    """The runner is started; the service dies before it records the run."""

    def start(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        super().start(*args, **kwargs)
        raise ServiceKilled


class DiesBeforeKilling(LocalBackend):
    """The service dies after committing a job's end, before stopping its run."""

    def kill(self, ref: dict[str, Any]) -> None:
        raise ServiceKilled


def service(tmp_path: Path, backend: LocalBackend) -> JobManager:
    """The service's job side on the test's ledger (a second call: the restarted one)."""
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    jobs = JobManager(ledger, ledger.db, backend, tmp_path / "jobs")
    jobs.run_jobs_as_service_user = True
    return jobs


def submit(jobs: JobManager) -> int:
    body = {"notebook": nb_json(SLEEPS), "profile": "gpu-1", "path": "sleep.ipynb"}
    return int(jobs.submit(ANN, body)["id"])


def row(jobs: JobManager, job_id: int) -> JobRow:
    with jobs.db.reading() as s:
        job = s.get(JobRow, job_id)
        assert job is not None
        s.expunge(job)
        return job


def reasons(jobs: JobManager, job_id: int) -> list[str]:
    with jobs.db.reading() as s:
        q = select(JobTransitionRow.reason).where(JobTransitionRow.job_id == job_id)
        return list(s.scalars(q.order_by(JobTransitionRow.id)))


def runs_of(root: Path, job_id: int) -> list[psutil.Process]:
    """The runner processes of job ``job_id`` of the service whose folders are under
    ``root`` (each run's environment names its job; its command line, its folder: the
    tests beside this one run jobs of the same ids)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if (
                env.get("GPUSLICE_JOB_ID") == str(job_id)
                and ATTEMPT_ID in env
                and "gpuslice.run" in (cmdline := " ".join(proc.cmdline()))
                and str(root) in cmdline
                and proc.status() != psutil.STATUS_ZOMBIE
            ):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def ended(procs: list[psutil.Process]) -> bool:
    """Whether every one of ``procs`` has ended (a zombie here: the dead service's child,
    which a real restart leaves to init)."""
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def batch_held(jobs: JobManager) -> list[dict[str, Any]]:
    held = jobs.ledger.allocations(user=None, active_only=True, limit=100)
    return [a for a in held if a["purpose"] == "batch"]


@pytest.fixture
def cleanup():
    ids: list[tuple[Path, int]] = []
    yield ids
    for root, job_id in ids:
        for proc in runs_of(root, job_id):
            try:
                tree = [proc, *proc.children(recursive=True)]
            except psutil.Error:
                continue
            for p in tree:
                with contextlib.suppress(psutil.Error):
                    p.kill()


def test_a_start_cut_short_is_stopped_and_queued_again_not_run_twice(tmp_path, cleanup):
    jobs = service(tmp_path, DiesAfterStarting())
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    with pytest.raises(ServiceKilled):
        Scheduler(jobs, simulated=True).tick()
    assert row(jobs, job_id).state == "starting"
    first = wait_for(lambda: runs_of(tmp_path, job_id), 30, "the runner the dead service started")

    restarted = service(tmp_path, LocalBackend())
    done = recover(restarted)
    assert done == [f"job {job_id} was being started: its run stopped, and queued again"]
    wait_for(lambda: ended(first), 30, "the unknown run stopped")
    job = row(restarted, job_id)
    # no crash counted, nothing held, and the history says what happened
    assert (job.state, job.restarts, job.allocation_ids) == ("queued", 0, [])
    assert reasons(restarted, job_id)[-1] == (
        "the service stopped while starting its run; queued again"
    )
    assert batch_held(restarted) == []

    # started again, once
    Scheduler(restarted, simulated=True).tick()
    job = row(restarted, job_id)
    assert job.state == "starting" and job.backend_ref.get("pid")
    assert "launching" not in job.backend_ref
    runs = wait_for(lambda: runs_of(tmp_path, job_id), 30, "the new run")
    assert [p.pid for p in runs] == [job.backend_ref["pid"]]
    restarted.cancel(job_id, "ann")


class CancelledWhileStarting(LocalBackend):
    """The owner's cancel lands after the start committed ``starting`` and before the
    runner is up: it finds no pid to kill and releases the slice."""

    jobs: JobManager
    late: dict[str, Any]

    def start(self, job_id: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.jobs.cancel(job_id, "ann")
        self.late = super().start(job_id, *args, **kwargs)
        return self.late


def test_a_job_cancelled_while_its_run_starts_has_that_run_stopped(tmp_path, cleanup):
    backend = CancelledWhileStarting()
    jobs = backend.jobs = service(tmp_path, backend)
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    Scheduler(jobs, simulated=True).tick()
    # the run the start began anyway is stopped, not left on a GPU the ledger gave back
    job = row(jobs, job_id)
    assert job.state == "cancelled"
    assert batch_held(jobs) == []
    assert "pid" not in job.backend_ref  # not overwritten by the late start's reference
    with contextlib.suppress(psutil.NoSuchProcess):  # (gone and reaped already)
        late = psutil.Process(backend.late["pid"])
        wait_for(lambda: ended([late]), 30, "the late run stopped")
    log = JobDir(Path(job.job_dir)).log_path.read_text()
    assert "cancelled while its run was starting; stopping it" in log


class PreemptedWhileStarting(LocalBackend):
    """A spawn's (or an admin's) preemption lands after the start committed ``starting``
    and before the runner has a pid: its signal has nowhere to go."""

    jobs: JobManager

    def start(self, job_id: int, *args: Any, **kwargs: Any) -> dict[str, Any]:
        self.jobs.preempt(job_id, "admin", "an interactive server needs its slice")
        return super().start(job_id, *args, **kwargs)


def test_a_job_preempted_while_its_run_starts_is_asked_once_the_run_is_up(tmp_path, cleanup):
    """Found by an attack: the run was never asked, ran through the whole grace period and
    was killed at its end, its work since the start lost, the spawn waiting all along."""
    backend = PreemptedWhileStarting()
    jobs = backend.jobs = service(tmp_path, backend)
    jobs.preempt_grace = 120.0
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    scheduler = Scheduler(jobs, simulated=True)
    scheduler.tick()
    log = JobDir(Path(row(jobs, job_id).job_dir)).log_path
    assert "preempted while its run was starting: asked to checkpoint" in log.read_text()
    # the run stops long before its grace period would end, and the job is requeued
    wait_for(
        lambda: (scheduler.tick(), "requeued after preemption" in reasons(jobs, job_id))[1],
        30,
        "the preempted run to stop",
    )
    assert not any("killed after the grace period" in r for r in reasons(jobs, job_id))


def test_the_runs_of_cancelled_jobs_are_waited_for_not_left_zombies(tmp_path, cleanup):
    """Found by an attack: a cancelled or timed-out job's runner is never polled again, so
    the service never waited for it: one zombie process per cancel, for as long as it ran."""
    backend = LocalBackend()
    jobs = service(tmp_path, backend)
    scheduler = Scheduler(jobs, simulated=True)
    pids = []
    for _ in range(3):
        job_id = submit(jobs)
        cleanup.append((tmp_path, job_id))
        scheduler.tick()
        wait_for(lambda: runs_of(tmp_path, job_id), 30, "the job's runner")  # noqa: B023
        pids.append(row(jobs, job_id).backend_ref["pid"])
        jobs.cancel(job_id, "ann")

    def waited_for() -> bool:
        scheduler.tick()
        return not any(psutil.pid_exists(pid) for pid in pids)

    wait_for(waited_for, 30, "the killed runners to be waited for")
    assert not backend._procs


class KillFailsOnce(LocalBackend):
    """The first kill fails, as an engine that does not answer would (the local backend's
    own kill only signals, and never fails)."""

    failed = False

    def kill(self, ref: dict[str, Any]) -> None:
        if not self.failed:
            self.failed = True
            raise RuntimeError("the controller did not answer")
        super().kill(ref)


def test_a_cancel_whose_kill_fails_keeps_the_slice_until_a_pass_stops_the_run(tmp_path, cleanup):
    backend = KillFailsOnce()
    jobs = service(tmp_path, backend)
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    scheduler = Scheduler(jobs, simulated=True)
    scheduler.tick()
    run = wait_for(lambda: runs_of(tmp_path, job_id), 30, "the job's runner")
    held = batch_held(jobs)
    assert [a["server_name"] for a in held] == [f"job-{job_id}"]
    # the cancel stands (the owner is told so), the run it could not stop keeps its slice
    assert jobs.cancel(job_id, "ann")["state"] == "cancelled"
    assert not ended(run)
    assert batch_held(jobs) == held
    log = JobDir(Path(row(jobs, job_id).job_dir)).log_path.read_text()
    assert "could not stop its run (the controller did not answer); trying again" in log
    # the next pass stops it, then gives the slice back
    scheduler.tick()
    wait_for(lambda: ended(run), 30, "the cancelled job's run stopped")
    assert batch_held(jobs) == []
    assert jobs.kills_pending == {}
    assert jobs.ledger.get(held[0]["id"])["release_reason"] == f"job {job_id} cancelled"


def test_a_job_ended_before_its_slice_went_back_has_its_run_stopped_and_slice_freed(
    tmp_path, cleanup
):
    jobs = service(tmp_path, DiesBeforeKilling())
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    Scheduler(jobs, simulated=True).tick()
    run = wait_for(lambda: runs_of(tmp_path, job_id), 30, "the job's runner")
    held = batch_held(jobs)
    assert [a["server_name"] for a in held] == [f"job-{job_id}"]
    with pytest.raises(ServiceKilled):
        jobs.cancel(job_id, "ann")  # committed; neither its kill nor its release ran
    assert row(jobs, job_id).state == "cancelled"
    assert batch_held(jobs) == held  # the leak: nothing else would ever release it

    restarted = service(tmp_path, LocalBackend())
    done = recover(restarted)
    assert done == [f"allocation {held[0]['id']}, which job {job_id} no longer held, released"]
    wait_for(lambda: ended(run), 30, "the cancelled job's run stopped")
    assert batch_held(restarted) == []
    released = restarted.ledger.get(held[0]["id"])
    assert released["release_reason"] == (
        f"job {job_id} no longer holds it (the service stopped first)"
    )
    assert row(restarted, job_id).state == "cancelled"


def test_a_slice_allocated_for_a_job_never_moved_is_released(tmp_path, cleanup):
    jobs = service(tmp_path, LocalBackend())
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    # the scheduler's allocation, committed before the job's move to starting
    alloc, _ = jobs.ledger.allocate(ANN, "gpu-1", f"job-{job_id}", purpose="batch")
    restarted = service(tmp_path, LocalBackend())
    assert recover(restarted) == [
        f"allocation {alloc['id']}, which job {job_id} no longer held, released"
    ]
    assert batch_held(restarted) == []
    # what jobs do hold is left alone, and nothing is left to do a second time
    Scheduler(restarted, simulated=True).tick()
    assert [a["server_name"] for a in batch_held(restarted)] == [f"job-{job_id}"]
    assert recover(restarted) == []


class DiesBeforeSignalling(LocalBackend):
    """The service dies after committing a preemption, before asking the run to checkpoint."""

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        raise ServiceKilled


def test_a_preemption_never_asked_of_its_run_is_asked_again(tmp_path, cleanup):
    jobs = service(tmp_path, DiesBeforeSignalling())
    job_id = submit(jobs)
    cleanup.append((tmp_path, job_id))
    Scheduler(jobs, simulated=True).tick()
    folder = JobDir(Path(row(jobs, job_id).job_dir))
    log = folder.log_path
    # in its cell: its kernel is up and its signal handlers are in place
    wait_for(lambda: folder.state().get("current_cell") == 0, 60, "the runner in its cell")
    with pytest.raises(ServiceKilled):
        jobs.preempt(job_id, "admin", "an interactive server needs its slice")
    assert row(jobs, job_id).state == "preempting"

    restarted = service(tmp_path, LocalBackend())
    started = utcnow()
    assert recover(restarted) == [f"job {job_id} was being preempted: asked again to checkpoint"]
    # its runner hears it now (it was never asked: at the deadline it was killed, and its
    # history said "killed after the grace period"), with the whole grace from now
    wait_for(lambda: "preemption signal SIGTERM" in log.read_text(), 30, "the runner asked")
    deadline = row(restarted, job_id).preempt_deadline
    assert deadline >= started + timedelta(seconds=restarted.preempt_grace)
    assert "asked again to checkpoint" in log.read_text()
