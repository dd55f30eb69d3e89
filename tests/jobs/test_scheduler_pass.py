"""One scheduler pass over a long queue on a full cluster: what it tries, what it records,
what the placement policy learns from it (no hub: the ledger, manager and scheduler on one
SQLite database)."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.ledger import Ledger
from tests.jobs.full_cluster import PROFILES, full_cluster, hosts, queue


def waiting(ledger: Ledger) -> dict[int, tuple[str, str | None]]:
    with ledger.db.reading() as s:
        return {j.id: (j.state, j.waiting_reason) for j in s.scalars(select(JobRow))}


def count_allocate_calls(ledger: Ledger) -> list[str]:
    """The profiles the ledger was asked to place, in order: an ``allocate``, or a try on
    its kept state that refused (one that might be granted is followed by ``allocate``)."""
    calls: list[str] = []
    real, kept = ledger.allocate, ledger.refusal_as_kept

    def counted(caller, profile, *a, **kw):
        calls.append(profile)
        return real(caller, profile, *a, **kw)

    def counted_kept(caller, profile, *a, **kw):
        refused = kept(caller, profile, *a, **kw)
        if refused is not None:
            calls.append(profile)
        return refused

    ledger.allocate = counted  # type: ignore[method-assign]
    ledger.refusal_as_kept = counted_kept  # type: ignore[method-assign]
    return calls


def test_a_pass_tries_each_blocked_shape_once_and_tells_every_job_why(tmp_path):
    ledger, scheduler = full_cluster(tmp_path, 2)
    queue(ledger, tmp_path, 300, "preemptible")
    calls = count_allocate_calls(ledger)
    scheduler.tick()
    # one attempt per profile, not 300: nothing frees up during a pass
    assert sorted(calls) == sorted(p["name"] for p in PROFILES)
    jobs = waiting(ledger)
    assert all(state == "queued" and reason for state, reason in jobs.values())
    # every job of a shape is told the reason its first one got
    by_profile: dict[str, set] = {}
    with ledger.db.reading() as s:
        for j in s.scalars(select(JobRow).where(JobRow.id > 1)):
            by_profile.setdefault(j.profile, set()).add(j.waiting_reason)
    assert all(len(reasons) == 1 for reasons in by_profile.values()), by_profile
    assert by_profile["gpu-1"] == {jobs[2][1]} and jobs[2][1].startswith("No gpu-1 free")

    # a refusal lasts one pass: a slice freed before the next is taken by the queue's head
    calls.clear()
    ledger.release(1, "test", "freed")
    scheduler.tick()
    assert waiting(ledger)[1][0] == "starting"
    # the head, then three preemptible quarter shares backfill the rest of that GPU
    started = scheduler.jobs.backend.started  # type: ignore[attr-defined]
    assert started[0] == 1 and len(started) == 4


def test_normal_jobs_behind_a_blocked_head_are_tried_once_a_shape(tmp_path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    queue(ledger, tmp_path, 50, "normal")
    calls = count_allocate_calls(ledger)
    scheduler.tick()
    # behind the blocked head a later job may backfill (nothing it could delay: every GPU
    # is a person's); each shape is tried once, and nothing fits
    assert sorted(calls) == sorted(p["name"] for p in PROFILES)
    jobs = waiting(ledger)
    assert all(state == "queued" for state, _ in jobs.values())
    assert jobs[1][1].startswith("No share-250 free")


def test_placement_learns_each_job_once_however_many_passes_it_waits(tmp_path):
    ledger, scheduler = full_cluster(tmp_path, 1, policy="default")
    online = ledger.policy.online  # type: ignore[attr-defined]
    assert online.seen == 0  # the servers holding the cluster were placed with learn=False
    queue(ledger, tmp_path, 30, "preemptible")
    for _ in range(5):
        scheduler.tick()
    assert online.seen == 30


def test_after_a_restart_placement_starts_from_the_recorded_requests(tmp_path):
    ledger, _ = full_cluster(tmp_path, 1, policy="default")
    again = Ledger(ledger.db, ledger.profiles, ledger.quotas, type(ledger.policy)())
    # the 8 allocations full_cluster made (learn=False then; recorded all the same)
    assert again.learn_from_history() == 8
    assert again.policy.online.seen == 8  # type: ignore[attr-defined]
    assert again.policy.online.current is not None  # type: ignore[attr-defined]


def test_the_queue_is_listed_in_the_order_it_runs_page_by_page(tmp_path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    queue(ledger, tmp_path, 25, "preemptible")  # job 1 is normal
    with ledger.db.writing() as s:
        s.get(JobRow, 5).priority_class = "high"
    jobs = scheduler.jobs
    listed, cursor = [], None
    while True:
        page, cursor, total = jobs.list_jobs(None, {"queued"}, 10, "run", cursor)
        listed += page
        if cursor is None:
            break
    assert total == 25 and len(listed) == 25
    # high before normal before preemptible; within a class, the order of submission
    assert [j["id"] for j in listed] == [5, 1, *[i for i in range(2, 26) if i != 5]]
    assert [j["queue_position"] for j in listed] == list(range(1, 26))

    newest, cursor = [], None
    while True:
        page, cursor, _ = jobs.list_jobs(None, None, 7, "newest", cursor)
        newest += [j["id"] for j in page]
        if cursor is None:
            break
    assert newest == list(range(25, 0, -1))


def test_run_order_lists_every_job_it_counts(tmp_path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    queue(ledger, tmp_path, 6, "preemptible")
    with ledger.db.writing() as s:
        s.get(JobRow, 3).state = "completed"  # a state filter may ask for finished jobs
    page, cursor, total = scheduler.jobs.list_jobs(None, {"queued", "completed"}, 10, "run")
    assert cursor is None and total == 6 == len(page)
    assert page[-1]["id"] == 3 and "queue_position" not in page[-1]


def test_a_queue_nothing_changed_for_is_not_tried_again_until_something_does(tmp_path):
    from datetime import timedelta

    from gpuslice_hub.db.models import utcnow
    from gpuslice_hub.jobs.scheduler import FULL_PASS_SECONDS

    ledger, scheduler = full_cluster(tmp_path, 1)
    queue(ledger, tmp_path, 30, "preemptible")
    now = utcnow()
    with ledger.db.writing() as s:  # one job waits out a crash backoff
        s.get(JobRow, 5).not_before = now + timedelta(seconds=10)
    calls = count_allocate_calls(ledger)
    scheduler.tick(now)
    tried = len(calls)
    assert tried > 0
    scheduler.tick(now + timedelta(seconds=1))
    assert len(calls) == tried  # same ledger, same jobs: the same answer, not asked again

    # the backoff ended: job 5 is told why it waits, and its shape is not tried again
    # (nothing was freed since it was refused: refusals.py)
    scheduler.tick(now + timedelta(seconds=11))
    assert len(calls) == tried
    jobs = waiting(ledger)
    assert jobs[5][1] == jobs[2][1] and jobs[5][1].startswith("No gpu-1 free")
    scheduler.tick(now + timedelta(seconds=12))
    assert len(calls) == tried
    scheduler.tick(now + timedelta(seconds=FULL_PASS_SECONDS + 12))  # and at least this often
    assert len(calls) > tried

    # a slice given back (an event) is tried at once
    ledger.release(1, "test", "freed")
    scheduler.tick(now + timedelta(seconds=FULL_PASS_SECONDS + 13))
    assert waiting(ledger)[1][0] == "starting"


def test_a_pass_that_failed_is_tried_again_at_once(tmp_path):
    ledger, scheduler = full_cluster(tmp_path, 1)
    queue(ledger, tmp_path, 5, "preemptible")
    real = scheduler._start_queued
    calls: list[int] = []

    def once_broken(now, queued, running):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("database is locked")
        real(now, queued, running)

    scheduler._start_queued = once_broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        scheduler.tick()
    scheduler.tick()  # nothing changed, but the last try never went through
    assert len(calls) == 2


def test_a_refused_shape_is_tried_again_only_once_capacity_could_be_free(tmp_path):
    """Passes after a submission or a refused spawn (which change nothing an allocation
    decides on) tell the blocked shapes the reason they were given without an attempt under
    the ledger lock; any other event, a drain, a minute's age or a release tries again."""
    from datetime import timedelta

    from gpuslice_hub.db.models import utcnow
    from gpuslice_hub.errors import Refused
    from gpuslice_hub.jobs.scheduler import FULL_PASS_SECONDS
    from gpuslice_hub.ledger import Caller
    from tests.jobs.full_cluster import insert_queued

    ledger, scheduler = full_cluster(tmp_path, 1)
    queue(ledger, tmp_path, 12, "preemptible")
    calls = count_allocate_calls(ledger)
    now = utcnow()
    scheduler.tick(now)
    assert sorted(calls) == sorted(p["name"] for p in PROFILES)
    before = waiting(ledger)

    # a job submitted, a spawn refused: the pass runs (something changed), nothing is tried
    (new,) = insert_queued(ledger.db, tmp_path, [("r1", "gpu-1", "preemptible")])
    with pytest.raises(Refused):
        ledger.allocate(Caller("zoe", (), "zoe"), "gpu-1", "")
    calls.clear()
    scheduler.tick(now + timedelta(seconds=1))
    assert calls == []
    after = waiting(ledger)
    assert {i: after[i] for i in before} == before  # the same reasons, nothing rewritten
    assert after[new] == before[2]  # the new gpu-1 job is told its shape's reason

    # any other event may have changed the answer (an allocation: its holder's quota):
    # tried again
    ledger.record_event("idle-culled", "u3", "service", "idle for 2 h", {})
    scheduler.tick(now + timedelta(seconds=2))
    assert sorted(calls) == sorted(p["name"] for p in PROFILES)
    calls.clear()
    insert_queued(ledger.db, tmp_path, [("r2", "gpu-1", "preemptible")])
    scheduler.tick(now + timedelta(seconds=2, microseconds=2))
    assert calls == []

    # a drain (a new generation) may change what fits: tried again
    gpu = ledger.allocations()[0]["assignments"][0]["gpu_uuid"]
    ledger.set_drained(gpu, True, "admin", "maintenance")
    scheduler.tick(now + timedelta(seconds=2, microseconds=3))
    assert sorted(calls) == sorted(p["name"] for p in PROFILES)
    calls.clear()
    scheduler.tick(now + timedelta(seconds=FULL_PASS_SECONDS + 3))  # the minute's retry
    assert sorted(calls) == sorted(p["name"] for p in PROFILES)

    # a slice given back: the head takes it at once
    ledger.set_drained(gpu, False, "admin", "done")
    ledger.release(2, "test", "freed")
    scheduler.tick(now + timedelta(seconds=FULL_PASS_SECONDS + 4))
    assert waiting(ledger)[1][0] == "starting"


