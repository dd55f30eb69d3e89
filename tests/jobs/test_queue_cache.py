"""The scheduler's queue, kept between passes (QueueCache), reads the same as the database
after every kind of change, including a transition committed out of id order."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from sqlalchemy import delete, func, insert, select, update

from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.jobs import queue_cache
from gpuslice_hub.jobs.queue_cache import (
    FULL_READ_PASSES,
    LOOKBACK,
    QUEUED_COLUMNS,
    QueueCache,
)
from tests.jobs.full_cluster import full_cluster, insert_queued


def fresh(db) -> dict[int, tuple]:
    with db.reading() as s:
        rows = s.execute(select(*QUEUED_COLUMNS).where(JobRow.state == "queued"))
        return {r.id: (r.waiting_reason, r.not_before, tuple(r.groups or ())) for r in rows}


def newest_transition(db) -> int:
    with db.reading() as s:
        return s.scalar(select(func.max(JobTransitionRow.id))) or 0


def cached(cache: QueueCache, db) -> dict[int, tuple]:
    with db.reading() as s:
        jobs = cache.read(s)
    return {j.id: (j.waiting_reason, j.not_before, j.groups) for j in jobs}


def test_the_kept_queue_follows_submissions_starts_cancels_and_reasons(tmp_path: Path):
    ledger, scheduler = full_cluster(tmp_path, 1)  # every GPU held: nothing starts
    db = scheduler.jobs.db
    try:
        ids = insert_queued(db, tmp_path, [(f"u{i}", "gpu-1", "normal") for i in range(5)])
        scheduler.tick()  # writes each job's waiting reason
        cache = QueueCache()
        assert cached(cache, db) == fresh(db)
        assert all(reason for reason, _, _ in cached(cache, db).values())
        scheduler.jobs.cancel(ids[1], "admin")
        more = insert_queued(db, tmp_path, [("late", "share-250", "preemptible")])
        assert cached(cache, db) == fresh(db)
        assert ids[1] not in cached(cache, db) and more[0] in cached(cache, db)
        scheduler.tick()
        assert cached(scheduler.queue, db) == fresh(db)
    finally:
        ledger.db.dispose()


def test_a_transition_committed_out_of_id_order_is_not_missed(tmp_path: Path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    db = scheduler.jobs.db
    try:
        now = utcnow()
        a, b = insert_queued(db, tmp_path, [("a", "gpu-1", "normal"), ("b", "gpu-1", "normal")])
        newest = newest_transition(db)
        # job a's transition takes id newest+10 and commits first
        with db.writing() as s:
            s.execute(
                insert(JobTransitionRow).values(
                    id=newest + 10, job_id=a, state="queued", at=now, reason="x"
                )
            )
        cache = QueueCache()
        assert set(cached(cache, db)) == {a, b}
        # b's, with the lower id newest+5, commits later: b was cancelled
        with db.writing() as s:
            s.execute(update(JobRow).where(JobRow.id == b).values(state="cancelled"))
            s.execute(
                insert(JobTransitionRow).values(
                    id=newest + 5, job_id=b, state="cancelled", at=now, reason="y"
                )
            )
        assert set(cached(cache, db)) == {a}
    finally:
        ledger.db.dispose()


def test_a_late_transition_is_seen_after_the_look_back_moved_on(tmp_path: Path, monkeypatch):
    # the look-back set is pruned once it spans two LOOKBACKs of ids, not at each pass:
    # a late transition just within one LOOKBACK of the newest is still seen after that
    # (by the look-back alone: no full read comes between)
    monkeypatch.setattr(queue_cache, "FULL_READ_PASSES", 10**9)
    ledger, scheduler = full_cluster(tmp_path, 1)
    db = scheduler.jobs.db
    try:
        now = utcnow()
        (a,) = insert_queued(db, tmp_path, [("a", "gpu-1", "normal")])
        cache = QueueCache()
        assert set(cached(cache, db)) == {a}
        newest = newest_transition(db)
        gap = newest + 3 * LOOKBACK  # ids up to here are taken, one at a time, by other jobs
        for tid in range(newest + 1, gap + 1):
            if tid == gap - LOOKBACK + 1:
                continue  # a's, committed late
            with db.writing() as s:
                s.execute(
                    insert(JobTransitionRow).values(
                        id=tid, job_id=a, state="queued", at=now, reason="x"
                    )
                )
            assert set(cached(cache, db)) == {a}
        with db.writing() as s:
            s.execute(update(JobRow).where(JobRow.id == a).values(state="cancelled"))
            s.execute(
                insert(JobTransitionRow).values(
                    id=gap - LOOKBACK + 1, job_id=a, state="cancelled", at=now, reason="y"
                )
            )
        assert set(cached(cache, db)) == set()
    finally:
        ledger.db.dispose()


def test_the_whole_queue_is_read_again_after_a_while(tmp_path: Path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    db = scheduler.jobs.db
    try:
        now = utcnow()
        (a,) = insert_queued(db, tmp_path, [("a", "gpu-1", "normal")])
        cache = QueueCache()
        cached(cache, db)
        later = now + timedelta(hours=1)
        # a change with no transition (none is written so; this shows the safety net)
        with db.writing() as s:
            s.execute(update(JobRow).where(JobRow.id == a).values(not_before=later))
        for _ in range(FULL_READ_PASSES - 1):
            assert cached(cache, db)[a][1] is None
        assert cached(cache, db)[a][1] == later
    finally:
        ledger.db.dispose()


def test_ids_that_went_back_after_pruning_make_a_full_read(tmp_path: Path):
    # SQLite reuses the highest ids once they are deleted: a new job's transition may get
    # an id the cache has already seen
    ledger, scheduler = full_cluster(tmp_path, 1)
    db = scheduler.jobs.db
    try:
        (a,) = insert_queued(db, tmp_path, [("a", "gpu-1", "normal")])
        cache = QueueCache()
        assert set(cached(cache, db)) == {a}
        scheduler.jobs.cancel(a, "admin")
        assert cached(cache, db) == {}
        with db.writing() as s:  # history pruning deletes every transition of the past
            s.execute(delete(JobTransitionRow))
        (b,) = insert_queued(db, tmp_path, [("b", "gpu-1", "normal")])
        assert set(cached(cache, db)) == {b}
    finally:
        ledger.db.dispose()


def test_many_changed_jobs_are_read_in_chunks(tmp_path: Path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    db = scheduler.jobs.db
    try:
        cache = QueueCache()
        cached(cache, db)
        ids = insert_queued(db, tmp_path, [(f"u{i}", "gpu-1", "normal") for i in range(1200)])
        assert set(cached(cache, db)) == set(ids)
    finally:
        ledger.db.dispose()
