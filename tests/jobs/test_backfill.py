"""Backfill behind a blocked job without delaying it (jobs/reservation.py), on the ledger,
the job manager and the scheduler over one SQLite database, with a backend that runs
nothing (issue 47: behind a blocked job only preemptible jobs backfilled, and they could
take the blocked job's room for ever)."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller, Ledger
from tests.jobs.full_cluster import IdleBackend, insert_queued
from tests.service.conftest import build_ledger

PROFILES = [{"name": f"gpu-{n}", "kind": "gpu", "count": n} for n in (1, 2, 3, 8)]
HOUR = 3600.0


def cluster(folder: Path, gpus: int) -> tuple[Ledger, Scheduler]:
    gpu = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": gpus}
    host = {"name": "n000", "cpu_milli": 128000, "memory_mib": 1024000, "gpus": [gpu]}
    ledger = build_ledger(f"sqlite:///{folder}/ledger.sqlite", PROFILES, hosts=[host])
    manager = JobManager(ledger, ledger.db, IdleBackend(), folder / "jobs")  # type: ignore[arg-type]
    manager.log.setLevel(logging.WARNING)
    manager.run_jobs_as_service_user = True  # the queue's users have no system accounts
    return ledger, Scheduler(manager)


def submit(ledger: Ledger, folder: Path, profile: str, klass: str, runtime: float) -> int:
    (job_id,) = insert_queued(ledger.db, folder, [(f"u-{profile}-{klass}", profile, klass)])
    with ledger.db.writing() as s:
        s.execute(update(JobRow).where(JobRow.id == job_id).values(max_runtime=runtime))
    return job_id


def states(ledger: Ledger) -> dict[int, tuple[str, str | None]]:
    with ledger.db.reading() as s:
        return {j.id: (j.state, j.waiting_reason) for j in s.scalars(select(JobRow))}


@pytest.mark.parametrize("klass", ["normal", "preemptible"])
def test_behind_a_blocked_job_what_ends_before_its_turn_starts_and_what_would_not_waits(
    tmp_path: Path, klass: str
) -> None:
    # 2 GPUs: a running job holds one for another hour; the head needs both
    ledger, scheduler = cluster(tmp_path, 2)
    now = utcnow()
    running = submit(ledger, tmp_path, "gpu-1", klass, HOUR)
    scheduler.tick(now)
    assert states(ledger)[running][0] == "starting"
    head = submit(ledger, tmp_path, "gpu-2", klass, HOUR)
    long = submit(ledger, tmp_path, "gpu-1", klass, 2 * HOUR)
    short = submit(ledger, tmp_path, "gpu-1", klass, HOUR / 2)
    scheduler.tick(now + timedelta(seconds=1))
    after = states(ledger)
    assert after[head][0] == "queued" and after[head][1].startswith("No gpu-2 free")
    # ends before the running job does, when the head can start: it runs now (a normal
    # job waited "behind a higher-priority job", the GPU idle for the hour)
    assert after[short][0] == "starting", after
    # would still hold the GPU then (a preemptible one started, and could do so for ever)
    assert after[long][0] == "queued", after
    assert after[long][1].startswith(f"held for job {head} (job {head}), the first in the queue")
    assert "expected to start by" in after[long][1]


def test_a_job_that_leaves_the_head_its_room_starts_even_if_it_runs_longer(tmp_path: Path):
    # 4 GPUs: a running job holds two for another hour; the head needs three then
    ledger, scheduler = cluster(tmp_path, 4)
    now = utcnow()
    running = submit(ledger, tmp_path, "gpu-2", "normal", HOUR)
    scheduler.tick(now)
    assert states(ledger)[running][0] == "starting"
    head = submit(ledger, tmp_path, "gpu-3", "normal", HOUR)
    first = submit(ledger, tmp_path, "gpu-1", "normal", 5 * HOUR)
    second = submit(ledger, tmp_path, "gpu-1", "normal", 5 * HOUR)
    scheduler.tick(now + timedelta(seconds=1))
    after = states(ledger)
    assert after[head][0] == "queued"
    # the fourth GPU is more than the head needs in an hour: one long job may have it
    assert after[first][0] == "starting", after
    # a second one would leave the head two GPUs of its three
    assert after[second][0] == "queued" and after[second][1].startswith(f"held for job {head}")


def test_a_job_waiting_for_peoples_servers_is_held_for_once_it_has_waited_long_enough(
    tmp_path: Path,
) -> None:
    # 2 GPUs, one a person's: the head needs both, and no batch job's end will free them
    ledger, scheduler = cluster(tmp_path, 2)
    ledger.allocate(Caller("ann", (), "ann"), "gpu-1", "", learn=False)
    now = utcnow()
    head = submit(ledger, tmp_path, "gpu-2", "preemptible", HOUR)
    small = submit(ledger, tmp_path, "gpu-1", "preemptible", HOUR)
    scheduler.tick(now)
    # not long waited: the free GPU is not left idle for a start nobody can tell
    assert states(ledger)[small][0] == "starting"
    scheduler.jobs.release(
        list(states_allocs(ledger, small)), "test: the small job ended"
    )  # (its run over)
    with ledger.db.writing() as s:
        s.execute(update(JobRow).where(JobRow.id == small).values(state="completed"))
    later = submit(ledger, tmp_path, "gpu-1", "preemptible", HOUR)
    waited = now + timedelta(seconds=scheduler.jobs.hold_for_after + 1)
    scheduler.tick(waited)
    after = states(ledger)
    # past hold_for_after: the GPU is kept for the head, which starts once ann's is back
    assert after[later][0] == "queued", after
    assert after[later][1].startswith(f"held for job {head}")
    assert "waits for people's servers" in after[later][1]


def states_allocs(ledger: Ledger, job_id: int) -> list[int]:
    with ledger.db.reading() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        return [int(a) for a in row.allocation_ids or []]


def test_the_preemption_for_a_quarter_share_takes_the_job_that_wastes_least(tmp_path: Path):
    """Issue 47: to fit a 250-milli spawn the ledger preempted a whole-GPU job, leaving 750
    milli idle for an hour, where a quarter share's job would have freed just the room."""
    from gpuslice_hub.jobs.victims import pick_victim

    profiles = [
        {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
        {"name": "gpu-1", "kind": "gpu", "count": 1},
    ]
    gpu = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 2}
    host = {"name": "n000", "cpu_milli": 128000, "memory_mib": 1024000, "gpus": [gpu]}
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles, hosts=[host])
    manager = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs")  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    scheduler = Scheduler(manager)
    # four quarter shares, then (the most recent: the old order's first) a whole GPU
    quarters = [submit(ledger, tmp_path, "share-250", "preemptible", HOUR) for _ in range(4)]
    scheduler.tick(utcnow())
    whole = submit(ledger, tmp_path, "gpu-1", "preemptible", HOUR)
    scheduler.tick(utcnow() + timedelta(seconds=5))
    assert all(states(ledger)[j][0] == "starting" for j in [whole, *quarters])
    victim = pick_victim(ledger, ledger.profiles["share-250"], manager._candidates(), below_rank=1)
    assert victim is not None and victim.id in quarters, victim


def test_a_job_no_host_can_hold_holds_nothing_back(tmp_path: Path) -> None:
    """A job asking more than any host has (eight GPUs of a two-GPU host) is the first in the
    queue for ever: held for, it would keep every later job waiting for ever."""
    ledger, scheduler = cluster(tmp_path, 2)
    ledger.allocate(Caller("ann", (), "ann"), "gpu-1", "", learn=False)
    now = utcnow()
    never = submit(ledger, tmp_path, "gpu-8", "preemptible", HOUR)
    scheduler.tick(now)
    later = submit(ledger, tmp_path, "gpu-1", "preemptible", HOUR)
    scheduler.tick(now + timedelta(seconds=scheduler.jobs.hold_for_after + 1))
    after = states(ledger)
    assert after[never][0] == "queued" and after[later][0] == "starting", after