@pytest.mark.parametrize("quota", [False, True], ids=["no-quota", "a-quota"])
def test_an_allocation_keeps_a_capacity_refusal_unless_a_quota_bounds_anyone(tmp_path, quota):
    """An allocation only takes capacity: a job refused for lack of it would be refused
    again, and is not tried. Where any quota limits anyone, an allocation moves its holder's
    standing, which is checked first: then it is tried again."""
    from datetime import timedelta

    from gpuslice_hub.db.models import utcnow
    from gpuslice_hub.ledger import Caller
    from tests.jobs.full_cluster import insert_queued

    quotas = {"users": {"someone-else": {"max_slices": 4}}} if quota else None
    ledger, scheduler = full_cluster(tmp_path, 1, quotas=quotas)
    ledger.release(1, "test", "freed")  # one GPU free: room for no gpu-2
    (job,) = insert_queued(ledger.db, tmp_path, [("r1", "gpu-2", "preemptible")])
    calls = count_allocate_calls(ledger)
    now = utcnow()
    scheduler.tick(now)
    assert calls == ["gpu-2"]
    refused = waiting(ledger)[job]
    assert refused[0] == "queued" and refused[1].startswith("No gpu-2 free")

    ledger.allocate(Caller("zoe", (), "zoe"), "share-250", "")  # takes part of the free GPU
    calls.clear()
    scheduler.tick(now + timedelta(seconds=1))
    assert calls == (["gpu-2"] if quota else [])
    assert waiting(ledger)[job] == refused  # and the same answer either way

    calls.clear()
    ledger.release(9, "test", "freed")  # zoe's share back: capacity may be free
    scheduler.tick(now + timedelta(seconds=2))
    assert calls == ["gpu-2"]


