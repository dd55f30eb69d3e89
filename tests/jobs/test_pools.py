"""Split pools: the configuration, placement in pools, and borrowing at a window's edges
(the scheduler ticked at chosen instants; the real hub and runner: test_pools_hub.py)."""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select

from gpuslice_hub.admin.split_pools import pool_standing
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.errors import ConfigError, Pending, Refused
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.jobs.windows import parse_windows
from gpuslice_hub.ledger import Caller
from gpuslice_hub.pools import parse_pools
from tests.jobs.full_cluster import PROFILES, IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger

BERLIN = ZoneInfo("Europe/Berlin")
NIGHT = {"night": "02:00-06:00"}
PEOPLE = {"people": {"hosts": ["n000"]}}


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=BERLIN)


def pools(raw, borrowing: str = "", windows=None):
    return parse_pools(raw, borrowing, parse_windows(windows or {}, "UTC"), 200)


# --- configuration ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "borrowing", "needle"),
    [
        (["n000"], "", "must be a dict of name -> pool"),
        ({"peak": {"hosts": ["n000"]}}, "", "(not 'peak')"),
        ({"a b": {"hosts": ["n000"]}}, "", "a name of letters"),
        ({"p": ["n000"]}, "", 'must be a dict like {"hosts"'),
        ({"p": {"host": ["n000"]}}, "", "unknown key 'host'"),
        ({"p": {}}, "", "reserves nothing"),
        ({"p": {"hosts": "n000"}}, "", "reserved_pools.p.hosts: must be a list of strings"),
        ({"p": {"hosts": ["n000"], "groups": [""]}}, "", "non-empty strings"),
        ({}, "night", "has nothing to borrow"),
        (PEOPLE, "weekend", "'weekend' is not a window of JobManager.time_windows (night)"),
    ],
)
def test_a_bad_pool_setting_is_refused_naming_it(raw, borrowing, needle):
    with pytest.raises(ConfigError) as e:
        pools(raw, borrowing, NIGHT)
    assert needle in str(e.value)


def test_pools_must_match_the_inventory_without_overlap_or_taking_everything():
    gpus = [("n000", "G0"), ("n000", "G1"), ("n001", "G2")]
    assert pools({}) is None
    with pytest.raises(ConfigError, match=r"host pattern .gpu-\*. matches no GPU host"):
        pools({"p": {"hosts": ["gpu-*"]}}).check_inventory(gpus)
    with pytest.raises(ConfigError, match="GPU G1 on n000 is in two pools: a, b"):
        pools({"a": {"hosts": ["n000"]}, "b": {"gpus": ["G1"]}}).check_inventory(gpus)
    with pytest.raises(ConfigError, match="reserves every GPU"):
        pools({"a": {"hosts": ["n*"]}}).check_inventory(gpus)
    with pytest.raises(ConfigError, match="host pattern 'n0001' matches no GPU host"):
        pools({"a": {"hosts": ["n000", "n0001"]}}).check_inventory(gpus)
    with pytest.raises(ConfigError, match="'GPU-typo' is no GPU of the inventory"):
        pools({"a": {"hosts": ["n000"], "gpus": ["GPU-typo"]}}).check_inventory(gpus)
    split = pools({"a": {"hosts": ["n000"]}, "b": {"gpus": ["G2"], "groups": ["vision"]}})
    split.check_inventory([*gpus, ("n002", "G3")])
    assert [split.pool_of(h, u) for h, u in gpus] == ["a", "a", "b"]
    assert split.pool_of("n002", "G3") == "peak"
    assert split.entitled(["vision"]) == {"a", "b"}
    assert split.entitled(["physics"]) == {"a"}


# --- placement ----------------------------------------------------------------------------


def manager_with(tmp_path: Path, n_hosts: int = 2, **traits) -> JobManager:
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(n_hosts))
    manager = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs", **traits)  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    ledger.preempt_hook = manager.preempt_for_interactive  # as start_jobs does
    return manager


def person(name: str, groups: tuple[str, ...] = ()) -> Caller:
    return Caller(name, groups, name)


