"""The scheduling pass for a backend that queues and places jobs itself (Slurm, Kubernetes).

The engine's queue is the queue: a job is handed to the engine (an ``sbatch``, a Kubernetes
Job) as soon as the service sees it queued, and the engine's priorities, fairshare or
Kueue quotas, limits, backfill and preemption decide when and where it runs. What the
service still does each pass, from one query for every job:

* a job the engine started is recorded in the ledger on the node it chose (a free slice of
  its profile there), so the spawn form, quotas' view and the admin panel count it;
* a job the engine requeued (preempted, node failure) gives that slice back and waits in
  the engine's queue again; its runner resumes from the checkpoint when it runs again;
* progress, time limits, usage figures and the end of a job, as for any backend
  (:class:`~gpuslice_hub.jobs.scheduler.Scheduler`);
* each waiting job says why it waits (the engine's reason) and its place among gpuslice's
  jobs in the engine's priority order.

gpuslice's own queue order, aging, backfill and batch-over-batch preemption are not used:
the engine does those.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, cast

from gpuslice.vocab import EXIT_BY_STATUS, EXIT_PREEMPTED

from ..db.jobs_models import JobRow
from ..db.models import utcnow
from ..errors import Refused
from ..ledger import Caller
from ..ledger.base import quota_usage
from .accounts import AccountError
from .backends.base import (
    QueueingBackend,
    RunStatus,
    SubmitRefused,
    SubmitUnsure,
    current_ref,
)
from .burst import Burst
from .holder import job_holder
from .row_cache import RowCache
from .runner_state import ATTEMPT_ID
from .states import PRIORITY_CLASSES, transition

if TYPE_CHECKING:
    from .scheduler import Scheduler

# What a pass reads of each queued job (the last five for burst.py)
QUEUED_COLUMNS = (
    JobRow.id,
    JobRow.backend_ref,
    JobRow.not_before,
    JobRow.waiting_reason,
    JobRow.burstable,
    JobRow.max_runtime,
    JobRow.submitted_at,
    JobRow.revision,
)
# Submissions per pass: a backlog of thousands goes to the engine over a few passes, and the
# running jobs are watched in between (each sbatch is a fork and a round trip, each Job a
# create call).
SUBMIT_BATCH = 200


class DelegatedPass:
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.jobs = scheduler.jobs
        self.log = scheduler.log
        self.backend = cast(QueueingBackend, self.jobs.backend)
        self.engine = self.backend.engine
        # burstable jobs moved to a second partition when they wait too long (Slurm)
        self.burst = Burst(self.jobs, self.log) if self.jobs.burst_partition else None
        self.queued = RowCache(QUEUED_COLUMNS, JobRow.state == "queued")
        # job id -> the runner's attempt number of the run last seen running (_ended_run)
        self._runs_seen: dict[int, int] = {}

    def _current(self, ref: dict[str, Any] | None) -> bool:
        """Whether ``ref`` names an engine's job the service has not accounted the end of."""
        return current_ref(ref, self.backend.ref_key)

    def _queued_in_engine(self, ref: dict[str, Any] | None) -> bool:
        """Whether a queued job's ``ref`` names its submission to the engine's queue. A
        ref without a submission id was left by a version that placed jobs itself and
        accounted for that run when it requeued the job: it names an ended run."""
        return self._current(ref) and "attempt_id" in (ref or {})

    def tick(self, now: datetime) -> None:
        with self.jobs.db.reading() as s:
            conn = s.connection()
            # rows read again only where they changed (row_cache.py)
            active: list[Any] = self.scheduler.active.read(conn)
            # of the queue, what a pass reads (whole rows of thousands of jobs cost most
            # of it): the few that start or are submitted are read in full below
            queued: list[Any] = self.queued.read(conn)
        self.scheduler.keep_watching(active)
        known: list[Any] = [j for j in active if self._current(j.backend_ref)]
        known += [j for j in queued if self._queued_in_engine(j.backend_ref)]
        try:
            # one question to the engine for every job it knows of
            polled: list[RunStatus] | None = self.backend.poll_many([j.backend_ref for j in known])
        except Exception:
            self.log.exception("%s could not be asked about its jobs; will retry", self.engine)
            polled = None
        statuses = {j.id: st for j, st in zip(known, polled or [], strict=False)}
        if polled is not None:
            self.jobs.backend_order = _priority_order(queued, statuses)
            for job in active:
                try:
                    # a running job always has an engine's job: one that has none lost it
                    self._watch(job, now, statuses.get(job.id) or RunStatus(False))
                except Exception:
                    # one job's trouble never stops the others' pass
                    self.log.exception("job %s: watching it failed; will retry", job.id)
        waiting: dict[int, str] = {}
        started: list[tuple[int, RunStatus]] = []
        unseen: list[tuple[int, RunStatus]] = []
        submit: list[int] = []
        for waits in queued:
            status = statuses.get(waits.id)
            if self._queued_in_engine(waits.backend_ref) and status is None:
                continue  # in the engine, state unknown this pass (the query failed)
            if status is not None and status.alive and status.node:
                # not the run that ended (preempted), while the engine still tears it down
                if not status.completing and not _same_run(waits, status):
                    started.append((waits.id, status))
            elif status is not None and status.alive:
                waiting[waits.id] = status.waiting
                if self.burst is not None and status.partition == self.jobs.burst_partition:
                    waiting[waits.id] += f" in the burst partition {status.partition}"
            elif status is not None:
                unseen.append((waits.id, status))  # its engine's job ended between two passes
            elif (waits.not_before or now) <= now:
                submit.append(waits.id)
        for job_id, status in started:
            self._each(job_id, "recording it", partial(self._placed, status=status, now=now))
        for job_id, status in unseen:
            self._each(
                job_id, "accounting for its end", partial(self._ended, status=status, now=now)
            )
        for job_id in submit[:SUBMIT_BATCH]:
            self._each(job_id, f"submitting it to {self.engine}", partial(self._submit, now=now))
        self.scheduler._waiting({j.id: j.waiting_reason for j in queued}, waiting)
        if self.burst is not None and polled is not None:
            try:
                self.burst.pass_(queued, statuses, now)
            except Exception:
                self.log.exception("moving waiting jobs to the burst partition failed; will retry")

    def _each(self, job_id: int, what: str, act: Callable[[JobRow], None]) -> None:
        """``act`` on the job's whole row if it is still queued; its trouble is its own."""
        try:
            row = self.jobs.row(job_id)
            if row is not None and row.state == "queued":
                act(row)
        except Exception:
            self.log.exception("job %s: %s failed; will retry", job_id, what)

    def _watch(self, job: JobRow, now: datetime, status: RunStatus) -> None:
        runner = self.scheduler.runner_files.claims(job.job_dir, fresh=not status.alive)
        if not status.alive:
            # its engine's job is over: as with any backend; back in the queue, it is handed
            # to the engine afresh
            self.scheduler._usage_seen.pop(job.id, None)
            self._runs_seen.pop(job.id, None)
            self.scheduler._finished(job, status, runner, now, ended=True)
            return
        ref = job.backend_ref or {}
        if "run" not in ref and status.node:
            self._adopt(job, status)  # placed by an earlier version: it is this run
            return
        if not status.node or not _same_run(job, status):
            # the engine requeued it (its own preemption, a node failure) and it waits in
            # its queue, or already runs again: give the recorded slice back; the next pass
            # records it where it runs. Not a crash of the runner: the engine's doing.
            runner = self._ended_run(job, self.scheduler.runner_files.claims(job.job_dir, True))
            preempted = runner.get("status") == "preempted" or job.state == "preempting"
            code = EXIT_PREEMPTED if preempted else None
            why = f"{self.engine} requeued it (a preemption or a node failure)"
            saved = runner.get("last_checkpoint_at")
            if runner.get("status") == "preempted" and saved:
                # the checkpoint the run took, named (its step or cell is in the job log)
                when = datetime.fromtimestamp(float(saved), tz=UTC).strftime("%H:%M:%S UTC")
                why += f"; its runner checkpointed (last checkpoint at {when}) and exited"
            self.scheduler._finished(job, RunStatus(False, code), runner, now, outside=why)
            if self.burst is not None and ref.get("burst"):
                self.burst.come_back(job.id, job.priority_class, now)
            else:
                self._waits_since(job.id, now)
            return
        # (a runner that says "preempted" while the engine still runs it is waited for: the
        # engine then either requeues the job or ends it, and that decides)
        if isinstance(runner.get("attempt"), int):
            self._runs_seen[job.id] = runner["attempt"]  # (see _ended_run)
        self.scheduler._progress(job, runner, now)
        self.scheduler._report_usage(job, runner)

    def _ended_run(self, job: JobRow, runner: dict[str, Any]) -> dict[str, Any]:
        """What the run the engine requeued said last. The engine may start the next run
        before a pass sees the requeue (Slurm does within seconds once its hold is lifted),
        and that run's runner overwrites the status at once: its ``preempted_attempt``
        then says the run before it was preempted, with a checkpoint, and its
        ``lost_work_seconds`` are still that run's. Told only of the run this pass last
        saw running (its ``attempt``), or of any when none was seen (after a restart of
        the service)."""
        seen = self._runs_seen.pop(job.id, None)
        preempted = runner.get("preempted_attempt")
        if runner.get("status") == "preempted" or not isinstance(preempted, int):
            return runner
        later = isinstance(runner.get("attempt"), int) and runner["attempt"] > preempted
        if later and (seen is None or seen == preempted):
            return {**runner, "status": "preempted"}
        return runner

    def _adopt(self, job: JobRow, status: RunStatus) -> None:
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.state == job.state:
                ref = {**(row.backend_ref or {}), "node": status.node, "run": status.run}
                row.backend_ref = ref

    def _ended(self, job: JobRow, status: RunStatus, now: datetime) -> None:
        """A queued job's engine job ended between two passes (it ran and finished while
        the service was down, or the engine or an admin ended it): account for that run
        once, from its runner's own record and the engine's exit code."""
        ref = job.backend_ref or {}
        runner = self.scheduler.runner_files.claims(job.job_dir, fresh=True)
        # what this submission's runner said last (Slurm's exit code of a cancelled job
        # says nothing): completed, failed, preempted by an earlier run, or nothing
        said = runner.get("status") if runner.get("attempt_id") == ref.get("attempt_id") else None
        name = ref.get(self.backend.ref_key)
        where = f"its {self.engine} job {name} ended ({status.state or 'gone'})"
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != "queued":
                return
            if said not in ("completed", "failed") and status.state == "CANCELLED":
                transition(s, row, "cancelled", f"{where}: cancelled in {self.engine}")
                return
            transition(s, row, "starting", f"{where} while the service was not looking")
        fresh = self.jobs.row(job.id)
        if fresh is not None:
            code = EXIT_BY_STATUS.get(str(said)) if said else None
            self.scheduler._finished(fresh, RunStatus(False, code), runner, now, ended=True)

    def _placed(self, job: JobRow, status: RunStatus, now: datetime) -> None:
        """The engine started ``job`` on ``status.node``: hold its slices there in the
        ledger."""
        node, run = status.node, status.run
        caller = Caller(job.user, tuple(job.groups or ()), self.backend.name)
        got: list[dict[str, Any]] = []
        why = ""
        # where Slurm runs it, not where gpuslice asked it to (an owner may move their own
        # pending job back): the burst partition's nodes are not this cluster's capacity
        burst = bool(self.burst is not None and status.partition == self.jobs.burst_partition)
        for _ in range(0 if burst else job.slices):
            try:
                got.append(
                    self.jobs.ledger.record_placed(
                        caller,
                        job.profile,
                        node,
                        job_holder(job.id),
                        priority=100 * PRIORITY_CLASSES[job.priority_class],
                        preemptible=job.priority_class == "preemptible",
                    )
                )
            except Refused as e:
                why = e.message
                break
        said = f"{self.engine} started it on {node}"
        if burst:
            # another partition's nodes: capacity bought, not this cluster's
            said += f" in the burst partition {self.jobs.burst_partition}"
        if why:
            # the engine runs it regardless: the external mirror holds what it holds there
            self.jobs.release([g["id"] for g in got], f"job {job.id}: {why}")
            got = []
            said += f"; the ledger could not record it ({why})"
            self.log.warning(
                "job %s runs on %s in %s but the ledger cannot record it (%s): check "
                "the service's hosts against the engine's nodes",
                job.id,
                node,
                self.engine,
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
                # which run of the engine's job this is: a requeued job is the same job again
                ref = {**(row.backend_ref or {}), "node": node, "run": run}
                ref.pop("preempted_by", None)  # that preemption is over
                ref["unrecorded"] = bool(why)  # then the mirror holds it as the engine's
                if burst:
                    # counted as bought when the run ends (states.transition)
                    ref["burst_started_at"] = now.isoformat()
                    ref["burst_milli"] = self._milli(job)
                row.backend_ref = ref
        if row is None:
            self.jobs.release([g["id"] for g in got], f"job {job.id} no longer queued")

    def _submit(self, job: JobRow, now: datetime) -> None:
        try:
            account = self.jobs.account(job.user)
            self.jobs.verify_owner(job, account)
        except AccountError as e:
            self.scheduler._fail(job, str(e), [])
            return
        profile = self.jobs.ledger.profiles.get(job.profile)
        if profile is None:
            self.scheduler._fail(job, f"profile {job.profile} no longer exists", [])
            return
        backend = self.backend
        old = job.backend_ref or {}
        if old.get("unsure"):
            # the last submission timed out: the engine may have queued it all the same
            found = backend.find(job.id, account)
            if found:
                self._submitted(job, {**old, backend.ref_key: found, "unsure": False})
                return
        # names this submission: the engine runs the same job again after a requeue, so
        # every run of it has this id, and a state.json of an earlier submission is never
        # this one's
        attempt = secrets.token_hex(8)
        env = self.scheduler._env(job, [], account)
        env[ATTEMPT_ID] = attempt
        # what the ref would have said, so that a run found later is watched as one: written
        # before the submission too, so that a service that dies while it is made looks for
        # it at its next pass (the engine may have queued it) instead of submitting another
        maybe = {"attempt_id": attempt, "unsure": True, "job_dir": job.job_dir}
        self._submitting(job, {**maybe, "user": account.name})
        try:
            ref = backend.submit(
                job.id,
                job.job_dir,
                env,
                profile,
                job.slices,
                job.priority_class,
                account=account,
                attempt=attempt,
            )
        except SubmitUnsure as e:
            self._retry(job, {**maybe, "user": account.name}, str(e), now)
            return
        except SubmitRefused as e:
            if e.permanent:
                self.scheduler._fail(job, f"{self.engine} refused the job: {e}", [])
            else:  # a limit (MaxSubmitJobs, a quota), the controller busy: try again later
                self._retry(job, {}, f"{self.engine} refused the submission: {e}", now)
            return
        except Exception as e:  # (sbatch missing, ...): said, and tried again with backoff
            self.log.warning("job %s: submitting it to %s failed: %s", job.id, self.engine, e)
            self._retry(job, {}, f"submitting it to {self.engine} failed: {e}", now)
            return
        self._submitted(job, ref)

    def _milli(self, job: JobRow) -> int:
        """The milli-GPUs a run of ``job`` holds (all its slices)."""
        profile = self.jobs.ledger.profiles.get(job.profile)
        if profile is None:
            return 0
        with self.jobs.ledger.db.reading() as s:
            inv = self.jobs.ledger.inventory_cache.get(s)
        return quota_usage(profile, inv).milli * job.slices

    def _waits_since(self, job_id: int, now: datetime) -> None:
        """A requeued job waits from now (burst.py counts its wait from here)."""
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job_id)
            if row is not None and row.state == "queued":
                row.backend_ref = {**(row.backend_ref or {}), "waiting_since": now.isoformat()}

    def _submitting(self, job: JobRow, ref: dict[str, Any]) -> None:
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.state == "queued":
                tries = (row.backend_ref or {}).get("submit_tries")
                row.backend_ref = {**ref, **({"submit_tries": tries} if tries else {})}

    def _submitted(self, job: JobRow, ref: dict[str, Any]) -> None:
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.state == "queued":
                # its wait for this submission starts now (burst.py)
                row.backend_ref = {**ref, "waiting_since": utcnow().isoformat()}
                row.not_before = None
                name = ref[self.backend.ref_key]
                row.waiting_reason = f"submitted to {self.engine} as job {name}"
                return
        # cancelled while it was being submitted
        self.jobs.backend.kill(ref)

    def _retry(self, job: JobRow, ref: dict[str, Any], why: str, now: datetime) -> None:
        """Submit again later, with the crash backoff (doubling, bounded)."""
        tries = int((job.backend_ref or {}).get("submit_tries", 0)) + 1
        delay = min(self.jobs.restart_backoff * 2 ** (tries - 1), self.jobs.restart_backoff_max)
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.state == "queued":
                row.backend_ref = {**ref, "submit_tries": tries}
                row.not_before = now + timedelta(seconds=delay)
                row.waiting_reason = f"{why}; trying again in {delay:g} s"[:1024]


def _same_run(job: Any, status: RunStatus) -> bool:
    """Whether ``status`` is the run of the engine's job recorded last: on the same node
    and not requeued since (Slurm counts its restarts; a Kubernetes Job makes a new pod)."""
    ref = job.backend_ref or {}
    if "run" not in ref:
        return False
    return ref.get("node") == status.node and ref.get("run") == status.run


def _priority_order(queued: list[Any], statuses: dict[int, RunStatus]) -> dict[int, int]:
    """Each waiting job's place among gpuslice's jobs in the engine's queue: by its
    priority (highest first), then submission."""
    waiting = [
        (-(st.priority or 0), job.id)
        for job in queued
        if (st := statuses.get(job.id)) is not None and st.alive and not st.node
    ]
    return {job_id: i + 1 for i, (_, job_id) in enumerate(sorted(waiting))}
