"""History retention on real SQLite and PostgreSQL: old events, job histories and released
allocations go; every figure an admin reads stays the same; what is live stays."""

from __future__ import annotations

from datetime import timedelta

from prometheus_client import generate_latest
from sqlalchemy import func, select, update

from gpuslice_hub.admin.accounting import reclaimed
from gpuslice_hub.admin.history import prune_history
from gpuslice_hub.db.jobs_models import JobRow, JobTransitionRow
from gpuslice_hub.db.models import AllocationRow, ClaimRow, EventRow, LedgerLock, utcnow
from gpuslice_hub.ledger import Caller
from gpuslice_hub.metrics import make_registry

ANN = Caller("ann", (), "ann")
OLD = timedelta(days=40)


def idle_event(ledger, kind: str, alloc: dict, **detail) -> None:
    ledger.record_event(
        kind,
        alloc["user"],
        "ann",
        None,
        {"allocation_id": alloc["id"], "profile": alloc["profile"], **detail},
    )


def idle_figures(registry) -> list[str]:
    """The idle-reclaim counters as scraped (the other families change with the ledger)."""
    text = generate_latest(registry).decode()
    return sorted(
        line
        for line in text.splitlines()
        if line.startswith(("gpuslice_idle_", "gpuslice_reclaimed_gpu_hours"))
        and not line.startswith("#")
        and "_created" not in line
    )


def add_job(ledger, state: str, when, finished=None) -> int:
    with ledger.db.writing() as s:
        job = JobRow(
            name="j",
            user="ann",
            state=state,
            finished_at=finished,
            profile="share-250",
            priority_class="normal",
            checkpoint_interval=60.0,
            max_runtime=60.0,
            backend="local",
        )
        job.transitions.append(JobTransitionRow(from_state=None, state="queued", at=when))
        job.transitions.append(JobTransitionRow(from_state="queued", state=state, at=when))
        s.add(job)
        s.flush()
        return job.id


def test_pruning_keeps_every_figure_and_everything_live(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    gone, _ = ledger.allocate(ANN, "share-250", "gone")
    kept, _ = ledger.allocate(ANN, "mig-1g.10gb", "kept")
    idle_event(ledger, "idle-warning", gone, scope="server")
    early, _ = make_registry(ledger)
    idle_figures(early)  # a scrape that read only the first event: pruning goes past it
    idle_event(ledger, "idle-culled", gone, scope="server", reclaimed_gpu_hours=2.5)
    idle_event(ledger, "idle-culled", gone, scope="kernel", kernel_id="k1")
    ledger.release(gone["id"], "ann", "done")
    ended = add_job(ledger, "completed", now - OLD, finished=now - OLD)
    # started as long ago, ended recently: its history stays whole
    recent = add_job(ledger, "completed", now - OLD, finished=now - timedelta(days=1))
    live = add_job(ledger, "running", now - OLD)
    # all of that happened 40 days ago ...
    with ledger.db.writing() as s:
        s.execute(update(EventRow).values(ts=now - OLD))
        s.execute(
            update(AllocationRow)
            .where(AllocationRow.id == gone["id"])
            .values(released_at=now - OLD)
        )
    # ... and this recently
    idle_event(ledger, "idle-culled", kept, scope="server", reclaimed_gpu_hours=1.0)
    idle_event(ledger, "idle-warning", kept, scope="server")

    registry, _ = make_registry(ledger)
    before = idle_figures(registry)  # this collector has counted the old events already
    figures = reclaimed(ledger, now)
    assert figures == {"total": 3.5, "last_7d": 1.0, "last_30d": 1.0}
    with ledger.db.reading() as s:
        newest = s.execute(select(func.max(EventRow.id))).scalar()

    pruned = prune_history(ledger, now - timedelta(days=30), batch=2)  # several batches
    assert pruned.events >= 5 and pruned.transitions == 2 and pruned.allocations == 1

    with ledger.db.reading() as s:
        left = s.execute(select(EventRow.ts)).scalars().all()
        assert left and all(now - ts < timedelta(days=1) for ts in left)
        through = s.execute(select(LedgerLock.history_through)).scalar()
        assert 0 < through < newest
        assert s.get(AllocationRow, gone["id"]) is None
        assert not s.execute(select(ClaimRow).where(ClaimRow.allocation_id == gone["id"])).all()
        assert s.get(AllocationRow, kept["id"]).active
        histories = {
            job_id: s.execute(
                select(func.count()).where(JobTransitionRow.job_id == job_id)
            ).scalar()
            for job_id in (ended, recent, live)
        }
    assert histories == {ended: 0, recent: 2, live: 2}  # whole histories, or none
    # the same figures: from the collector that saw the events, from a new one, and in
    # the admin panel
    assert idle_figures(registry) == before
    assert idle_figures(early) == before
    assert idle_figures(make_registry(ledger)[0]) == before
    assert reclaimed(ledger, now) == figures
    assert [a["id"] for a in ledger.allocations()] == [kept["id"]]

    # ids keep growing and caches keep following them
    again, _ = ledger.allocate(ANN, "share-250", "again")
    with ledger.db.reading() as s:
        assert s.execute(select(func.max(EventRow.id))).scalar() > newest
    assert {a["id"] for a in ledger.allocations()} == {kept["id"], again["id"]}
    idle_event(ledger, "idle-culled", again, scope="server", reclaimed_gpu_hours=0.5)
    assert reclaimed(ledger, now + timedelta(seconds=1))["total"] == 4.0
    after = idle_figures(registry)
    assert after != before and idle_figures(make_registry(ledger)[0]) == after

    # nothing older left: pruning again changes nothing
    assert not prune_history(ledger, now - timedelta(days=30))


def test_transition_ids_keep_growing_after_pruning(make_ledger):
    """The job whose transition is the newest keeps its history, however old: SQLite would
    hand a deleted highest id out again, and the scheduler's kept queue counts on ids that
    only grow."""
    ledger = make_ledger()
    now = utcnow()
    older = add_job(ledger, "completed", now - OLD, finished=now - OLD)
    newest_job = add_job(ledger, "completed", now - OLD, finished=now - OLD)
    with ledger.db.reading() as s:
        top = s.execute(select(func.max(JobTransitionRow.id))).scalar()
    assert prune_history(ledger, now - timedelta(days=30)).transitions == 2
    with ledger.db.reading() as s:
        left = s.execute(select(JobTransitionRow.job_id)).scalars().all()
    assert sorted(left) == [newest_job, newest_job] and older not in left
    later = add_job(ledger, "running", now)
    with ledger.db.reading() as s:
        ids = s.execute(
            select(JobTransitionRow.id).where(JobTransitionRow.job_id == later)
        ).scalars()
        assert min(ids) > top