def test_people_take_the_reserved_pool_first_and_batch_never_does(tmp_path):
    ledger = manager_with(tmp_path, reserved_pools=PEOPLE).ledger
    first, _ = ledger.allocate(person("ann"), "gpu-1", "")
    assert first["host"] == "n000"
    batch = [
        ledger.allocate(person(f"b{i}"), "gpu-1", f"job-{i}", purpose="batch", priority=100)[0]
        for i in range(8)
    ]
    assert {a["host"] for a in batch} == {"n001"}
    with pytest.raises(Refused) as e:
        ledger.allocate(person("b9"), "gpu-1", "job-9", purpose="batch", priority=100)
    assert e.value.code == "no_capacity"
    assert e.value.message.startswith("No gpu-1 free (8 of 8 in use)")
    assert e.value.message.endswith(
        "(7 more free in reserved pool(s) people, kept for interactive use; batch jobs never "
        "borrow them)"
    )
    # high-priority work is served by the reserved pool (once the peak pool is full)
    high, _ = ledger.allocate(person("hi"), "gpu-1", "job-h", purpose="batch", priority=200)
    assert high["host"] == "n000"
    # the spawn form counts what a server may take, and says how much of it is reserved
    form = {p["name"]: p for p in ledger.availability("bob", ())}
    assert (form["gpu-1"]["free"], form["gpu-1"]["total"]) == (6, 16)
    assert form["gpu-1"]["reserved_free"] == 6
    # a full reserved pool: people spill into the peak pool (here full of batch: none)
    for i in range(6):
        assert ledger.allocate(person(f"p{i}"), "gpu-1", "")[0]["host"] == "n000"
    with pytest.raises((Refused, Pending)):
        ledger.allocate(person("late"), "gpu-1", "", wait_seconds=0)


def test_a_group_pool_serves_only_its_group(tmp_path):
    ledger = manager_with(
        tmp_path, reserved_pools={"vision": {"hosts": ["n000"], "groups": ["vision"]}}
    ).ledger
    assert ledger.allocate(person("ann"), "gpu-1", "")[0]["host"] == "n001"
    assert ledger.allocate(person("vic", ("vision",)), "gpu-1", "")[0]["host"] == "n000"
    assert {p["name"]: p for p in ledger.availability("ann", ())}["gpu-1"]["total"] == 8
    vision = {p["name"]: p for p in ledger.availability("vic", ("vision",))}["gpu-1"]
    assert (vision["free"], vision["total"], vision["reserved_free"]) == (14, 16, 7)


# --- borrowing at the window's edges ------------------------------------------------------


def job(scheduler: Scheduler, job_id: int) -> JobRow:
    with scheduler.jobs.db.reading() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        s.expunge(row)
        return row


def last_reason(scheduler: Scheduler, job_id: int) -> str:
    with scheduler.jobs.db.reading() as s:
        row = s.scalars(select(JobRow).where(JobRow.id == job_id)).one()
        return row.transitions[-1].reason


def hosts_of(scheduler: Scheduler, job_id: int) -> set[str]:
    ids = set(job(scheduler, job_id).allocation_ids or [])
    return {a["host"] for a in scheduler.jobs.ledger.allocations() if a["id"] in ids}


def test_preemptible_jobs_borrow_reserved_gpus_only_inside_the_window(tmp_path):
    manager = manager_with(
        tmp_path,
        reserved_pools=PEOPLE,
        reserved_pool_borrowing="night",
        time_windows=NIGHT,
        time_window_timezone="Europe/Berlin",
    )
    scheduler = Scheduler(manager)
    ids = insert_queued(
        manager.db,
        tmp_path,
        [(f"u{i}", "gpu-1", "preemptible") for i in range(16)] + [("nora", "gpu-1", "normal")],
    )
    *preemptible, normal = ids
    state = lambda: {i: job(scheduler, i).state for i in ids}  # noqa: E731

    # Friday 18:00: the peak pool takes eight (the normal job first); the other nine
    # wait beside the idle reserved pool
    scheduler.tick(at("2026-12-04 18:00"))
    assert hosts_of(scheduler, normal) == {"n001"}
    peak = [i for i in preemptible if state()[i] == "starting"]
    assert len(peak) == 7 and all(hosts_of(scheduler, i) == {"n001"} for i in peak)
    reason = job(scheduler, preemptible[-1]).waiting_reason
    assert reason is not None and reason.endswith(
        "(8 more free in reserved pool(s) people, kept for interactive use; preemptible jobs "
        "borrow them 02:00-06:00 (Europe/Berlin))"
    )
    assert scheduler._next_due == at("2026-12-05 02:00")

    # 02:00: eight of them borrow the reserved pool
    scheduler.tick(at("2026-12-05 02:00"))
    borrowers = [i for i in preemptible if i not in peak and state()[i] == "starting"]
    assert len(borrowers) == 8 and all(hosts_of(scheduler, i) == {"n000"} for i in borrowers)

    # a person arriving in the night preempts a borrower (the newest start)
    with pytest.raises(Pending):
        manager.ledger.allocate(person("ann"), "gpu-1", "", wait_seconds=3600)
    taken = [i for i in ids if state()[i] == "preempting"]
    assert len(taken) == 1 and taken[0] in borrowers

    # a normal job never borrows: it preempts a peak-pool job instead
    (late,) = insert_queued(manager.db, tmp_path, [("nils", "gpu-1", "normal")])
    scheduler.tick(at("2026-12-05 02:01"))
    assert job(scheduler, late).state == "queued"
    evicted = [i for i in peak if state()[i] == "preempting"]
    assert len(evicted) == 1

    # 06:00: what is still borrowed is returned; the peak pool's jobs run on
    scheduler.tick(at("2026-12-05 05:59:59"))
    assert sum(s == "preempting" for s in state().values()) == 2
    scheduler.tick(at("2026-12-05 06:00"))
    returned = [i for i in borrowers if i not in taken]
    assert all(state()[i] == "preempting" for i in returned)
    assert last_reason(scheduler, returned[0]) == (
        "the reserved pool people is returned to interactive use: its borrowing window "
        "02:00-06:00 (Europe/Berlin) closed (by scheduler)"
    )
    assert all(state()[i] == "starting" for i in [normal, *peak] if i not in evicted)


