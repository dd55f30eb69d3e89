"""The scheduling pass for a backend that queues and places jobs itself (Slurm).

Slurm's queue is the queue: a job is handed to Slurm as soon as the service sees it queued,
and Slurm's priorities, fairshare, limits, backfill and preemption decide when and where it
runs. What the service still does each pass, from one query for every job:

* a job Slurm started is recorded in the ledger on the node Slurm chose (a free slice of its
  profile there), so the spawn form, quotas' view and the admin panel count it;
* a job Slurm requeued (preempted, node failure) gives that slice back and waits in Slurm's
  queue again; its runner resumes from the checkpoint when Slurm runs it again;
* progress, time limits, usage figures and the end of a job, as for any backend
  (:class:`~gpuslice_hub.jobs.scheduler.Scheduler`);
* each waiting job says why it waits (Slurm's reason) and its place among gpuslice's jobs in
  Slurm's priority order.

gpuslice's own queue order, aging, backfill and batch-over-batch preemption are not used:
Slurm does those.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import select

from gpuslice.run.jobdir import JobDir
from gpuslice.vocab import EXIT_PREEMPTED

from ..db.jobs_models import JobRow
from ..errors import Refused
from ..ledger import Caller
from .accounts import AccountError
from .backends.base import QueueingBackend, RunStatus
from .runner_state import ATTEMPT_ID, runner_claims
from .states import ACTIVE, PRIORITY_CLASSES, transition

if TYPE_CHECKING:
    from .scheduler import Scheduler

# What a pass reads of each queued job
QUEUED_COLUMNS = (JobRow.id, JobRow.backend_ref, JobRow.not_before, JobRow.waiting_reason)
# Submissions per pass: a backlog of thousands goes to Slurm over a few passes, and the
# running jobs are watched in between (each sbatch is a fork and a round trip).
SUBMIT_BATCH = 200


class DelegatedPass:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.jobs = scheduler.jobs
        self.log = scheduler.log

    def tick(self, now: datetime) -> None:
        with self.jobs.db.reading() as s:
            active = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE))))
            # of the queue, what a pass reads (whole rows of thousands of jobs cost most
            # of it): the few that start or are submitted are read in full below
            queued = list(s.execute(select(*QUEUED_COLUMNS).where(JobRow.state == "queued")))
        everyone: list[Any] = [*active, *queued]
        known = [j for j in everyone if (j.backend_ref or {}).get("slurm_job_id")]
        try:
            # one question to Slurm for every job it knows of
            polled = self.jobs.backend.poll_many([j.backend_ref for j in known])
        except Exception:
            self.log.exception("Slurm could not be asked about gpuslice's jobs; will retry")
            return
        statuses = {j.id: st for j, st in zip(known, polled, strict=True)}
        self.jobs.backend_order = _priority_order(queued, statuses)
        for job in active:
            try:
                # a running job always has a Slurm job: one that has none lost it
                self._watch(job, now, statuses.get(job.id) or RunStatus(False))
            except Exception:
                # one job's trouble never stops the others' pass
                self.log.exception("job %s: watching it failed; will retry", job.id)
        waiting: dict[int, str] = {}
        started: list[tuple[int, RunStatus]] = []
        submit: list[int] = []
        for waits in queued:
            status = statuses.get(waits.id)
            if status is not None and status.alive and status.node:
                # not the run that ended (preempted), while Slurm still tears it down
                if not status.completing and not _same_run(waits, status):
                    started.append((waits.id, status))
            elif status is not None and status.alive:
                waiting[waits.id] = status.waiting
            elif (waits.not_before or now) <= now:
                submit.append(waits.id)
        for job_id, status in started:
            self._each(job_id, "recording it", partial(self._placed, status=status, now=now))
        for job_id in submit[:SUBMIT_BATCH]:
            self._each(job_id, "submitting it to Slurm", self._submit)
        self.scheduler._waiting({j.id: j.waiting_reason for j in queued}, waiting)

    def _each(self, job_id: int, what: str, act: Callable[[JobRow], None]) -> None:
        """``act`` on the job's whole row if it is still queued; its trouble is its own."""
        try:
            row = self.jobs.row(job_id)
            if row is not None and row.state == "queued":
                act(row)
        except Exception:
            self.log.exception("job %s: %s failed; will retry", job_id, what)

    def _watch(self, job: JobRow, now: datetime, status: RunStatus) -> None:
        if status.alive and (not status.node or not _same_run(job, status)):
            # Slurm requeued it (its own preemption, a node failure) and it waits in Slurm's
            # queue, or already runs again: give the recorded slice back; the next pass
            # records it where it runs.
            runner = runner_claims(JobDir(Path(job.job_dir)).state())
            preempted = runner.get("status") == "preempted" or job.state == "preempting"
            code = EXIT_PREEMPTED if preempted else None
            self.scheduler._finished(job, RunStatus(False, code), runner, now)
            return
        self.scheduler._watch(job, now, status)

    def _placed(self, job: JobRow, status: RunStatus, now: datetime) -> None:
        """Slurm started ``job`` on ``status.node``: hold its slices there in the ledger."""
        node, restarts = status.node, status.restarts
        caller = Caller(job.user, tuple(job.groups or ()), "slurm")
        got: list[dict[str, Any]] = []
        why = ""
        for _ in range(job.slices):
            try:
                got.append(
                    self.jobs.ledger.record_placed(
                        caller,
                        job.profile,
                        node,
                        f"job-{job.id}",
                        priority=100 * PRIORITY_CLASSES[job.priority_class],
                        preemptible=job.priority_class == "preemptible",
                    )
                )
            except Refused as e:
                why = e.message
                break
        said = f"Slurm started it on {node}"
        if why:
            # Slurm runs it regardless: the external mirror holds what it holds there
            self.jobs.release([g["id"] for g in got], f"job {job.id}: {why}")
            got = []
            said += f"; the ledger could not record it ({why})"
            self.log.warning(
                "job %s runs on %s in Slurm but the ledger cannot record it (%s): check "
                "the service's hosts against Slurm's nodes",
                job.id,
                node,
                why,
            )
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != "queued":
                row = None
            else:
                transition(s, row, "starting", said)
                row.allocation_ids = [g["id"] for g in got]
                row.attempt_started_at = now
                row.started_at = row.started_at or now
                row.waiting_reason = None
                row.not_before = None
                # which run of the Slurm job this is: a requeued job is the same job again
                ref = {**(row.backend_ref or {}), "node": node, "run": restarts}
                ref.pop("preempted_by", None)  # that preemption is over
                row.backend_ref = ref
        if row is None:
            self.jobs.release([g["id"] for g in got], f"job {job.id} no longer queued")

    def _submit(self, job: JobRow) -> None:
        try:
            account = self.jobs.account(job.user)
        except AccountError as e:
            self.scheduler._fail(job, str(e), [])
            return
        # names this submission: Slurm runs the same script again after a requeue, so every
        # run of it has this id, and a state.json of an earlier submission is never this one's
        attempt = secrets.token_hex(8)
        env = self.scheduler._env(job, [], account)
        env[ATTEMPT_ID] = attempt
        profile = self.jobs.ledger.profiles.get(job.profile)
        if profile is None:
            self.scheduler._fail(job, f"profile {job.profile} no longer exists", [])
            return
        try:
            ref = cast(QueueingBackend, self.jobs.backend).submit(
                job.id,
                job.job_dir,
                env,
                profile,
                job.slices,
                job.priority_class,
                account=account,
                attempt=attempt,
            )
        except Exception as e:
            self.scheduler._fail(job, f"Slurm refused the job: {e}", [])
            return
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.state == "queued":
                row.backend_ref = ref
                row.not_before = None
                row.waiting_reason = f"submitted to Slurm as job {ref['slurm_job_id']}"
                return
        # cancelled while it was being submitted
        self.jobs.backend.kill(ref)


def _same_run(job: Any, status: RunStatus) -> bool:
    """Whether ``status`` is the run of the Slurm job recorded last: on the same node and
    not requeued since (Slurm counts its restarts)."""
    ref = job.backend_ref or {}
    if "run" not in ref:
        return False
    return ref.get("node") == status.node and ref.get("run") == status.restarts


def _priority_order(queued: list[Any], statuses: dict[int, RunStatus]) -> dict[int, int]:
    """Each waiting job's place among gpuslice's jobs in Slurm's queue: by Slurm's
    priority (highest first), then submission."""
    waiting = [
        (-(st.priority or 0), job.id)
        for job in queued
        if (st := statuses.get(job.id)) is not None and st.alive and not st.node
    ]
    return {job_id: i + 1 for i, (_, job_id) in enumerate(sorted(waiting))}
