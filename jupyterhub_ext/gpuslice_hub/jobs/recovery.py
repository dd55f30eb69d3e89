"""What a service that stopped mid-operation left undone with its jobs, put right at start.

A job's moves are written first and carried out after: a job is ``starting`` before its
runner is started, ``cancelled`` (``timed-out``, ``completed``, requeued...) before its
runner is killed and its slice released. A service killed in between (SIGKILL, the host
going down) leaves, on the next start:

- **a start whose outcome is unknown**: the job is ``starting`` and its run's reference
  (the backend's pid or engine id) was never written, though a runner may be running. The
  scheduler would take it for a dead run, count a crash and start a second runner beside
  the first (two kernels writing one job folder, one of them on a GPU the ledger no
  longer charges). The start writes its attempt id and owner before the backend is asked
  (``launching``): what the run started with that attempt is stopped here, and the job
  queued again, no crash counted;
- **a preemption never asked of its run**: the job is ``preempting`` with a deadline, and
  the signal that asks its runner to checkpoint may not have been sent. At the deadline it
  was killed, its work since the last save lost, and its history said it was "killed after
  the grace period". The signal is sent again (a runner asked twice acts once) and the
  grace counts from now;
- **a slice no job holds**: a batch allocation that no unfinished job lists (its job
  finished or went back to the queue, or the scheduler allocated it and had not yet
  moved the job). The reconciler looks only at servers' slices, so it stayed allocated
  for good. A finished job's run is stopped first (a cancel that never killed its runner),
  then the slice is released.

Run once, before the scheduler's first pass: nothing else is under way then.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

from sqlalchemy import select

from ..db.jobs_models import JobRow
from ..db.models import utcnow
from ..errors import Refused
from ..snapshot import load_active
from .holder import holder_job
from .manager import JobManager
from .states import TERMINAL, transition

log = logging.getLogger(__name__)

# What a start writes before it asks the backend (scheduler._start), replaced by the
# backend's reference once it answers.
LAUNCHING = "launching"


def recover(jobs: JobManager) -> list[str]:
    """Put right what a stopped service left undone; one line per thing done (logged)."""
    done = _interrupted_starts(jobs) + _unsignalled_preemptions(jobs) + _unheld_slices(jobs)
    for line in done:
        log.warning("after the service's restart: %s", line)
    return done


def _stop_run(jobs: JobManager, job: Any) -> None:
    """Stop what is left of ``job``'s run, whichever backend runs it."""
    ref = dict(job.backend_ref or {})
    if not ref:
        return
    try:
        reap = getattr(jobs.backend, "reap", None)
        if ref.get(LAUNCHING) and reap is not None:
            reap(ref)  # no pid yet: found by its attempt (backends/local.py)
        else:
            jobs.backend.kill(ref)
    except Exception:
        # (a run that cannot be stopped now is the backend's to end; the slice still goes)
        log.exception("job %s: could not stop its run after the service's restart", job.id)


def _interrupted_starts(jobs: JobManager) -> list[str]:
    done = []
    with jobs.db.reading() as s:
        starting = [
            job
            for job in s.scalars(select(JobRow).where(JobRow.state == "starting"))
            if (job.backend_ref or {}).get(LAUNCHING)
        ]
        s.expunge_all()
    for job in starting:
        _stop_run(jobs, job)
        with jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != "starting" or not (row.backend_ref or {}).get(LAUNCHING):
                continue
            allocs, row.allocation_ids = list(row.allocation_ids or []), []
            row.backend_ref = {}
            row.attempt_started_at = None
            transition(s, row, "queued", "the service stopped while starting its run; queued again")
        jobs.log_line(job, "the service stopped while starting this run; queued again")
        jobs.release(allocs, f"job {job.id}'s start was interrupted")
        done.append(f"job {job.id} was being started: its run stopped, and queued again")
    return done


def _unsignalled_preemptions(jobs: JobManager) -> list[str]:
    now = utcnow()
    grace = timedelta(seconds=jobs.preempt_grace)
    with jobs.db.writing() as s:
        preempting = list(s.scalars(select(JobRow).where(JobRow.state == "preempting")))
        asked = []
        for job in preempting:
            if (job.backend_ref or {}).get("preempted_by"):
                continue  # the engine preempts it (Slurm, Kubernetes): the pass follows that
            if job.preempt_deadline is None or job.preempt_deadline < now + grace:
                job.preempt_deadline = now + grace
            asked.append((job.id, dict(job.backend_ref or {}), job.job_dir))
    done = []
    for job_id, ref, job_dir in asked:
        try:
            jobs.backend.signal_preempt(ref)
        except Exception:
            log.exception("job %s: could not ask its run to checkpoint again", job_id)
            continue
        jobs.log_line(
            SimpleNamespace(id=job_id, job_dir=job_dir),
            "the service restarted while preempting this job: asked again to checkpoint",
        )
        done.append(f"job {job_id} was being preempted: asked again to checkpoint")
    return done


def _unheld_slices(jobs: JobManager) -> list[str]:
    with jobs.db.reading() as s:
        held = {
            int(a)
            for ids in s.scalars(select(JobRow.allocation_ids).where(JobRow.state.not_in(TERMINAL)))
            for a in ids or ()
        }
        unheld = [a for a in load_active(s) if a.purpose == "batch" and a.id not in held]
        ids = {holder_job(a.server_name) for a in unheld} - {None}
        ended = select(JobRow).where(JobRow.id.in_(ids), JobRow.state.in_(TERMINAL))
        finished = {job.id: job for job in s.scalars(ended)}
        s.expunge_all()
    done = []
    for alloc in unheld:
        job_id = holder_job(alloc.server_name)
        job = finished.get(job_id) if job_id is not None else None
        if job is not None:
            _stop_run(jobs, job)
        what = f"job {job_id}" if job_id is not None else alloc.server_name
        try:
            jobs.ledger.release(
                alloc.id, "scheduler", f"{what} no longer holds it (the service stopped first)"
            )
        except Refused as e:
            log.warning("could not release allocation %s: %s", alloc.id, e.message)
            continue
        done.append(f"allocation {alloc.id}, which {what} no longer held, released")
    return done
