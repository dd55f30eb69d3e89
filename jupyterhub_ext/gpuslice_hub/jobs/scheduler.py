"""The scheduling pass: watch running jobs, requeue or finish them, start queued ones.

Started jobs hold their slices through the ledger (``purpose="batch"``), so quotas,
placement and the interactive servers' view of capacity are the same for both. A job
asking for N slices starts only when all N are allocated; otherwise what it got is
released again in the same pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from prometheus_client import Histogram
from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from gpuslice.vocab import EXIT_COMPLETED, EXIT_FAILED, EXIT_PREEMPTED

from .. import clock
from ..db.jobs_models import JobRow
from ..db.models import utcnow
from ..durations import spoken, work_span
from ..errors import Refused
from ..ledger import Caller
from ..pools import Access
from ..snapshot import NEWEST_EVENT, current_generation
from .accounts import Account, AccountError, job_environment
from .backends.base import PlacedBackend, RunStatus
from .defrag import MOVABLE_STATES, Move, MoveBudget, plan_move
from .delegated import DelegatedPass
from .holder import job_holder
from .job_writes import write_job
from .manager import CURRENT_ROW, JobManager
from .ordering import queue_order
from .queue_cache import NEWEST_TRANSITION, QueueCache
from .recovery import LAUNCHING, recover
from .refusals import KeptRefusals
from .reservation import Reservation, reserve
from .row_cache import RowCache
from .runner_files import RunnerFiles
from .runner_state import ATTEMPT_ID
from .states import ACTIVE, PRIORITY_CLASSES, TERMINAL, advance, transition
from .victims import pick_victim
from .watchlist import WatchList

JOBS = cast(Table, JobRow.__table__)
# The queue is tried again at least this often when nothing changed (_queue_may_move)
FULL_PASS_SECONDS = 60.0
WAITING_REASON = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("job_id"), JOBS.c.state == "queued")
    .values(waiting_reason=bindparam("reason"))
)
# A job no move was found for is looked at again after this long (a plan looks at every
# host with preemptible jobs: not on every pass)
DEFRAG_RETRY = timedelta(minutes=5)
# Waiting reasons written per transaction: short enough that a spawn waiting for the
# ledger lock meanwhile is not held up noticeably.
WAITING_BATCH = 500


class Scheduler:
    def __init__(self, jobs: JobManager, simulated: bool = False) -> None:
        self.jobs = jobs
        self.simulated = simulated
        self.log = jobs.log
        # job id -> the runner's last utilization_at passed on to the ledger
        self._usage_seen: dict[int, str] = {}
        # job id -> (row, runner claims, until when): a running job's row and claims that a
        # pass found nothing to write for (by identity: RowCache and RunnerFiles answer the
        # same objects while nothing changed), until a time-bound check could turn
        self._quiet: dict[int, tuple[Any, dict[str, Any], datetime]] = {}
        # the pass when the backend queues and places the jobs itself (Slurm)
        self._delegated: DelegatedPass | None = None
        # what the queue was last tried against (_queue_may_move), and when a waiting
        # job's backoff ends next
        self._marker: tuple[Any, ...] | None = None
        self._full_at: datetime | None = None
        self._next_due: datetime | None = None
        self.runner_files = RunnerFiles()
        self.queue = QueueCache()
        # capacity refusals that still stand (refusals.py): a blocked shape is not tried
        # again until something it depends on could have changed
        self.refusals = KeptRefusals(FULL_PASS_SECONDS)
        # the active jobs' rows, kept between passes (row_cache.py)
        self.active = RowCache(tuple(JOBS.c), JOBS.c.state.in_(ACTIVE))
        self._refs: list[dict[str, Any]] | None = None  # their backend refs, as last read
        # which of them a pass looks at, where the backend names the runs that changed
        self.watchlist = WatchList()
        # defragmentation (defrag.py): the moves under way, by the waiting job they make
        # room for, with when each gives up; when a plan was last looked for, per job
        self.moves: dict[int, tuple[Move, datetime]] = {}
        self._planned: dict[int, datetime] = {}
        self.budget = MoveBudget(jobs.defragment_moves_per_hour)
        # set by the service: each pass's duration, for /metrics
        self.pass_seconds: Histogram | None = None

    async def run_forever(self) -> None:
        try:
            # before the first pass: what a service that stopped mid-operation left undone
            await asyncio.to_thread(recover, self.jobs)
        except Exception:
            self.log.exception("putting right what the last run of the service left undone failed")
        while True:
            try:
                # In a worker thread: a pass reads job folders, asks the backend (Slurm
                # forks) and places jobs; the event loop keeps serving spawns meanwhile.
                # Ledger writes from both sides are serialized by the ledger lock.
                # real seconds spent, not the service's clock (a simulator moves that one)
                started = time.perf_counter()
                try:
                    await asyncio.to_thread(self.tick)
                finally:  # a pass that failed took its time too
                    if self.pass_seconds is not None:
                        self.pass_seconds.observe(time.perf_counter() - started)
            except Exception:
                self.log.exception("job scheduler pass failed; will retry")
            await self.jobs.wake.wait(self.jobs.schedule_interval)

    def tick(self, now: datetime | None = None) -> None:
        now = now or utcnow()
        if self.jobs.kills_pending:
            self.jobs.retry_kills()
        if self.jobs.delegated:
            self._delegated = self._delegated or DelegatedPass(self)
            self._delegated.tick(now)
            return
        with self.jobs.db.reading() as s:
            # Rows, not ORM objects (loading hundreds of those cost more than the rest of
            # a pass), read again only where they changed: the pass only reads them; its
            # writes get the row again.
            active = cast(list[JobRow], self.active.read(s.connection()))
        changed_jobs = getattr(self.jobs.backend, "changed_jobs", None)
        changed = changed_jobs() if changed_jobs is not None else None
        some = self.watchlist.to_look_at(active, self.active.fresh, changed, now)
        if some is not None:
            seen, refs = some, [job.backend_ref or {} for job in some]
            if not self.active.unchanged:
                self._refs = None  # (built again by the next pass that asks about all)
        else:
            if not self.active.unchanged or self._refs is None:
                self._refs = [job.backend_ref or {} for job in active]
            seen, refs = active, self._refs
        try:
            # one question to the backend for all of them (Slurm: one squeue, not a fork each)
            statuses = self.jobs.backend.poll_many(refs)
        except Exception:
            self.log.exception(
                "the %s backend could not be asked about its runs", self.jobs.backend.name
            )
            statuses = None
        if self.active.left:  # (only then is there anything to forget)
            self.keep_watching(active)
        quiet = self._quiet
        looked: set[int] = set()
        for job, status in zip(seen, statuses or (), strict=False):
            if status.files_unchanged and status.alive:
                q = quiet.get(job.id)
                if (
                    q is not None
                    and q[0] is job
                    and now < q[2]
                    and self.runner_files.answers(job.job_dir, q[1])
                ):
                    # Its folder unwritten (the backend vouches), the same row, before any
                    # time-bound check: what the last look found (nothing to write) holds.
                    continue
            looked.add(job.id)
            try:
                self._watch(job, now, status)
            except Exception:
                # one job's trouble (its folder, its backend) never stops the others' pass
                self.log.exception("job %s: watching it failed; will retry", job.id)
        # (kept only where the backend names the runs that changed; a pass whose backend
        # did not answer looked at none, and leaves the next one to look at all)
        if changed is not None and statuses is not None:
            self.watchlist.looked(seen, looked, quiet, now, every=some is None)
        self._close_windows(active, now)
        self._return_borrowed(active, now)
        self._expire_reservations(now)
        if not self._freed_for_a_server():
            with self.jobs.db.reading() as s:
                marker = self._queue_may_move(s, now)
                # the queue in the same transaction, read only when it may move
                queued = None if marker is None else self._read_queue(s, marker)
            if marker is not None and queued is not None:  # (None exactly when marker is)
                self._start_queued(now, queued, active)
                # only once the pass went through: one that failed is tried again
                self._marker, self._full_at = marker, now

    def keep_watching(self, active: list[Any]) -> None:
        """Forget what was kept of the jobs no longer watched (their runner files, their
        quiet memo): only ``active`` are watched from now on."""
        self.runner_files.keep({job.job_dir for job in active})
        if len(self._quiet) > len(active):
            ids = {job.id for job in active}
            self._quiet = {i: q for i, q in self._quiet.items() if i in ids}

    def _queue_may_move(self, s: Session, now: datetime) -> tuple[Any, ...] | None:
        """The state to try the queue against, or None when trying it again could start or
        preempt nothing. It can only after a change (a slice given back or taken, an admin's
        setting, a job submitted, finished or requeued: each writes an event or a job
        transition), when a backoff ends, and it is tried at least every
        ``FULL_PASS_SECONDS``. A pass over a queue nothing changed for decides what the last
        one did, at the cost of reading and ordering the whole queue."""
        conn = s.connection()
        marker = (
            NEWEST_EVENT.execute(conn).scalar(),
            NEWEST_TRANSITION.execute(conn).scalar(),
            current_generation(s),
        )
        due = self._next_due is not None and now >= self._next_due
        stale = self._full_at is None or (now - self._full_at).total_seconds() >= FULL_PASS_SECONDS
        if marker == self._marker and not due and not stale:
            return None
        bound = self.jobs.ledger.effective_quotas(s).bounded
        self.refusals.check(conn, marker[0], marker[2], now, quotas_bound=bound)
        # read before the pass: what it writes itself makes the next pass look again
        return marker

    def _keeps_refusals(self) -> bool:
        """A refusal is kept where nothing but an event or a generation changes its answer
        and its message: not where overcommit places a share by its holder's usage history
        (read again every few minutes, with no event), nor where the message counts what is
        free in reserved pools. There, too, a job is first tried against the ledger as the
        pass saw it (``refusal_as_kept``): most tries find no room, and a change since makes
        the next pass try again."""
        ledger = self.jobs.ledger
        return not ledger.overcommit.settings.on and (
            ledger.pools is None or not ledger.pools.reserved
        )

    def _read_queue(self, s: Session, marker: tuple[Any, ...]) -> list[Any]:
        """The queued jobs, in ``s`` (the transaction ``marker`` was read in): the columns
        a decision needs, read again only for the jobs that changed (QueueCache); the row
        is read in full for the few that start. With them, the ledger's kept state brought
        up to date for the pass's tries (``refusal_as_kept``)."""
        queued = self.queue.read(s, newest=marker[1])
        if self._keeps_refusals():
            self.jobs.ledger.catch_up(s, newest_event=marker[0])
        return queued

    # -- running jobs ---------------------------------------------------------------------

    def _watch(self, job: JobRow, now: datetime, status: RunStatus) -> None:
        # a run that ended is read afresh: its runner's last words decide how it ends
        runner = self.runner_files.claims(
            job.job_dir, fresh=not status.alive, unchanged=status.files_unchanged
        )
        if status.alive:
            self._progress(job, runner, now)
            self._report_usage(job, runner)
            return
        self._usage_seen.pop(job.id, None)
        self._quiet.pop(job.id, None)
        self._finished(job, status, runner, now)

    def _report_usage(self, job: JobRow, runner: dict[str, Any]) -> None:
        """Pass the runner's newest utilization figure to the ledger (admin panel), once."""
        at = runner.get("utilization_at")
        if not at or self._usage_seen.get(job.id) == at or job.state not in ("running",):
            return
        self._usage_seen[job.id] = str(at)
        util, memory = runner.get("utilization"), runner.get("memory_mib")
        interval = runner.get("utilization_interval", 0.0)
        for alloc_id in job.allocation_ids or []:
            self.jobs.ledger.record_usage(int(alloc_id), util, memory, 0.0, interval)

    def _progress(self, job: JobRow, runner: dict[str, Any], now: datetime) -> None:
        quiet = self._quiet.get(job.id)
        if quiet is not None and quiet[0] is job and quiet[1] is runner and now < quiet[2]:
            # The same row and the same claims as a pass that found nothing to write, before
            # any time-bound check could turn: nothing to write again (a pass over 1 000
            # running jobs compared each one's progress field by field to learn that).
            return
        over_time = self._runtime(job, now) > job.max_runtime
        deadline = job.preempt_deadline
        if (
            not _progress_changed(job, runner)
            and not (job.state == "starting" and self._this_attempt(job, runner, "running"))
            and not (over_time and job.state in ("running", "preempting"))
        ):
            # Nothing to write: a pass over 1 000 running jobs made 1 000 write
            # transactions (each reading the row and its history again) to change nothing.
            self._grace_over(job, now, deadline)
            self._quiet[job.id] = (job, runner, self._quiet_until(job, runner, now))
            return
        self._quiet.pop(job.id, None)
        if not (over_time and job.state in ("running", "preempting")):
            self._record_progress(job, runner)
            self._grace_over(job, now, deadline)
            return
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != job.state:
                return
            _copy_progress(row, runner)
            transition(s, row, "timed-out", f"ran past its max runtime {job.max_runtime:g}s")
            row.run_seconds += self._attempt_seconds(job, now)
            allocs, row.allocation_ids = list(row.allocation_ids or []), []
        # (the runner is killed, and says nothing more: the log says why it stops here)
        self.jobs.log_line(
            job, f"timed out: ran past its max runtime of {spoken(job.max_runtime)}; stopping it"
        )
        # (a run in a burst partition, or one the ledger could not record, holds no
        # allocation here but runs all the same)
        self.jobs.backend.kill(job.backend_ref or {})
        self.jobs.release(allocs, f"job {job.id} timed out")

    def _reap(self, job: JobRow) -> None:
        """The run ended: what it left running (its kernel, processes its code started)
        goes before its slice does, or they would use the GPU its next holder is given.
        Only a backend whose runs are plain processes needs this (local); an engine's
        cgroups end a job's processes with it."""
        reap = getattr(self.jobs.backend, "reap", None)
        if reap is None:
            return
        left = reap(job.backend_ref or {})
        if left:
            self.jobs.log_line(
                job, f"stopped {left} process(es) the run left running, which held its GPU"
            )

    def _record_progress(self, job: JobRow, runner: dict[str, Any]) -> None:
        """Write what the runner says of its progress, and that it runs when it says so,
        in statements (no ORM object: they are most of a pass's writes)."""
        with self.jobs.db.writing() as s:
            if job.state == "starting" and self._this_attempt(job, runner, "running"):

                def progress(row: Any) -> dict[str, Any] | None:
                    running = self._this_attempt(row, runner, "running")
                    return _progress_fields(row, runner) if running else None

                said = f"runner started (attempt {runner.get('attempt')})"
                if advance(s, job, "running", said, progress):
                    return
            fields = _progress_fields(job, runner)
            if fields:  # (only where it is still in the state it was seen in)
                write_job(s.connection(), job.id, fields, state=job.state)

    def _quiet_until(self, job: JobRow, runner: dict[str, Any], now: datetime) -> datetime:
        """Until when ``_progress`` of this same row and claims has nothing to write: its
        max runtime running out is the only check that can turn with time (a checkpoint
        time ahead of the clock turns too: such a job is asked again at the next pass, as
        is a job in another state, a preempting one's grace period included)."""
        if job.state not in ("starting", "running") or job.attempt_started_at is None:
            return now
        # (a limit decades away is as good as none, and stays within what a datetime holds)
        left = min(job.max_runtime - job.run_seconds, 1e9)
        until = job.attempt_started_at + timedelta(seconds=left)
        saved = runner.get("last_checkpoint_at", 0.0)
        if saved and saved > clock.timestamp():
            return now  # _progress_fields caps it at now: it changes as time passes
        return until

    def _grace_over(self, job: JobRow, now: datetime, deadline: datetime | None) -> None:
        """A preempted job still running after its grace period is killed."""
        if job.state == "preempting" and deadline is not None and now >= deadline:
            if (job.backend_ref or {}).get("preempted_by") and self.jobs.delegated:
                self._engine_did_not_preempt(job, now)
                return
            self.jobs.log_line(job, "grace period over: killing the runner")
            self.jobs.backend.kill(job.backend_ref or {})

    def _engine_did_not_preempt(self, job: JobRow, now: datetime) -> None:
        """The interactive server that needed this job's slice did not get the engine to
        preempt it within the grace period (its partition, QOS or pod priority may not
        preempt this one's, or the spawn gave up): the service asks the job to checkpoint
        and stop itself."""
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != "preempting":
                return
            ref = dict(row.backend_ref or {})
            ref.pop("preempted_by", None)
            row.backend_ref = ref
            row.preempt_deadline = now + timedelta(seconds=self.jobs.preempt_grace)
        self.jobs.log_line(
            job,
            f"{self.jobs.queueing.engine} did not preempt it within the grace period: asking it "
            "to checkpoint",
        )
        self.jobs.backend.signal_preempt(ref)

    @staticmethod
    def _this_attempt(row: JobRow, runner: dict[str, Any], status: str) -> bool:
        """The runner of the current attempt says ``status``: a state.json left by an
        earlier attempt does not count. (Slurm may start the same script again after its own
        requeue: the id is the same then, and so is the job's attempt for the service.)"""
        attempt = (row.backend_ref or {}).get("attempt_id")
        return runner.get("status") == status and runner.get("attempt_id") == attempt

    def _finished(
        self,
        job: JobRow,
        status: RunStatus,
        runner: dict[str, Any],
        now: datetime,
        outside: str = "",
        ended: bool = False,
    ) -> None:
        """The run stopped: the job completed, failed, or goes back to the queue.
        ``outside``: the backend requeued the run itself (Slurm: a preemption, a node
        failure), which is no crash of the runner. ``ended``: the backend's own job is over
        (Slurm): a job put back in the queue is handed to the backend afresh."""
        code = status.exit_code
        attempt = self._attempt_seconds(job, now)
        allocs: list[int] = []
        self._reap(job)
        if code == EXIT_COMPLETED:  # (most runs: in statements, see ``advance``)

            def ending(row: Any) -> dict[str, Any]:
                allocs[:] = row.allocation_ids or []
                fields = _progress_fields(row, runner)
                return {**fields, "run_seconds": row.run_seconds + attempt, "allocation_ids": []}

            with self.jobs.db.writing() as s:
                if not advance(s, job, "completed", "all cells ran", ending):
                    return
            self.jobs.release(allocs, f"job {job.id} stopped")
            self.jobs.wake.set()
            return
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is None or row.state != job.state:
                return
            _copy_progress(row, runner)
            row.run_seconds += attempt
            allocs, row.allocation_ids = list(row.allocation_ids or []), []
            if code == EXIT_FAILED:
                row.error = str(runner.get("error") or "the runner exited with status 1")
                transition(s, row, "failed", row.error)
            elif status.state == "CANCELLED" and row.state != "preempting":
                # Cancelled in the engine by someone else than gpuslice (scancel): the runner
                # took the signal for a preemption and exited so, but nothing requeues the
                # run there, and a requeue here would resubmit what its owner or an admin
                # stopped, again and again.
                engine = getattr(self.jobs.backend, "engine", self.jobs.backend.name)
                transition(s, row, "cancelled", f"cancelled in {engine}, outside gpuslice")
            elif code == EXIT_PREEMPTED or row.state == "preempting" or outside:
                self._requeue_preempted(s, row, runner, now, code, outside)
            else:
                self._requeue_crashed(s, row, runner, now, code)
            if ended and row.state == "queued":
                row.backend_ref = {**(row.backend_ref or {}), "ended": True}
        self.jobs.release(allocs, f"job {job.id} stopped")
        self.jobs.wake.set()

    def _requeue_preempted(
        self,
        s: Any,
        row: JobRow,
        runner: dict[str, Any],
        now: datetime,
        code: int | None,
        outside: str = "",
    ) -> None:
        if row.state != "preempting":
            # preempted from outside (Slurm, an admin's kill -TERM): record it the same way
            transition(s, row, "preempting", outside or "the runner was signalled by its backend")
            row.preemptions += 1
        if code == EXIT_PREEMPTED:
            # the runner's own figure, but never more than this attempt ran
            lost = min(runner.get("lost_work_seconds", 0.0), self._attempt_seconds(row, now))
            how = "checkpointed and exited"
        else:
            lost = self._unsaved(row, runner, now)
            deadline = row.preempt_deadline
            if outside:
                how = "stopped without a checkpoint"
            elif deadline is not None and now < deadline:
                # (not the service's kill, which comes only once the grace is over)
                how = "stopped without a checkpoint before its grace period ended"
            else:
                how = f"killed after its {spoken(self.jobs.preempt_grace)} grace period"
        row.lost_work_seconds += lost
        transition(s, row, "preempted", f"{how}; {work_span(lost)} of work to redo")
        # (not a restart: ``restarts`` counts the runs after a runner died, as the docs and
        # ``max_restarts`` do; a preemption is counted in ``preemptions``)
        row.preempt_deadline = None
        transition(s, row, "queued", "requeued after preemption")

    def _requeue_crashed(
        self, s: Any, row: JobRow, runner: dict[str, Any], now: datetime, code: int | None
    ) -> None:
        crashes = row.restarts + 1
        what = f"the runner exited unexpectedly ({'killed' if code is None else code})"
        if crashes > self.jobs.max_restarts:
            row.error = f"{what}; gave up after {self.jobs.max_restarts} restarts"
            transition(s, row, "failed", row.error)
            return
        lost = self._unsaved(row, runner, now)
        row.lost_work_seconds += lost
        row.restarts += 1
        backoff = min(self.jobs.restart_backoff * 2 ** (crashes - 1), self.jobs.restart_backoff_max)
        row.not_before = now + timedelta(seconds=backoff)
        transition(s, row, "queued", f"{what}; requeued in {backoff:g}s")

    def _unsaved(self, row: JobRow, runner: dict[str, Any], now: datetime) -> float:
        started = row.attempt_started_at or now
        # (the runner's claims include the checkpoint library's last save: RunnerFiles)
        safe = max(started.timestamp(), float(runner.get("last_checkpoint_at") or 0))
        return max(0.0, now.timestamp() - safe)

    def _attempt_seconds(self, job: JobRow, now: datetime) -> float:
        started = job.attempt_started_at
        return (now - started).total_seconds() if started else 0.0

    def _runtime(self, job: JobRow, now: datetime) -> float:
        return job.run_seconds + self._attempt_seconds(job, now)

    # -- queued jobs ----------------------------------------------------------------------

    def _close_windows(self, active: list[JobRow], now: datetime) -> None:
        """Checkpoint and requeue the running jobs whose time window closed (a job whose
        window is no longer configured runs at any time)."""
        if not self.jobs.windows:  # (no window configured: nothing to look at, each pass)
            return
        for job in active:
            window = self.jobs.windows.get(job.time_window) if job.time_window else None
            if window is None or job.state not in ("starting", "running") or window.is_open(now):
                continue
            # (Refused: it ended or was preempted meanwhile, nothing to close)
            with contextlib.suppress(Refused):
                self.jobs.preempt(job.id, "scheduler", f"its time window {window.name!r} closed")

    def _return_borrowed(self, active: list[JobRow], now: datetime) -> None:
        """Outside the borrowing window, checkpoint and requeue the jobs holding slices of
        a reserved pool they only borrowed (split pools): people find the pool whole."""
        pools = self.jobs.pools
        if pools is None or pools.borrowing_open(now):
            return
        # only preemptible jobs borrow; another job in a reserved pool got there before the
        # pools were configured, and is not preemptible: it keeps its slices
        running = [
            j
            for j in active
            if j.state in ("starting", "running")
            and j.allocation_ids
            and j.priority_class == "preemptible"
        ]
        if not running:
            return
        where = self._pools_held()
        for job in running:
            held = {p for a in job.allocation_ids or [] for p in where.get(int(a), ())}
            rank = 100 * PRIORITY_CLASSES[job.priority_class]
            borrowed = pools.borrowed(job.groups or (), rank, held)
            if not borrowed:
                continue
            window = pools.borrow_window
            why = (
                f"its borrowing window {window.describe()} closed"
                if window is not None
                else "batch jobs do not borrow it"
            )
            with contextlib.suppress(Refused):
                self.jobs.preempt(
                    job.id,
                    "scheduler",
                    f"the reserved pool {', '.join(sorted(borrowed))} is returned to "
                    f"interactive use: {why}",
                )

    def _pools_held(self) -> dict[int, set[str]]:
        """Allocation id -> the pools its GPUs are in."""
        pools = self.jobs.pools
        assert pools is not None
        _hosts, _gpus, active = self.jobs.ledger.snapshot()
        return {
            a.id: {pools.pool_of(a.host, c.gpu_uuid) for c in a.claims if c.active}
            for a in active
            if a.purpose == "batch"
        }

    def _freed_for_a_server(self) -> bool:
        """Whether a slice freed for a waiting interactive server is free now. Only then
        must queued jobs wait: while the preempted job still checkpoints, its slice is not
        free, and other jobs may take other free capacity."""
        for res in list(self.jobs.reservations.values()):
            row = self.jobs.current(res.job_id)
            if row is None or row.state not in ACTIVE:
                return True
        return False

    def _expire_reservations(self, now: datetime) -> None:
        """Forget the reservations of servers that got their slice, and those past their
        time."""
        if not self.jobs.reservations:
            return
        # (the ledger's kept active allocations: not a query of each user's allocations)
        _hosts, _gpus, active = self.jobs.ledger.snapshot()
        served = {(a.user, a.server_name) for a in active if a.purpose == "interactive"}
        for key, res in list(self.jobs.reservations.items()):
            if key in served or now >= res.expires:
                self.jobs.reservations.pop(key, None)

    def _start_queued(self, now: datetime, queued: list[Any], running: Sequence[Any] = ()) -> None:
        """Start what fits, in queue order; behind a job that does not fit, what does not
        delay it (``running``: the jobs holding slices, whose ends it waits for; see
        reservation.py).

        A pass costs in proportion to the shapes that are blocked, not to the queue: the pass
        itself frees nothing, so a refusal holds for every later job of the same shape (no
        capacity: the same profile and width; a quota or group refusal: the same user too),
        which is told the same reason without another attempt. A slice a server gives back
        meanwhile is seen by the next pass. Reasons are written at the end, in batches, only
        where they changed.
        """
        keep_refusals = self._keeps_refusals()
        due = [j for j in queued if (j.not_before or now) <= now]
        later = [j.not_before for j in queued if j.not_before is not None and j.not_before > now]
        reasons: dict[int, str] = {}
        # jobs whose time window is closed wait for it, whatever else is free
        ready = []
        # when each window opens, worked out once a pass (not once per job of thousands)
        opening: dict[str, datetime | None] = {
            name: w.opens_at(now) for name, w in self.jobs.windows.items()
        }
        for j in due:
            window = self.jobs.windows.get(j.time_window) if j.time_window else None
            opens = opening[window.name] if window is not None else None
            if window is None or opens is None:
                ready.append(j)
                continue
            later.append(opens)
            reasons[j.id] = (
                f"waits for its time window {window.name!r}, {window.describe()}, "
                f"which opens {opens:%a %Y-%m-%d %H:%M %Z}"
            )
        pools = self.jobs.pools
        may_borrow = pools is not None and pools.borrowing_open(now)
        if pools is not None and pools.borrow_window is not None and not may_borrow:
            # preemptible jobs may borrow from then on: try the queue again when it opens
            opens = pools.borrow_window.opens_at(now)
            if opens is not None and any(j.priority_class == "preemptible" for j in ready):
                later.append(opens)
        self._next_due = min(later, default=None)
        # the pools of the jobs blocked so far (None: the whole cluster): a later job that
        # wants capacity in them waits behind them (split pools: one in other pools need
        # not). A set: thousands of blocked jobs wait for a handful of different pools.
        blocked: set[frozenset[str] | None] = set()
        # the first blocked job of each of those pools: its reservation (reservation.py)
        reserved: dict[frozenset[str] | None, tuple[Reservation, int, str]] = {}
        refused: dict[tuple[Any, ...], Refused] = {}
        moving = self._moves_under_way(ready, now)
        planned: set[tuple[Any, ...]] = set()
        preempted_for: set[tuple[Any, ...]] = set()
        ordered = queue_order(ready, now, self.jobs.aging_seconds)
        # The plan's order: the job whose room is made takes it first, then the jobs moved
        # for it go where the plan found room for them, then the rest (stable sort).
        if moving:  # (a sort of the whole queue again: only while a move is under way)
            came_back = {
                i for j, st in moving.items() if st == "ready" for i in self.moves[j][0].jobs
            }
            ordered.sort(
                key=lambda j: 0 if moving.get(j.id) == "ready" else 1 if j.id in came_back else 2
            )
        for job in ordered:
            rank = PRIORITY_CLASSES[job.priority_class]
            if moving.get(job.id) == "moving":
                move, _until = self.moves[job.id]
                reasons[job.id] = (
                    f"waits for {len(move.jobs)} preemptible job(s) to move off {move.host}: "
                    "the free capacity it needs is split across GPUs"
                )
                blocked.add(self._widest(job, may_borrow))
                continue
            # A job is one request, however many passes it waits: a learning placement policy
            # counts it on the first pass that considers it (tried or not), never again.
            first = job.waiting_reason is None
            borrow = may_borrow and job.priority_class == "preemptible"
            access = self.jobs.ledger.access("batch", job.groups or (), 100 * rank, borrow)
            widest = access.widest if access is not None else None
            only = None
            # Behind a blocked job, a job may start where it does not delay it: in pools no
            # blocked job waits for (split pools), or by the blocked jobs' reservations
            # (EASY backfill, reservation.py). A preemptible job may always, behind a job
            # that may preempt it: its room is taken back when that one needs it.
            holding: list[tuple[Reservation, tuple[bool, Any]]] = []
            if blocked:
                left = _left_over(widest, blocked)
                if left:
                    only = left
                    if access is not None:
                        access = access.within(only)
                    widest = only
                else:
                    holding = self._reservations_over(job, widest, reserved, now)
                    held = next((r for r, (ok, _trial) in holding if not ok), None)
                    if held is not None:
                        reasons[job.id] = reserved_reason(held, reserved)
                        if first:
                            self.jobs.ledger.observe(job.profile)
                        continue
            # jobs that may use different pools are blocked apart (split pools)
            shape = (job.profile, job.slices, access.tries if access else None)
            # (the user's own key only where the shape is not refused already: behind a
            # blocked shape thousands of jobs need no more than the first lookup)
            refusal = refused.get(shape)
            mine = (job.user, tuple(sorted(job.groups or ())), *shape) if refusal is None else ()
            refusal = refusal or refused.get(mine)
            granted = None
            if refusal is None:
                # no job takes the room being made for another (people may: they come first)
                avoid = frozenset(m.host for i, (m, _) in self.moves.items() if i != job.id)
                kept = (*mine, avoid)
                refusal = self.refusals.get(kept)
                if refusal is not None:  # nothing it depends on changed since it was given
                    refused[shape] = refusal
                    if first:
                        self.jobs.ledger.observe(job.profile)
                else:
                    granted, refusal = self._allocate(
                        job, first, access, borrow, only, avoid, as_kept=keep_refusals
                    )
                    if refusal is not None:
                        capacity = refusal.code == "no_capacity"
                        refused[shape if capacity else mine] = refusal
                        if capacity and keep_refusals:
                            self.refusals.keep(kept, refusal)
            elif first:
                self.jobs.ledger.observe(job.profile)
            if refusal is not None:
                reasons[job.id] = refusal.message
                if refusal.code == "no_capacity":
                    if widest not in reserved and not any(
                        _overlap(widest, key) for key in reserved
                    ):
                        # the first job these pools cannot take: it gets a reservation
                        head = reserve(
                            self.jobs.ledger,
                            job,
                            access,
                            running,
                            now,
                            self.jobs.hold_for_after,
                        )
                        reserved[widest] = (head, rank, _job_name(job))
                    blocked.add(widest)
                    # one plan per blocked shape a pass: it looks at every movable job
                    moved = ""
                    if shape not in planned:
                        planned.add(shape)
                        moved = self._defragment(job, access, now)
                    if moved:
                        reasons[job.id] = moved
                    elif rank > 0 and shape not in preempted_for:
                        # (once a shape a pass too: a preemption for the first frees what
                        # the next pass gives the first in the queue)
                        preempted_for.add(shape)
                        self._preempt_for(job, rank, access)
                continue
            assert granted is not None
            for reservation, (_ok, trial) in holding:
                reservation.commit(trial)  # it holds this room past the reservation
            self.moves.pop(job.id, None)
            self._start(job, granted, now)
        self._waiting({j.id: j.waiting_reason for j in due}, reasons)

    def _reservations_over(
        self,
        job: Any,
        widest: frozenset[str] | None,
        reserved: dict[frozenset[str] | None, tuple[Reservation, int, str]],
        now: datetime,
    ) -> list[tuple[Reservation, tuple[bool, Any]]]:
        """The reservations ``job`` must not delay (those over pools it may use), each
        with what ``Reservation.allows`` says of it. A preemptible job behind a head that
        may preempt it delays nobody."""
        rank = PRIORITY_CLASSES[job.priority_class]
        request = None
        out: list[tuple[Reservation, tuple[bool, Any]]] = []
        for key, (reservation, head_rank, _name) in reserved.items():
            if not _overlap(widest, key) or head_rank > rank == 0:
                continue
            if reservation.start is None:
                # (what the job is and how long it runs matter not: thousands of queued
                # jobs are told as cheaply, see Reservation.allows)
                out.append((reservation, reservation.allows(None, 0, now)))
                continue
            if request is None:
                profile = self.jobs.ledger.profiles.get(job.profile)
                if profile is None:  # (a profile no longer configured: the ledger says so)
                    return []
                request = self.jobs.ledger.request_for(job.user, profile, "batch", False)
            left = max(float(job.max_runtime) - float(job.run_seconds or 0.0), 0.0)
            ends = now + timedelta(seconds=min(left, 1e9))
            out.append((reservation, reservation.allows(request, job.slices, ends)))
        return out

    def _allocate(
        self,
        job: Any,
        learn: bool = True,
        access: Access | None = None,
        borrow: bool = False,
        only: frozenset[str] | None = None,
        avoid: frozenset[str] = frozenset(),
        as_kept: bool = False,
    ) -> tuple[list[dict[str, Any]], None] | tuple[None, Refused]:
        """The job's slices, or why not. ``as_kept``: a one-slice job is first tried
        against the ledger's kept state (``refusal_as_kept``), which the pass brought up to
        date when it began."""
        caller = Caller(job.user, tuple(job.groups or ()), "scheduler")
        priority = 100 * PRIORITY_CLASSES[job.priority_class]
        if as_kept and job.slices == 1:
            refused = self.jobs.ledger.refusal_as_kept(
                caller, job.profile, "batch", priority, borrow, only, avoid
            )
            if refused is not None:
                if learn:
                    self.jobs.ledger.observe(job.profile)
                return None, refused
        if job.slices > 1:
            # Cheap check first: allocating and releasing part of a wide job every pass
            # would fill the audit trail.
            widest = access.widest if access is not None else None
            free = self.jobs.ledger.profile_capacity(widest)[job.profile][0]
            if free < job.slices:
                if learn:
                    self.jobs.ledger.observe(job.profile)
                message = f"No {job.slices} {job.profile} slices free at once ({free} free)"
                return None, Refused("no_capacity", message)
        got: list[dict[str, Any]] = []
        for _ in range(job.slices):
            try:
                alloc, _created = self.jobs.ledger.allocate(
                    caller,
                    job.profile,
                    job_holder(job.id),
                    purpose="batch",
                    priority=priority,
                    preemptible=job.priority_class == "preemptible",
                    quiet=True,
                    # a wide job's slices are one request
                    learn=learn and not got,
                    may_borrow=borrow,
                    only=only,
                    avoid=avoid,
                )
            except Refused as e:
                self.jobs.release(
                    [a["id"] for a in got], f"job {job.id} got {len(got)} of {job.slices} slices"
                )
                return None, e
            got.append(alloc)
        return got, None

    def _widest(self, job: Any, may_borrow: bool) -> frozenset[str] | None:
        rank = 100 * PRIORITY_CLASSES[job.priority_class]
        borrow = may_borrow and job.priority_class == "preemptible"
        access = self.jobs.ledger.access("batch", job.groups or (), rank, borrow)
        return access.widest if access is not None else None

    def _moves_under_way(self, ready: list[Any], now: datetime) -> dict[int, str]:
        """Queued job id -> "moving" (the jobs making room for it still hold it) or "ready"
        (they are gone: it goes first). Moves whose job left the queue, or that did not
        complete in time, are dropped."""
        queued = {j.id for j in ready}
        for job_id in self._planned.keys() - queued:
            del self._planned[job_id]
        out: dict[int, str] = {}
        for job_id, (move, until) in list(self.moves.items()):
            if job_id not in queued or now >= until:
                self.moves.pop(job_id, None)
                continue
            rows = [self.jobs.current(i) for i in move.jobs]
            # done once every moved job has given back what the plan freed (one that
            # checkpointed first and started again elsewhere is done too)
            still = any(
                row is not None
                and (row.state == "preempting" or move.freed & set(row.allocation_ids or []))
                for row in rows
            )
            out[job_id] = "moving" if still else "ready"
        return out

    def _defragment(self, job: Any, access: Access | None, now: datetime) -> str:
        """Move the fewest preemptible jobs that make room for ``job`` (defrag.py), within
        the hourly budget; the waiting reason it then has, or "" when nothing moves."""
        left = self.budget.left(now)
        last = self._planned.get(job.id)
        if (
            not left
            or job.slices != 1
            # one move at a time: two plans under way would count on the same free places
            or self.moves
            or (last and now - last < DEFRAG_RETRY)
        ):
            return ""
        self._planned[job.id] = now
        profile = self.jobs.ledger.profiles[job.profile]
        with self.jobs.db.reading() as s:
            # not a job that (re)started lately: it would be moved again and again
            candidates = list(
                s.connection().execute(
                    select(JOBS).where(
                        JOBS.c.state.in_(MOVABLE_STATES),
                        JOBS.c.priority_class == "preemptible",
                        JOBS.c.attempt_started_at <= now - DEFRAG_RETRY,
                    )
                )
            )

        pools = self.jobs.pools
        window_open = pools is not None and pools.borrowing_open(now)

        def access_of(other: Any) -> Access | None:
            # where a moved job may go again: its own pools (a preemptible one borrows too
            # while the borrowing window is open)
            rank = 100 * PRIORITY_CLASSES[other.priority_class]
            borrows = window_open and other.priority_class == "preemptible"
            return self.jobs.ledger.access("batch", other.groups or (), rank, borrows)

        move = plan_move(
            self.jobs.ledger,
            job.id,
            profile,
            access,
            candidates,
            access_of,
            max_moves=left,
            request=self.jobs.ledger.request_for(job.user, profile, "batch"),
        )
        if move is None:
            return ""
        self.budget.spend(now, len(move.jobs))
        self.moves[job.id] = (move, now + timedelta(seconds=self.jobs.preempt_grace + 120))
        self._planned.pop(job.id, None)
        for other in move.jobs:
            try:
                self.jobs.preempt(
                    other,
                    "scheduler",
                    f"moved to make room for job {job.id} (the free capacity it needs is split "
                    "across GPUs); resumes elsewhere from its checkpoint",
                )
            except Refused:
                continue  # it ended meanwhile: its room is free the sooner, nothing moved
            self.jobs.moved_jobs += 1
        self.jobs.moved_milli += move.moved_milli
        self.log.info("job %s: moving jobs %s off %s to make room", job.id, move.jobs, move.host)
        return (
            f"waits for {len(move.jobs)} preemptible job(s) to move off {move.host}: "
            "the free capacity it needs is split across GPUs"
        )

    def _preempt_for(self, job: Any, rank: int, access: Access | None) -> None:
        profile = self.jobs.ledger.profiles[job.profile]
        with self.jobs.db.reading() as s:
            candidates = list(
                s.scalars(
                    select(JobRow).where(
                        JobRow.state.in_(ACTIVE), JobRow.priority_class == "preemptible"
                    )
                )
            )
        victim = pick_victim(
            self.jobs.ledger,
            profile,
            candidates,
            below_rank=rank,
            access=access,
            request=self.jobs.ledger.request_for(job.user, profile, "batch"),
        )
        if victim is not None and victim.state != "preempting":
            self.jobs.preempt(
                victim.id, "scheduler", f"job {job.id} ({job.priority_class}) needs its slice"
            )

    def _waiting(self, had: dict[int, str | None], reasons: dict[int, str]) -> None:
        """Record why each job still waits, where that changed, in batches (a first pass
        over a queue of thousands is a few transactions, not one per job)."""
        changed: list[dict[str, Any]] = [
            {"job_id": i, "reason": r[:1024]} for i, r in reasons.items() if had.get(i) != r[:1024]
        ]
        for start in range(0, len(changed), WAITING_BATCH):
            # waiting reasons change no slice: no need to queue behind allocations
            with self.jobs.db.writing(lock=False) as s:
                s.connection().execute(WAITING_REASON, changed[start : start + WAITING_BATCH])
            batch = changed[start : start + WAITING_BATCH]
            self.queue.reasons_written({c["job_id"]: c["reason"] for c in batch})

    def _start(self, queued: Any, grants: list[dict[str, Any]], now: datetime) -> None:
        """Start the job the queue read as ``queued`` on ``grants``: its whole row is read
        in the transaction that moves it (a job cancelled meanwhile gives them back)."""
        try:
            account = self.jobs.account(queued.user)
        except AccountError as e:
            self._fail(queued, str(e), grants)
            return
        where = ", ".join(f"{g['host']}:{_devices(g)}" for g in grants)
        # Names this start: the runner writes it into its state, so a state.json left by an
        # earlier attempt (a crashed runner's "running") is never taken for this one's.
        attempt = secrets.token_hex(8)

        def placed(row: Any) -> dict[str, Any]:
            return {
                "allocation_ids": [g["id"] for g in grants],
                "attempt_started_at": now,
                "started_at": row.started_at or now,
                "waiting_reason": None,
                "not_before": None,
                # written before the backend is asked: a service that dies before its
                # answer is recorded stops this attempt's run at its next start
                # (recovery.py), rather than take it for a dead run and start another
                "backend_ref": {
                    LAUNCHING: True,
                    "attempt_id": attempt,
                    "uid": account.uid,
                    "job_dir": row.job_dir,
                },
            }

        refused: AccountError | None = None
        with self.jobs.db.writing() as s:
            job = CURRENT_ROW.execute(s.connection(), {"job_id": queued.id}).first()
            started = job is not None and job.state == "queued"
            if started:
                try:
                    # the row as it is now, which the run starts from
                    self.jobs.verify_owner(job, account)
                except AccountError as e:
                    refused, started = e, False
            started = started and advance(s, job, "starting", f"placed on {where}", placed)
        if refused is not None:
            self._fail(job, str(refused), grants)
            return
        if not started:  # cancelled meanwhile
            self.jobs.release([g["id"] for g in grants], f"job {queued.id} no longer queued")
            return
        assert job is not None
        env = self._env(job, grants, account)
        env[ATTEMPT_ID] = attempt
        try:
            ref = cast(PlacedBackend, self.jobs.backend).start(
                job.id,
                job.job_dir,
                env,
                grants=grants,
                priority=job.priority_class,
                previous=dict(job.backend_ref or {}),
                account=account,
            )
        except Exception as e:
            self.log.exception("job %s: backend %s failed to start it", job.id, job.backend)
            self._fail(job, f"the {job.backend} backend could not start the job: {e}", grants)
            return
        launched = attempt
        if ref.get("resume"):
            # the backend runs the same submission again (Slurm's own requeue): its runner
            # has the attempt id it was submitted with
            attempt = (job.backend_ref or {}).get("attempt_id", attempt)
        ref = {**ref, "attempt_id": attempt}
        with self.jobs.db.writing() as s:
            conn = s.connection()
            now_row = CURRENT_ROW.execute(conn, {"job_id": job.id}).first()
            # still this start's job: not ended meanwhile (a cancel that came while the
            # runner started found no pid to kill, and released the slice) and not moved
            # on to another attempt
            ours = (
                now_row is not None
                and now_row.state not in TERMINAL
                and (now_row.backend_ref or {}).get("attempt_id") == launched
            )
            if ours:
                write_job(conn, job.id, {"backend_ref": ref})
        if ours and now_row.state == "preempting":
            # preempted while the run started: that request's signal found no pid to go to
            self.jobs.backend.signal_preempt(ref)
            self.jobs.log_line(job, "preempted while its run was starting: asked to checkpoint")
        if not ours:
            state = now_row.state if now_row is not None else "gone"
            self.log.warning("job %s was %s while its run started: stopping it", job.id, state)
            self.jobs.log_line(job, f"{state} while its run was starting; stopping it")
            # by its pid and by its attempt: what the start began, however far it got
            self.jobs.backend.kill({"attempt_id": launched, "uid": account.uid, **ref})

    def _fail(self, job: Any, error: str, grants: list[dict[str, Any]]) -> None:
        with self.jobs.db.writing() as s:
            row = s.get(JobRow, job.id)
            if row is not None and row.state not in TERMINAL:
                row.error = error
                row.allocation_ids = []
                transition(s, row, "failed", error)
        self.jobs.release([g["id"] for g in grants], f"job {job.id} failed to start")

    def _env(self, job: Any, grants: list[dict[str, Any]], account: Account) -> dict[str, str]:
        """The job's whole environment: the allow-list of :func:`job_environment` and the
        job's own variables. No token: the runner reports through its job folder."""
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPUSLICE_JOB_ID": str(job.id),
            "GPUSLICE_PROFILE": job.profile,
            "GPUSLICE_USAGE_INTERVAL": f"{self.jobs.usage_interval:g}",
        }
        if grants:  # (none when Slurm places the job: it picks the device and says which)
            env["CUDA_VISIBLE_DEVICES"] = ",".join(_devices(g) for g in grants)
            env["GPUSLICE_ALLOCATION_ID"] = ",".join(str(g["id"]) for g in grants)
        if self.simulated:
            env["GPUSLICE_SIMULATED"] = "1"
        return job_environment(
            account,
            job.job_dir,
            self.jobs.python,
            env,
            keep=self.jobs.job_env_keep,
            extra=self.jobs.job_environment,
        )


