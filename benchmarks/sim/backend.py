"""The batch backend of a simulation: a runner that computes on virtual time.

It stands where the local backend starts ``python -m gpuslice.run``, and answers the job
scheduler through the same interface (start, poll, preempt, kill) and the same job folder
(``state.json``, as the runner writes it). What it models is the runner's: a job needs
``work`` seconds of GPU time, saves a checkpoint every ``checkpoint_interval`` seconds of
its run, resumes from its last checkpoint, and when asked to stop exits ``exit_delay``
seconds later (within the grace period) with the work since its last checkpoint lost.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuslice.vocab import EXIT_COMPLETED, EXIT_PREEMPTED
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.runner_state import ATTEMPT_ID

from .workload import BatchJob

# The answers of almost every run at almost every pass, made once (a frozen dataclass
# costs microseconds to build: hundreds of runs a pass, thousands of passes a day).
_GONE = RunStatus(False, None)
_WRITTEN = RunStatus(True)
_UNCHANGED = RunStatus(True, files_unchanged=True)


@dataclass
class Run:
    job: BatchJob
    attempt: str
    started: float  # the simulation's seconds
    saved: float  # work done and checkpointed when this run started
    ends: float  # when it exits (work done, or stopping)
    job_dir: str
    code: int | None = EXIT_COMPLETED
    stopping: bool = False
    settled: bool = False  # exited, and its state written

    def checkpointed(self, at: float) -> float:
        """Work saved by ``at``: the start's, plus every whole checkpoint interval run."""
        interval = self.job.checkpoint_interval
        ran = max(0.0, at - self.started)
        return min(self.job.work, self.saved + (ran // interval) * interval)


class SimBackend:
    """Times are the simulation's seconds: ``now()`` says the current one, ``on_change(t)``
    is told when a run will exit (a pass is due then); ``epoch`` is the POSIX time of 0
    (the runner writes POSIX times in ``state.json``)."""

    name = "local"

    def __init__(
        self,
        jobs: dict[int, BatchJob],
        now: Callable[[], float],
        on_change: Callable[[float], None],
        epoch: float,
        exit_delay: float = 10.0,
    ) -> None:
        self.jobs = jobs  # by the service's job id
        self.now = now
        self.on_change = on_change
        self.epoch = epoch
        self.exit_delay = exit_delay
        self.runs: dict[int, Run] = {}  # job id -> its current run
        # the job ids whose run has not exited yet: a month's runs are tens of thousands,
        # and each pass's settle looks only at these
        self.unsettled: set[int] = set()
        # (when it exits, job id, run) of each run not exited, and of each earlier exit
        # time a stop moved forward (left in, skipped when popped): a pass settles the
        # runs due without looking at the hundreds still going
        self._exits: list[tuple[float, int, int, Run]] = []
        self._pushed = 0
        # job ids whose folder it wrote since the scheduler last asked after them: the
        # others' folders are as the pass last read them (RunStatus.files_unchanged)
        self.written: set[int] = set()
        self.saved: dict[int, float] = {}  # job id -> work checkpointed (kept across runs)
        self.kept: dict[int, float] = {}  # job id -> seconds of work done and not lost
        self.lost: dict[int, float] = {}  # job id -> seconds of work lost
        self.losses: list[float] = []  # the work each stopped run lost, in seconds

    # -- the backend interface ---------------------------------------------------------

    def start(
        self,
        job_id: int,
        job_dir: str,
        env: dict[str, str],
        grants: Sequence[dict[str, Any]],
        priority: str,
        previous: dict[str, Any],
        account: Any,
    ) -> dict[str, Any]:
        now = self.now()
        job = self.jobs[job_id]
        saved = self.saved.get(job_id, 0.0)
        run = Run(job, env[ATTEMPT_ID], now, saved, now + (job.work - saved), job_dir)
        self.runs[job_id] = run
        self.unsettled.add(job_id)
        self._exit_at(job_id, run)
        self.written.add(job_id)
        _write_state(
            job_dir, status="running", attempt_id=run.attempt, last_checkpoint_at=self.epoch + now
        )
        self.on_change(run.ends)
        return {"sim": job_id}

    def changed_jobs(self) -> set[int]:
        """The jobs whose run it started, ended or wrote the folder of since the scheduler
        last asked after them: of every other run it answers what it answered then."""
        return self.written

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return self.poll_many([ref])[0]

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        now = self.now()
        out = []
        runs, written = self.runs, self.written
        for ref in refs:
            job_id = ref.get("sim", -1)
            run = runs.get(job_id)
            if run is None:
                out.append(_GONE)
            elif run.settled:
                out.append(RunStatus(False, run.code))
            else:
                # the simulator settles every run that ended before it asks for a pass
                assert now < run.ends, f"job {run.job.id}: a run ended unsettled"
                out.append(_WRITTEN if job_id in written else _UNCHANGED)
            written.discard(job_id)
        return out

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        self._stop(ref, EXIT_PREEMPTED, self.exit_delay)

    def kill(self, ref: dict[str, Any]) -> None:
        self._stop(ref, None, 0.0)

    # -- the runner's side ---------------------------------------------------------------

    def _stop(self, ref: dict[str, Any], code: int | None, delay: float) -> None:
        job_id = ref.get("sim", -1)
        run = self.runs.get(job_id)
        now = self.now()
        if run is None or run.settled or (run.stopping and code is not None):
            return
        run.stopping, run.code = True, code
        if now + delay < run.ends:
            run.ends = now + delay
            self._exit_at(job_id, run)
        self.on_change(run.ends)

    def settle(self, now: float) -> None:
        """Every run that has exited by ``now``: write what the runner writes on its way
        out (the next pass reads it), and account its work."""
        due: dict[int, Run] = {}
        exits = self._exits
        while exits and exits[0][0] <= now:
            ends, job_id, _, run = heapq.heappop(exits)
            if not run.settled and run.ends == ends and self.runs.get(job_id) is run:
                due[job_id] = run
        for job_id in sorted(due):  # (in job id order: deterministic)
            self._settle(job_id, due[job_id])

    def _exit_at(self, job_id: int, run: Run) -> None:
        self._pushed += 1
        heapq.heappush(self._exits, (run.ends, job_id, self._pushed, run))

    def _settle(self, job_id: int, run: Run) -> None:
        run.settled = True
        self.unsettled.discard(job_id)
        at = run.ends
        done = min(run.job.work, run.saved + (at - run.started))
        saved = run.job.work if run.code == EXIT_COMPLETED else run.checkpointed(at)
        lost = max(0.0, done - saved)  # (not -1e-12 of float rounding)
        self.saved[job_id] = saved
        self.kept[job_id] = self.kept.get(job_id, 0.0) + (saved - run.saved)
        self.lost[job_id] = self.lost.get(job_id, 0.0) + lost
        if run.code != EXIT_COMPLETED:
            self.losses.append(lost)
        status = {EXIT_COMPLETED: "completed", EXIT_PREEMPTED: "preempted"}.get(
            run.code if run.code is not None else -1, "running"
        )
        self.written.add(job_id)
        _write_state(
            run.job_dir,
            status=status,
            attempt_id=run.attempt,
            last_checkpoint_at=self.epoch + run.started + (saved - run.saved),
            lost_work_seconds=lost,
        )

    def progress(self, at: float) -> dict[int, float]:
        """Per running job, the work its current run has done by ``at`` (checkpointed or
        not: a run still going at the end of a simulation has lost nothing yet)."""
        done: dict[int, float] = {}
        for job_id in self.unsettled:
            run = self.runs[job_id]
            done[job_id] = min(run.job.work - run.saved, max(0.0, min(at, run.ends) - run.started))
        return done


def _write_state(job_dir: str, **state: Any) -> None:
    path = Path(job_dir) / "state.json"
    path.write_text(json.dumps(state))