def test_high_jobs_take_the_peak_pool_first_then_the_reserved_one_and_stay(tmp_path):
    manager = manager_with(
        tmp_path,
        reserved_pools=PEOPLE,
        reserved_pool_borrowing="night",
        time_windows=NIGHT,
        time_window_timezone="Europe/Berlin",
    )
    scheduler = Scheduler(manager)
    ids = insert_queued(manager.db, tmp_path, [(f"h{i}", "gpu-2", "high") for i in range(5)])
    scheduler.tick(at("2026-12-05 03:00"))
    # four fill the idle peak pool before any takes a GPU kept for people
    assert [hosts_of(scheduler, i) for i in ids] == [{"n001"}] * 4 + [{"n000"}]
    scheduler.tick(at("2026-12-05 06:00"))
    assert all(job(scheduler, i).state == "starting" for i in ids)


def test_a_high_job_blocked_in_its_pools_holds_up_no_job_of_other_pools(tmp_path):
    manager = manager_with(
        tmp_path, reserved_pools={"vision": {"hosts": ["n000"], "groups": ["vision"]}}
    )
    scheduler = Scheduler(manager)
    for i in range(8):  # the peak pool full of people
        manager.ledger.allocate(person(f"p{i}"), "gpu-1", "")
    hana, vic = insert_queued(manager.db, tmp_path, [("hana", "gpu-1", "high")] * 2)
    with manager.db.writing() as s:
        row = s.get(JobRow, vic)
        assert row is not None
        row.user, row.groups = "vic", ["vision"]
    scheduler.tick(at("2026-12-05 12:00"))
    assert hosts_of(scheduler, vic) == {"n000"}
    assert job(scheduler, hana).waiting_reason == (
        "No gpu-1 free (8 of 8 in use) (8 more free in reserved pool(s) vision, which serve "
        "other groups)"
    )


def test_a_person_is_told_nothing_of_pools_they_cannot_use(tmp_path):
    ledger = manager_with(
        tmp_path, reserved_pools={"vision": {"hosts": ["n000"], "groups": ["vision"]}}
    ).ledger
    for i in range(8):
        ledger.allocate(person(f"p{i}"), "gpu-1", "")
    with pytest.raises(Refused) as e:
        ledger.allocate(person("ann"), "gpu-1", "", wait_seconds=0)
    assert e.value.message == "No gpu-1 free (8 of 8 in use)"


def test_a_person_preempts_a_borrower_of_their_pool_before_a_peak_job(tmp_path):
    manager = manager_with(
        tmp_path,
        reserved_pools=PEOPLE,
        reserved_pool_borrowing="night",
        time_windows=NIGHT,
        time_window_timezone="Europe/Berlin",
    )
    scheduler = Scheduler(manager)
    ids = insert_queued(
        manager.db, tmp_path, [(f"u{i}", "gpu-1", "preemptible") for i in range(16)]
    )
    scheduler.tick(at("2026-12-05 03:00"))
    peak = [i for i in ids if hosts_of(scheduler, i) == {"n001"}]
    # a peak-pool job started last: by start alone it would be the one to go
    with manager.db.writing() as s:
        row = s.get(JobRow, peak[0])
        assert row is not None
        row.attempt_started_at = at("2026-12-05 04:00")
    with pytest.raises(Pending):
        manager.ledger.allocate(person("ann"), "gpu-1", "", wait_seconds=3600)
    (taken,) = [i for i in ids if job(scheduler, i).state == "preempting"]
    assert hosts_of(scheduler, taken) == {"n000"}


