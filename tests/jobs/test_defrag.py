"""Defragmentation: a job refused for capacity that is free but split across GPUs gets it
by moving preemptible jobs that fit elsewhere (the scheduler ticked by hand; its backend
stops a run when asked to checkpoint, as a runner does)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpuslice.vocab import EXIT_PREEMPTED
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.errors import ConfigError
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.defrag import MoveBudget
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from gpuslice_hub.metrics import DefragCollector
from tests.jobs.full_cluster import PROFILES, IdleBackend, insert_queued
from tests.service.conftest import build_ledger

TWO_GPUS = [
    {
        "name": "n000",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 2}],
    }
]
SHARE = {"name": "share-500", "kind": "share", "gpu_milli": 500, "gpu_memory_mib": 40960}


class CheckpointingBackend(IdleBackend):
    """A run ends with the preempted exit code once it was asked to checkpoint."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped: set[int] = set()

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        if ref.get("job") in self.stopped:
            return RunStatus(False, EXIT_PREEMPTED)
        return RunStatus(True)

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        self.stopped.add(ref["job"])

    def start(self, job_id: int, *a: Any, **kw: Any) -> dict[str, Any]:
        self.stopped.discard(job_id)
        return super().start(job_id, *a, **kw)


def scheduler_with(tmp_path: Path, moves_per_hour: int) -> Scheduler:
    ledger = build_ledger(
        f"sqlite:///{tmp_path}/l.sqlite", profiles=[*PROFILES, SHARE], hosts=TWO_GPUS
    )
    manager = JobManager(
        ledger,
        ledger.db,
        CheckpointingBackend(),  # type: ignore[arg-type]
        tmp_path / "jobs",
        defragment_moves_per_hour=moves_per_hour,
    )
    manager.run_jobs_as_service_user = True
    return Scheduler(manager)


def job(scheduler: Scheduler, job_id: int) -> JobRow:
    with scheduler.jobs.db.reading() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        s.expunge(row)
        return row


def gpus_of(scheduler: Scheduler, job_id: int) -> list[int]:
    """The indexes of the GPUs a job's slices are on."""
    ids = set(job(scheduler, job_id).allocation_ids or [])
    _hosts, gpus, _active = scheduler.jobs.ledger.snapshot()
    index = {g.uuid: g.index for g in gpus}
    return sorted(
        index[c["gpu_uuid"]]
        for a in scheduler.jobs.ledger.allocations()
        if a["id"] in ids
        for c in a["assignments"]
    )


def split_free_capacity(tmp_path: Path, moves_per_hour: int) -> tuple[Scheduler, int, int, int]:
    """Two half-GPU preemptible jobs, one on each GPU: a whole GPU is free, in two halves.
    Returns the scheduler, the two jobs and a queued preemptible one-GPU job."""
    scheduler = scheduler_with(tmp_path, moves_per_hour)
    db, ledger = scheduler.jobs.db, scheduler.jobs.ledger
    t = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    (first,) = insert_queued(db, tmp_path, [("ann", "share-500", "preemptible")])
    scheduler.tick(t)
    # a person's half GPU beside it, so that the second job lands on the other GPU
    held, _ = ledger.allocate(Caller("pat", (), "pat"), "share-500", "")
    (second,) = insert_queued(db, tmp_path, [("bob", "share-500", "preemptible")])
    scheduler.tick(t + timedelta(seconds=1))
    ledger.release(held["id"], "pat", "done")
    assert (gpus_of(scheduler, first), gpus_of(scheduler, second)) == ([0], [1])
    (wide,) = insert_queued(db, tmp_path, [("cat", "gpu-1", "preemptible")])
    return scheduler, first, second, wide