def _overlap(a: frozenset[str] | None, b: frozenset[str] | None) -> bool:
    """Whether two sets of pools (None: the whole cluster) share any."""
    return a is None or b is None or bool(a & b)


def _job_name(job: Any) -> str:
    return str(getattr(job, "name", None) or f"job {job.id}")


def reserved_reason(
    held: Reservation, reserved: dict[frozenset[str] | None, tuple[Reservation, int, str]]
) -> str:
    """A held-back job's waiting reason: which job it waits for, and until when."""
    name = next(n for r, _rank, n in reserved.values() if r is held)
    return held.describe(name)


def _left_over(
    pools: frozenset[str] | None, blocked: set[frozenset[str] | None]
) -> frozenset[str] | None:
    """Of ``pools`` (None: the whole cluster, no split), those no blocked job waits for;
    empty or None when there are none."""
    if pools is None or None in blocked:
        return None
    return pools.difference(*[b for b in blocked if b is not None])


def _devices(grant: dict[str, Any]) -> str:
    return ",".join(a.get("mig_uuid") or a["gpu_uuid"] for a in grant.get("assignments", []))


def _progress_fields(row: JobRow, runner: dict[str, Any]) -> dict[str, Any]:
    """What the runner says of the job's progress, in the row's columns."""
    out: dict[str, Any] = {k: runner[k] for k in ("cells_done", "cells_total") if k in runner}
    # from the job's folder (the runner's and the checkpoint library's, RunnerFiles):
    # never later than now
    saved = min(runner.get("last_checkpoint_at", 0.0), clock.timestamp())
    if saved:
        out["last_checkpoint_at"] = datetime.fromtimestamp(saved, tz=UTC)
    return out


def _progress_changed(row: JobRow, runner: dict[str, Any]) -> bool:
    return any(getattr(row, k) != v for k, v in _progress_fields(row, runner).items())


def _copy_progress(row: JobRow, runner: dict[str, Any]) -> None:
    for key, value in _progress_fields(row, runner).items():
        setattr(row, key, value)