def test_a_try_on_the_kept_state_says_what_an_allocation_would_and_sees_other_writers(tmp_path):
    """A pass tries a one-slice job against the ledger as it last saw it, brought up to
    date when the pass began: no transaction where it finds no room, the reason an
    allocation gives, and a slice another process gave back is seen by the next pass."""
    from datetime import timedelta

    from gpuslice_hub.db.models import utcnow
    from gpuslice_hub.errors import Refused
    from gpuslice_hub.ledger import Caller
    from tests.service.conftest import build_ledger

    ledger, scheduler = full_cluster(tmp_path, 1)
    # another process on the same ledger (its own caches): built before the passes, so
    # that what it writes later is a release and nothing else
    other = build_ledger(f"sqlite:///{tmp_path}/ledger.sqlite", profiles=PROFILES, hosts=hosts(1))
    queue(ledger, tmp_path, 12, "preemptible")
    asked: list[str] = []
    real = ledger.allocate

    def allocate(caller, profile, *a, **kw):  # type: ignore[no-untyped-def]
        asked.append(profile)
        return real(caller, profile, *a, **kw)

    ledger.allocate = allocate  # type: ignore[method-assign]
    now = utcnow()
    scheduler.tick(now)
    assert asked == []  # every try refused on the kept state
    jobs = waiting(ledger)
    for job_id, profile in ((2, "gpu-1"), (3, "gpu-2"), (4, "share-250")):
        with pytest.raises(Refused) as refused:
            ledger.try_allocate(Caller(f"r{job_id - 1}", (), "scheduler"), profile, "x", "batch")
        assert jobs[job_id] == ("queued", refused.value.message)

    other.release(1, "test", "freed by another process")
    scheduler.tick(now + timedelta(seconds=1))
    assert waiting(ledger)[1][0] == "starting"
    assert asked and asked[0] == "share-250"
    other.db.dispose()
