"""Defragmentation moves in the order the plan made them: the waiting job takes its room
first, the moved jobs then go where the plan found room for them, nothing else takes
either, and one move is under way at a time (scheduler ticked by hand)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from gpuslice_hub.placement import get_policy
from tests.jobs.full_cluster import PROFILES, insert_queued
from tests.jobs.test_defrag import SHARE, TWO_GPUS, CheckpointingBackend, job
from tests.service.conftest import build_ledger

A100 = {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}
THREE = [
    {"name": "n000", "cpu_milli": 64000, "memory_mib": 512000, "gpus": [{**A100, "count": 2}]},
    {"name": "n001", "cpu_milli": 64000, "memory_mib": 512000, "gpus": [{**A100, "count": 1}]},
]


def sched(tmp_path: Path, hosts, per_hour=8, policy="best-fit") -> Scheduler:
    ledger = build_ledger(
        f"sqlite:///{tmp_path}/l.sqlite", profiles=[*PROFILES, SHARE], hosts=hosts, policy=policy
    )
    m = JobManager(
        ledger,
        ledger.db,
        CheckpointingBackend(),  # type: ignore[arg-type]
        tmp_path / "jobs",
        defragment_moves_per_hour=per_hour,
    )
    m.run_jobs_as_service_user = True
    return Scheduler(m)


def where(s, jid):
    ids = set(job(s, jid).allocation_ids or [])
    allocs = [a for a in s.jobs.ledger.allocations() if a["id"] in ids]
    return sorted((a["host"], c["gpu_uuid"]) for a in allocs for c in a["assignments"])


def two_job_move(tmp_path):
    s = sched(tmp_path, THREE)
    db, ledger = s.jobs.db, s.jobs.ledger
    t = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    h1, _ = ledger.allocate(Caller("h1", (), "h1"), "gpu-1", "a")
    h2, _ = ledger.allocate(Caller("h2", (), "h2"), "gpu-1", "b")
    halves = [("ann", "share-500", "preemptible"), ("bob", "share-500", "preemptible")]
    x, y = insert_queued(db, tmp_path, halves)
    s.tick(t)
    assert job(s, x).state == "starting" and job(s, y).state == "starting"
    # person holds: 500 free on n000 GPU0 and 500 on n001
    hold_n001 = h1 if h1["host"] == "n001" else h2
    other = h2 if hold_n001 is h1 else h1
    ledger.release(hold_n001["id"], "t", "x")
    p2, _ = ledger.allocate(Caller("p2", (), "p2"), "share-500", "")
    tmp, _ = ledger.allocate(Caller("tmp", (), "tmp"), "share-500", "")
    assert p2["host"] == tmp["host"] == "n001"
    ledger.release(other["id"], "t", "x")
    p1, _ = ledger.allocate(Caller("p1", (), "p1"), "share-500", "")
    assert p1["host"] == "n000"
    ledger.release(tmp["id"], "t", "x")
    (a,) = insert_queued(db, tmp_path, [("cat", "gpu-1", "normal")])
    return s, x, y, a, t


def test_first_moved_job_to_finish_takes_the_room_back(tmp_path):
    s, x, y, a, t = two_job_move(tmp_path)
    s.tick(t + timedelta(minutes=10))
    assert job(s, x).state == "preempting" and job(s, y).state == "preempting"
    # x checkpoints first; y takes a little longer
    s.jobs.backend.stopped.discard(y)
    s.tick(t + timedelta(minutes=10, seconds=10))
    s.jobs.backend.stopped.add(y)
    s.tick(t + timedelta(minutes=10, seconds=20))
    assert job(s, a).state == "starting", "the waiting job did not get the room it paid 2 moves for"


@pytest.mark.parametrize("policy", ["best-fit", "first-fit", "default", "fgd", "gpu-packing"])
def test_room_held_for_a_finished_move(tmp_path, policy):
    s, x, y, a, t = two_job_move(tmp_path)
    s.jobs.ledger.policy = get_policy(policy)
    s.tick(t + timedelta(minutes=10))
    assert job(s, x).state == "preempting" and job(s, y).state == "preempting"
    s.jobs.backend.stopped.discard(y)
    s.tick(t + timedelta(minutes=10, seconds=10))
    s.jobs.backend.stopped.add(y)
    s.tick(t + timedelta(minutes=10, seconds=20))
    # the second moved job out: the waiting job has its whole GPU, and both moved jobs run
    assert job(s, a).state == "starting"
    assert job(s, x).state == job(s, y).state == "starting"
    assert s.jobs.moved_jobs == 2


def test_a_job_queued_behind_takes_the_place_the_moved_job_was_to_fit_in(tmp_path):
    """X and Y (preemptible halves) on GPU0 and GPU1; A (normal, whole GPU) waits; C (normal,
    half) waits behind A. The plan moves X 'beside Y' -- the place C is waiting for."""
    s = sched(tmp_path, TWO_GPUS)
    db, ledger = s.jobs.db, s.jobs.ledger
    t = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    (x,) = insert_queued(db, tmp_path, [("ann", "share-500", "preemptible")])
    s.tick(t)
    held, _ = ledger.allocate(Caller("pat", (), "pat"), "share-500", "")
    (y,) = insert_queued(db, tmp_path, [("bob", "share-500", "preemptible")])
    s.tick(t + timedelta(seconds=1))
    ledger.release(held["id"], "pat", "done")
    a, c = insert_queued(db, tmp_path, [("cat", "gpu-1", "normal"), ("dan", "share-500", "normal")])
    s.tick(t + timedelta(minutes=10))
    moved = [j for j in (x, y) if job(s, j).state == "preempting"]
    s.tick(t + timedelta(minutes=10, seconds=30))
    assert len(moved) == 1
    # the waiting job, then the moved one where the plan found room (it holds a slice
    # again), then the job behind, which outranks it and may preempt it as any normal job
    assert job(s, a).state == "starting"
    assert where(s, moved[0]), "the moved job was evicted, not moved"
    assert job(s, c).state == "queued"


ONE_GPU_HOSTS = [
    {"name": f"n00{i}", "cpu_milli": 64000, "memory_mib": 512000, "gpus": [{**A100, "count": 1}]}
    for i in range(3)
]


def test_two_moves_under_way_count_on_the_same_free_place(tmp_path):
    s = sched(tmp_path, ONE_GPU_HOSTS)
    db, ledger = s.jobs.db, s.jobs.ledger
    t = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)
    holds = {}
    for i in range(3):
        h, _ = ledger.allocate(Caller(f"h{i}", (), f"h{i}"), "gpu-1", "")
        holds[h["host"]] = h
    temps = []
    ids = {}
    for host, who in (("n000", "x"), ("n001", "z")):
        ledger.release(holds[host]["id"], "t", "x")
        (ids[who],) = insert_queued(db, tmp_path, [(who, "share-500", "preemptible")])
        s.tick(t)
        tmp, _ = ledger.allocate(Caller("tmp" + who, (), "t"), "share-500", "")
        assert tmp["host"] == host
        temps.append(tmp)
    ledger.release(holds["n002"]["id"], "t", "x")
    ledger.allocate(Caller("pat", (), "pat"), "share-500", "")
    for tmp in temps:
        ledger.release(tmp["id"], "t", "x")
    x, z = ids["x"], ids["z"]
    wide = [("a", "gpu-1", "preemptible"), ("b", "gpu-1", "preemptible")]
    insert_queued(db, tmp_path, wide)
    s.tick(t + timedelta(minutes=10))
    s.jobs.backend.stopped.clear()  # checkpoints take a while
    s.tick(t + timedelta(minutes=10, seconds=5))
    s.jobs.backend.stopped.update({j for j in (x, z) if job(s, j).state == "preempting"})
    s.tick(t + timedelta(minutes=10, seconds=30))
    assert job(s, x).state != "queued" and job(s, z).state != "queued", "a moved job was evicted"
    # one move at a time: the second waiting job got no plan while the first was under way
    assert s.jobs.moved_jobs == 1