def test_a_normal_job_in_a_pool_reserved_after_it_started_keeps_its_slice(tmp_path):
    manager = manager_with(tmp_path, time_windows=NIGHT, time_window_timezone="Europe/Berlin")
    scheduler = Scheduler(manager)
    (normal,) = insert_queued(manager.db, tmp_path, [("nora", "gpu-1", "normal")])
    scheduler.tick(at("2026-12-05 12:00"))
    assert hosts_of(scheduler, normal) == {"n000"}
    manager.pools = manager.ledger.pools = pools(PEOPLE, "night", NIGHT)
    scheduler.tick(at("2026-12-05 12:01"))
    assert job(scheduler, normal).state == "starting"


def test_pool_figures_count_a_drained_gpu_as_capacity_not_as_free(tmp_path):
    ledger = manager_with(tmp_path, reserved_pools=PEOPLE).ledger
    held, _ = ledger.allocate(person("ann"), "gpu-1", "")
    ledger.set_drained(held["assignments"][0]["gpu_uuid"], True, "admin", "maintenance")
    people = next(
        p for p in pool_standing(ledger, datetime.now(BERLIN))["pools"] if p["name"] == "people"
    )
    assert (people["gpus"], people["drained_gpus"]) == (8, 1)
    assert (people["capacity_milli"], people["in_service_milli"]) == (8000, 7000)
    assert (people["interactive_milli"], people["free_milli"]) == (1000, 7000)


def test_pools_are_refused_for_an_engine_that_places_jobs_itself(tmp_path):
    from types import SimpleNamespace

    from gpuslice_hub.jobs.setup import check_job_settings

    manager = manager_with(tmp_path, reserved_pools=PEOPLE)
    app = SimpleNamespace(job_backend="slurm", log=None)
    with pytest.raises(ConfigError, match=r"JobManager\.reserved_pools.*Slurm partitions"):
        check_job_settings(app, manager)  # type: ignore[arg-type]


def test_a_borrowing_window_preemptible_jobs_can_never_use_is_refused(tmp_path):
    windows = {"night": "02:00-06:00", "day": "mon-fri 09:00-17:00"}
    with pytest.raises(ConfigError, match="never overlaps the time window preemptible jobs"):
        manager_with(
            tmp_path,
            reserved_pools=PEOPLE,
            reserved_pool_borrowing="night",
            time_windows=windows,
            class_time_windows={"preemptible": "day"},
        )
    manager_with(
        tmp_path,
        reserved_pools=PEOPLE,
        reserved_pool_borrowing="day",
        time_windows=windows,
        class_time_windows={"preemptible": "day"},
    )


def test_the_kept_restricted_arrays_follow_every_change_of_the_ledger(tmp_path):
    """The ledger keeps each pool set's arrays between decisions (FGD's scores survive):
    after any mix of allocations and releases they equal arrays restricted afresh."""
    import numpy as np

    from gpuslice_hub.pools import PEAK, _restricted

    ledger = manager_with(tmp_path, n_hosts=3, reserved_pools=PEOPLE).ledger
    held = []
    for i in range(30):
        purpose = "batch" if i % 3 else "interactive"
        profile = ("share-250", "gpu-1", "gpu-2")[i % 3]
        with contextlib.suppress(Refused):
            held.append(ledger.allocate(person(f"u{i}"), profile, f"s{i}", purpose=purpose)[0])
        if i % 4 == 3:
            ledger.release(held.pop(0)["id"], "test", "churn")
        with ledger.db.reading() as s:
            inv = ledger.inventory_cache.get(s)
            with ledger.cluster_cache.use(inv, ledger.active_cache.state(s)) as state:
                assert state is not None
                for allowed in (frozenset({PEAK}), frozenset({"people"})):
                    kept = ledger._within(state, allowed, inv.generation, keep=True)
                    fresh = _restricted(state, ledger.pools.mask(state, allowed, None))
                    for name in ("gpu_ok", "gpu_free", "mig_ok", "mig_free", "cpu_free"):
                        assert np.array_equal(getattr(kept, name), getattr(fresh, name)), name