def test_a_job_refused_for_split_capacity_gets_it_by_moving_a_preemptible_job(tmp_path):
    scheduler, first, second, wide = split_free_capacity(tmp_path, moves_per_hour=4)
    t = datetime(2026, 12, 7, 9, 10, tzinfo=UTC)

    scheduler.tick(t)
    assert job(scheduler, wide).state == "queued"
    assert job(scheduler, wide).waiting_reason == (
        "waits for 1 preemptible job(s) to move off n000: the free capacity it needs is split "
        "across GPUs"
    )
    moved = first if job(scheduler, first).state == "preempting" else second
    stays = second if moved == first else first
    assert job(scheduler, moved).state == "preempting"
    assert job(scheduler, stays).state == "starting"
    with scheduler.jobs.db.reading() as s:
        reason = s.get(JobRow, moved).transitions[-1].reason  # type: ignore[union-attr]
    assert reason.startswith(f"moved to make room for job {wide} (the free capacity it needs")

    # the moved job checkpoints and exits: the waiting job takes the whole GPU it left, and
    # the moved one resumes beside the other
    scheduler.tick(t + timedelta(seconds=30))
    assert job(scheduler, wide).state == "starting"
    assert job(scheduler, moved).state == "starting"
    assert gpus_of(scheduler, moved) == gpus_of(scheduler, stays)
    assert gpus_of(scheduler, wide) != gpus_of(scheduler, stays)
    assert scheduler.jobs.moved_jobs == 1 and scheduler.jobs.moved_milli == 500
    exposed = {
        sample.name: sample.value
        for family in DefragCollector(scheduler.jobs).collect()
        for sample in family.samples
    }
    assert exposed["gpuslice_defrag_jobs_moved_total"] == 1
    assert exposed["gpuslice_defrag_moved_milli_total"] == 500


def test_without_defragmentation_the_job_waits_beside_the_split_capacity(tmp_path):
    scheduler, first, second, wide = split_free_capacity(tmp_path, moves_per_hour=0)
    scheduler.tick(datetime(2026, 12, 7, 9, 10, tzinfo=UTC))
    assert job(scheduler, wide).state == "queued"
    assert (job(scheduler, first).state, job(scheduler, second).state) == ("starting",) * 2
    assert job(scheduler, wide).waiting_reason.startswith("No gpu-1 free")  # type: ignore[union-attr]


def test_nothing_moves_when_the_moved_job_would_not_fit_elsewhere(tmp_path):
    scheduler, first, second, wide = split_free_capacity(tmp_path, moves_per_hour=4)
    # a person takes the other half of one GPU: a move would leave its job nowhere to go
    scheduler.jobs.ledger.allocate(Caller("pat", (), "pat"), "share-500", "")
    scheduler.tick(datetime(2026, 12, 7, 9, 10, tzinfo=UTC))
    assert job(scheduler, wide).state == "queued"
    assert (job(scheduler, first).state, job(scheduler, second).state) == ("starting",) * 2
    assert scheduler.jobs.moved_jobs == 0


def test_the_hourly_budget_bounds_the_moves():
    budget = MoveBudget(3)
    t = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    assert budget.left(t) == 3
    budget.spend(t, 2)
    assert budget.left(t + timedelta(minutes=59)) == 1
    assert budget.left(t + timedelta(hours=1)) == 3


def test_a_negative_budget_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="defragment_moves_per_hour"):
        scheduler_with(tmp_path, -1)


def test_a_job_that_started_lately_is_not_moved(tmp_path):
    # the jobs started at 09:00 and 09:00:01; five minutes must pass before either moves
    scheduler, first, second, wide = split_free_capacity(tmp_path, moves_per_hour=4)
    scheduler.tick(datetime(2026, 12, 7, 9, 4, tzinfo=UTC))
    assert (job(scheduler, first).state, job(scheduler, second).state) == ("starting",) * 2
    assert job(scheduler, wide).waiting_reason.startswith("No gpu-1 free")  # type: ignore[union-attr]
    scheduler.tick(datetime(2026, 12, 7, 9, 10, tzinfo=UTC))
    assert scheduler.jobs.moved_jobs == 1
