"""The ledger against real SQLite and PostgreSQL: placement, refusals, release, restart."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from gpuslice_hub.clusterview import ClusterCache, build_hosts
from gpuslice_hub.db.engine import open_database
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.errors import Refused
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.placement import get_policy
from gpuslice_hub.placement.state import from_hosts
from gpuslice_hub.quotas import Held, Holding, Usage
from gpuslice_hub.snapshot import ActiveCache, load_active
from tests.harness.hub import SIM_PROFILES

from .conftest import build_ledger

ANN = Caller("ann", (), "ann")
PHYS = Caller("pia", ("physics",), "pia")


def test_mig_slices_are_handed_out_once_then_refused_with_alternatives(make_ledger):
    ledger = make_ledger()
    a, created = ledger.allocate(ANN, "mig-1g.10gb", "one")
    b, _ = ledger.allocate(ANN, "mig-1g.10gb", "two")
    assert created
    migs = {a["assignments"][0]["mig_uuid"], b["assignments"][0]["mig_uuid"]}
    assert len(migs) == 2 and all(m.startswith("MIG-sim-") for m in migs)
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "mig-1g.10gb", "three")
    err = info.value
    assert err.code == "no_capacity"
    assert err.message.startswith("No mig-1g.10gb free (2 of 2 in use); ")
    # the two plain GPUs take 8 quarter shares, or 2 whole GPUs
    assert "share-250 has 8 free" in err.message and "gpu-1 has 2 free" in err.message
    # mig-3g.40gb is for physics only, so it is not offered to ann as an alternative
    assert "mig-3g.40gb" not in err.message
    refused = [e for e in ledger.events(user="ann") if e["kind"] == "refused"]
    assert len(refused) == 1 and refused[0]["detail"]["code"] == "no_capacity"


def test_a_refusal_names_profiles_as_the_spawn_form_does(make_ledger):
    """A person reads the refusal: every profile in it, the one refused and those still
    free, by its display name (issue 44: "No mig-1g.10gb free …; share-250 has 7 free"
    under a form that says "Quarter GPU"). The event keeps the profile's name for admins."""
    shown = {
        "mig-1g.10gb": "Small MIG slice",
        "mig-3g.40gb": "Medium MIG slice",
        "share-250": "Quarter GPU",
        "gpu-1": "Whole GPU",
    }
    profiles = [{**p, "display_name": shown[p["name"]]} for p in SIM_PROFILES]
    ledger = make_ledger(profiles=profiles)
    for server in ("one", "two"):
        ledger.allocate(ANN, "mig-1g.10gb", server)
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "mig-1g.10gb", "three")
    assert info.value.message == (
        "No Small MIG slice free (2 of 2 in use); Quarter GPU has 8 free, Whole GPU has 2 free"
    )
    assert info.value.detail["alternatives"] == ["Quarter GPU has 8 free", "Whole GPU has 2 free"]
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "mig-3g.40gb", "four")
    assert info.value.message == "Medium MIG slice is not allowed for your groups"
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "gpu-1", "one")
    assert info.value.code == "server_holds_allocation"
    assert "(Small MIG slice); release it first" in info.value.message
    refused = [e for e in ledger.events(user="ann") if e["kind"] == "refused"]
    assert [e["profile"] for e in refused] == ["mig-3g.40gb", "mig-1g.10gb"]


def test_shares_pack_and_respect_memory_caps(make_ledger):
    ledger = make_ledger(
        profiles=[{"name": "big-share", "kind": "share", "gpu_milli": 100, "gpu_memory_mib": 40960}]
    )
    # 2 plain GPUs of 80 GiB: memory caps allow 2 per GPU although compute would allow 10
    got = [ledger.allocate(ANN, "big-share", f"s{i}")[0] for i in range(4)]
    per_gpu: dict[str, int] = {}
    for a in got:
        per_gpu[a["assignments"][0]["gpu_uuid"]] = (
            per_gpu.get(a["assignments"][0]["gpu_uuid"], 0) + 1
        )
    assert sorted(per_gpu.values()) == [2, 2]
    with pytest.raises(Refused):
        ledger.allocate(ANN, "big-share", "s5")


def test_same_server_is_idempotent_and_conflicting_profile_refused(make_ledger):
    ledger = make_ledger()
    a, created = ledger.allocate(ANN, "share-250", "")
    again, created_again = ledger.allocate(ANN, "share-250", "")
    assert created and not created_again and again["id"] == a["id"]
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "gpu-1", "")
    assert info.value.code == "server_holds_allocation"
    assert info.value.detail["allocation_id"] == a["id"]
    assert len(ledger.allocations(user="ann")) == 1


def test_release_happens_exactly_once(make_ledger):
    ledger = make_ledger()
    a, _ = ledger.allocate(ANN, "gpu-1", "")
    first, released = ledger.release(a["id"], "ann", "server stopped")
    second, released_again = ledger.release(a["id"], "ann", "server stopped")
    assert released and not released_again
    assert first["state"] == second["state"] == "released"
    assert [e["kind"] for e in ledger.events(user="ann")].count("released") == 1
    # the GPU is free again
    assert (
        ledger.allocate(ANN, "gpu-1", "")[0]["assignments"][0]["gpu_uuid"]
        == a["assignments"][0]["gpu_uuid"]
    )
    with pytest.raises(Refused) as info:
        ledger.release(9999, "ann", "x")
    assert info.value.code == "not_found"


def test_forbidden_profile_and_quota_refusals_write_nothing_but_an_event(make_ledger):
    ledger = make_ledger(
        quotas={"default_user": {"max_slices": 1}, "groups": {"physics": {"max_milli": 500}}}
    )
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "mig-3g.40gb", "")
    assert info.value.code == "forbidden_profile" and "not allowed" in info.value.message
    ledger.allocate(ANN, "share-250", "a")
    with pytest.raises(Refused) as info:
        ledger.allocate(ANN, "share-250", "b")
    assert (
        info.value.code == "over_quota"
        and "over your quota (1 of 1 slice in use; this needs 1 slice)" in info.value.message
    )
    # physics: the 3g instance is 428 milli; a second slice would pass 500 milli
    ledger.allocate(PHYS, "mig-3g.40gb", "")
    with pytest.raises(Refused) as info:
        ledger.allocate(PHYS, "share-250", "x")
    assert "over your quota" in info.value.message or "group physics" in info.value.message
    assert len(ledger.allocations()) == 2
    codes = [e["detail"].get("code") for e in ledger.events() if e["kind"] == "refused"]
    assert sorted(codes) == ["forbidden_profile", "over_quota", "over_quota"]


def test_availability_says_why_not(make_ledger):
    ledger = make_ledger(quotas={"default_user": {"max_slices": 2}})
    for name in ("one", "two"):
        ledger.allocate(ANN, "mig-1g.10gb", name)
    by_name = {p["name"]: p for p in ledger.availability("ann", ())}
    assert by_name["mig-1g.10gb"]["free"] == 0 and by_name["mig-1g.10gb"]["total"] == 2
    assert by_name["mig-1g.10gb"]["reason"] == "all in use (2 of 2 in use)"
    assert by_name["mig-3g.40gb"]["reason"] == "not allowed for your groups"
    assert by_name["share-250"]["free"] == 8
    assert by_name["share-250"]["reason"] == (
        "over your quota (2 of 2 slices in use; this needs 1 slice)"
    )
    other = {p["name"]: p for p in ledger.availability("bob", ())}
    assert other["share-250"]["available"] and other["share-250"]["reason"] is None


def test_a_profile_a_spawn_would_get_by_preemption_is_offered(make_ledger):
    ledger = make_ledger()
    for name in ("one", "two"):  # none of mig-1g.10gb is free for ann
        ledger.allocate(Caller("joe", (), "joe"), "mig-1g.10gb", name)
    asked: list[tuple] = []
    answer: float | str | None = None

    def spawn_preemption(caller, profiles, overcommit, wait_seconds):  # the job manager's
        asked.extend((caller.user, p.name, overcommit, wait_seconds) for p in profiles)
        return {p.name: answer for p in profiles}

    def mig() -> dict:
        listed = ledger.availability("ann", (), False, 90.0)
        return {p["name"]: p for p in listed}["mig-1g.10gb"]

    # no job manager: all in use
    assert mig()["reason"] == "all in use (2 of 2 in use)"
    ledger.spawn_preemption = spawn_preemption
    assert mig()["reason"] == "all in use (2 of 2 in use)" and "from_batch" not in mig()
    # asked only of a profile none of which is free, as the spawn would be placed
    assert set(asked) == {("ann", "mig-1g.10gb", False, 90.0)}
    answer = 60.0  # a job would give its slice up within the spawner's wait
    offered = mig()
    assert offered["free"] == 0 and offered["available"] and offered["reason"] is None
    assert (offered["from_batch"], offered["from_batch_seconds"]) == (True, 60.0)
    answer = "batch job 7 could give its slice up, but it may take up to 600 s"
    assert not mig()["available"] and mig()["reason"] == answer


def test_a_new_ledger_on_the_same_database_sees_the_same_allocations(make_ledger, db_url):
    ledger = make_ledger()
    held = {ledger.allocate(ANN, p, p)[0]["id"] for p in ("mig-1g.10gb", "share-250", "gpu-1")}
    ledger.db.dispose()
    again = make_ledger()  # re-syncs the same inventory: nothing held may change
    assert {a["id"] for a in again.allocations()} == held
    by_profile = {p["name"]: p["free"] for p in again.availability("bob", ())}
    assert by_profile["mig-1g.10gb"] == 1 and by_profile["gpu-1"] == 0


def test_reconcile_releases_only_allocations_of_vanished_servers_past_grace(make_ledger):
    ledger = make_ledger()
    kept, _ = ledger.allocate(ANN, "share-250", "running")
    gone, _ = ledger.allocate(ANN, "share-250", "gone")
    young, _ = ledger.allocate(ANN, "share-250", "starting")
    later = utcnow() + timedelta(seconds=30)
    released = ledger.reconcile_servers({("ann", "running")}, timedelta(seconds=10), now=later)
    assert sorted(released) == sorted([gone["id"], young["id"]])
    assert ledger.get(kept["id"])["state"] == "active"
    # a server that is still starting (allocation younger than the grace) is left alone
    fresh, _ = ledger.allocate(ANN, "share-250", "fresh")
    assert ledger.reconcile_servers({("ann", "running")}, timedelta(seconds=3600)) == []
    assert ledger.get(fresh["id"])["state"] == "active"
    assert ledger.get(gone["id"])["release_reason"] == "server no longer exists on the hub"


def test_a_server_the_hub_reports_stopped_is_released_whatever_its_age(make_ledger):
    """After a clean hub restart every server's own release had failed, and the reconciler
    left each slice younger than the grace alone: 45 of them held 61 s after the hub was
    back (issue 46). What the hub reports stopped is released at once; the grace is kept
    for what it cannot tell about yet."""
    ledger = make_ledger()
    grace = timedelta(seconds=120)
    stopped, _ = ledger.allocate(ANN, "share-250", "stopped")
    # a spawn: the hub lists its server as starting (pending "spawn"), so it is existing
    spawning, _ = ledger.allocate(ANN, "share-250", "spawning")
    # the hub could not tell (no such user): the grace, as before
    unknown, _ = ledger.allocate(ANN, "share-250", "unknown")
    asked = utcnow()
    # granted after the hub was asked: its stopped server may be a new spawn's, not listed yet
    late, _ = ledger.allocate(ANN, "share-250", "late")
    released = ledger.reconcile_servers(
        {("ann", "spawning")},
        grace,
        only={("ann", "unknown")},
        stopped={("ann", "stopped"): asked, ("ann", "late"): asked},
    )
    assert released == [stopped["id"]]
    assert ledger.get(stopped["id"])["release_reason"] == "server stopped on the hub"
    for kept in (spawning, unknown, late):
        assert ledger.get(kept["id"])["state"] == "active"
    # once the grace has passed, the one the hub could not tell about goes too
    later = utcnow() + grace
    assert ledger.reconcile_servers({("ann", "spawning")}, grace, later, {("ann", "unknown")}) == [
        unknown["id"]
    ]
    assert ledger.servers_missing({("ann", "spawning")}, timedelta(0)) == {("ann", "late")}


def test_vanished_gpu_is_not_placed_but_its_holder_keeps_it(make_ledger, db_url):
    ledger = make_ledger()
    a, _ = ledger.allocate(ANN, "gpu-1", "one")
    b, _ = ledger.allocate(ANN, "gpu-1", "two")
    smaller = [
        {
            "name": "node-a",
            "cpu_milli": 32000,
            "memory_mib": 256000,
            "gpus": [
                {
                    "model": "NVIDIA A100-SXM4-80GB",
                    "memory_mib": 81920,
                    "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
                },
                {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920},
            ],
        }
    ]
    ledger2 = build_ledger(db_url, hosts=smaller)
    try:
        # the GPU behind b is gone from discovery; b still holds it until released
        assert ledger2.get(a["id"])["state"] == ledger2.get(b["id"])["state"] == "active"
        free = {p["name"]: p for p in ledger2.availability("bob", ())}
        assert (free["gpu-1"]["total"], free["gpu-1"]["free"]) == (1, 0)
        ledger2.release(b["id"], "ann", "done")
        assert {p["name"]: p for p in ledger2.availability("bob", ())}["gpu-1"]["free"] == 0
    finally:
        ledger2.db.dispose()


def test_usage_reports_need_no_ledger_lock_and_never_collide(make_ledger):
    import contextlib
    from concurrent.futures import ThreadPoolExecutor

    from sqlalchemy import select

    from gpuslice_hub.db.admin_models import UsageReportRow

    ledger = make_ledger()
    alloc, _ = ledger.allocate(ANN, "share-250", "s")
    # On PostgreSQL another transaction holds the ledger lock (an allocation in progress)
    # meanwhile; SQLite has one writer at a time whatever the lock.
    held = ledger.db.writing() if not ledger.db.is_sqlite else contextlib.nullcontext()
    with ThreadPoolExecutor(8) as pool, held:
        done = list(
            pool.map(
                lambda i: ledger.record_usage(alloc["id"], i / 100, 100.0 + i, 0.0, 60.0),
                range(40),
            )
        )
    assert len(done) == 40
    with ledger.db.reading() as s:
        rows = list(s.scalars(select(UsageReportRow)))
    assert len(rows) == 1 and rows[0].allocation_id == alloc["id"]
    assert rows[0].memory_mib == 100.0 + round(rows[0].utilization * 100)


def _state(views) -> list[tuple]:
    return sorted(
        (v.id, v.user, v.profile, sorted((c.gpu_uuid, c.mig_uuid or "", c.milli) for c in v.claims))
        for v in views
    )


def _held(held: Held) -> tuple[dict, dict]:
    """Held totals with the float sums rounded (added in another order, they may differ
    in the last bits)."""
    return tuple(
        {k: (round(u.slices, 9), u.milli) for k, u in totals.items() if u.slices or u.milli}
        for totals in (held.users, held.groups)
    )


def test_the_active_cache_follows_every_change_without_reading_everything(make_ledger, db_url):
    """Each spawn used to reread every held slice. The cache follows the events instead,
    and what it holds is always what a full read says, also for writes made by another
    ledger on the same database (another process, an admin command)."""
    mine = make_ledger(
        hosts=[
            {
                "name": f"h{i}",
                "cpu_milli": 64000,
                "memory_mib": 512000,
                "gpus": [
                    {
                        "model": "NVIDIA A100-SXM4-80GB",
                        "memory_mib": 81920,
                        "count": 2,
                        **({"mig": ["1g.10gb"] * 7} if i % 2 else {}),
                    }
                ],
            }
            for i in range(4)
        ],
        # charged to groups, some borrowed: what each holds is kept as slices come and go
        quotas={
            "default_user": {"max_slices": 6},
            "groups": {
                "physics": {"max_slices": 3, "borrow_from": ["chem"]},
                "chem": {"max_slices": 4, "max_milli": 3000},
            },
        },
    )
    # the same database and inventory, its own caches (another process, an admin command)
    other = Ledger(open_database(db_url), mine.profiles, mine.quotas, get_policy("best-fit"))
    callers = [ANN, PHYS, Caller("cy", ("chem",), "cy"), Caller("pc", ("physics", "chem"), "pc")]
    charged_groups: set[str] = set()
    rng = random.Random(7)
    held: list[tuple[Ledger, int]] = []
    mine.snapshot()
    mine.profile_capacity()  # builds the arrays once
    assert mine.active_cache.full_reads == 1
    last_reads = 1
    for step in range(60):
        ledger = mine if rng.random() < 0.7 else other
        if held and rng.random() < 0.4:
            _, alloc_id = held.pop(rng.randrange(len(held)))
            ledger.release(alloc_id, "test", "done")
        else:
            profile = rng.choice(["share-250", "mig-1g.10gb", "gpu-1"])
            try:
                alloc, _ = ledger.allocate(rng.choice(callers), profile, f"s{step}")
            except Refused:
                continue
            held.append((ledger, alloc["id"]))
        with mine.db.reading() as s:
            active = mine.active_cache.get(s)
            assert _state(active) == _state(load_active(s))
            charged_groups |= set(mine.active_cache.held().groups)
            assert _held(mine.active_cache.held()) == _held(
                Held.of(
                    Holding(a.user, a.charged_group, Usage(a.quota_weight, a.gpu_milli))
                    for a in load_active(s)
                )
            )
            inv = mine.inventory_cache.get(s)
            rebuilt = mine.cluster_cache.rows_rebuilt
            compared = mine.cluster_cache.views_compared
            reads = mine.active_cache.full_reads
            with mine.cluster_cache.use(inv, mine.active_cache.state(s)) as kept:
                fresh = from_hosts(build_hosts(inv.hosts, inv.gpus, load_active(s)))
                for name in ("cpu_free", "mem_free", "gpu_free", "gpu_mem_free", "mig_free"):
                    assert (getattr(kept, name) == getattr(fresh, name)).all(), name
            # only the hosts a change touched are rebuilt (a release and an allocation
            # by the other ledger since the last look: at most two), found from the active
            # cache's journal without comparing the held views one by one
            assert mine.cluster_cache.rows_rebuilt - rebuilt <= 2
            if mine.active_cache.full_reads == reads == last_reads:
                assert mine.cluster_cache.views_compared == compared
            last_reads = mine.active_cache.full_reads
    assert {a["id"] for a in mine.allocations()} == {i for _, i in held}
    assert charged_groups == {"physics", "chem"}
    # one full read at the start; every later change was followed from the events
    assert mine.active_cache.full_reads == 1
    other.db.dispose()


def test_the_active_cache_takes_its_own_writes_without_reading_them_back(
    make_ledger, db_url, monkeypatch
):
    """A ledger's own allocations and releases are followed from what it wrote: the next
    spawn reads no allocation again, and the views it keeps are exactly what a full read
    returns (claim ids, times, groups). A write that rolls back leaves the cache as it
    was; a write by another ledger is read back as before."""
    mine = make_ledger()
    other = Ledger(open_database(db_url), mine.profiles, mine.quotas, get_policy("best-fit"))
    mine.snapshot()  # the first, full read
    caller = Caller("ann", ("physics",), "ann")

    def same_as_a_full_read() -> None:
        with mine.db.reading() as s:
            kept = {v.id: v for v in mine.active_cache.get(s)}
            assert kept == {v.id: v for v in load_active(s)}

    held = []
    for i, profile in enumerate(["share-250", "gpu-1", "mig-1g.10gb", "share-250"]):
        alloc, _ = mine.allocate(caller, profile, f"s{i}")
        held.append(alloc["id"])
    mine.release(held.pop(1), "test", "done")
    same_as_a_full_read()
    assert mine.active_cache.read_back == 0

    # rolled back after the rows and the event were written: nothing of it is kept
    import gpuslice_hub.ledger.allocation as allocation_module

    def broken(*args, **kwargs):
        raise RuntimeError("serializing failed")

    monkeypatch.setattr(allocation_module, "allocation_json", broken)
    with pytest.raises(RuntimeError):
        mine.allocate(caller, "gpu-1", "rolled-back")
    monkeypatch.undo()
    same_as_a_full_read()
    assert len(mine.allocations()) == len(held)

    # another writer's change in between: read back, and the own writes after it followed
    theirs, _ = other.allocate(ANN, "gpu-1", "theirs")
    mine.allocate(caller, "mig-1g.10gb", "after-theirs")
    same_as_a_full_read()
    assert mine.active_cache.read_back == 1
    other.release(theirs["id"], "test", "done")
    same_as_a_full_read()
    assert mine.active_cache.read_back == 2
    assert mine.active_cache.full_reads == 1
    other.db.dispose()


def test_a_failure_after_the_commit_keeps_the_write_and_reads_everything_again(
    make_ledger, monkeypatch, caplog
):
    """The allocation committed: it stands and is returned; the cache, taken part of the way,
    reads everything at the next look rather than miss a change."""
    ledger = make_ledger()
    ledger.snapshot()

    def broken(self, own):
        raise RuntimeError("following failed")

    monkeypatch.setattr(ActiveCache, "_take_own", broken)
    alloc, created = ledger.allocate(ANN, "share-250", "one")
    monkeypatch.undo()
    assert created and "following failed" in caplog.text
    assert [a["id"] for a in ledger.allocations()] == [alloc["id"]]
    with ledger.db.reading() as s:
        assert [v.id for v in ledger.active_cache.get(s)] == [alloc["id"]]
    assert ledger.active_cache.full_reads == 2


def test_kept_arrays_place_exactly_as_arrays_built_afresh(tmp_path):
    """The default policy keeps per-host scores between decisions; a host whose row was
    rebuilt must be scored again. Two ledgers, one keeping its arrays and one building them
    for every decision, make the same placements through a long mixed sequence."""

    class Afresh(ClusterCache):
        def _bring_up_to_date(self, inv, views):
            self._state = None
            return super()._bring_up_to_date(inv, views)

    hosts = [
        {
            "name": f"h{i}",
            "cpu_milli": 64000,
            "memory_mib": 512000,
            "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 4}],
        }
        for i in range(6)
    ]
    profiles = [
        {"name": "share-100", "kind": "share", "gpu_milli": 100, "gpu_memory_mib": 8192},
        {"name": "share-500", "kind": "share", "gpu_milli": 500, "gpu_memory_mib": 40960},
        {"name": "gpu-1", "kind": "gpu", "count": 1},
        {"name": "gpu-2", "kind": "gpu", "count": 2},
    ]
    kept = build_ledger(f"sqlite:///{tmp_path}/a.sqlite", profiles, hosts=hosts, policy="default")
    fresh = build_ledger(f"sqlite:///{tmp_path}/b.sqlite", profiles, hosts=hosts, policy="default")
    fresh.cluster_cache = Afresh()
    rng = random.Random(11)
    held: list[tuple[int, int]] = []
    placed = 0
    for step in range(300):
        if held and rng.random() < 0.45:
            a, b = held.pop(rng.randrange(len(held)))
            kept.release(a, "test", "done")
            fresh.release(b, "test", "done")
            continue
        profile = rng.choice([p["name"] for p in profiles])
        outcome = []
        for ledger in (kept, fresh):
            try:
                alloc, _ = ledger.allocate(ANN, profile, f"s{step}")
            except Refused as e:
                outcome.append(("refused", e.code))
                continue
            where = [alloc["host"]] + [(x["gpu_index"], x["milli"]) for x in alloc["assignments"]]
            outcome.append((alloc["id"], where))
        assert outcome[0][1:] == outcome[1][1:], (step, profile, outcome)
        if outcome[0][0] != "refused":
            held.append((outcome[0][0], outcome[1][0]))
            placed += 1
    assert placed > 100 and kept.cluster_cache.rows_rebuilt < 2 * 300
    kept.db.dispose()
    fresh.db.dispose()


def test_every_refusal_code_has_an_http_status_and_a_meaning():
    """The core refuses with codes; api/ alone maps them to HTTP statuses."""
    from gpuslice_hub.api.base import STATUS_BY_CODE
    from gpuslice_hub.errors import REFUSAL_CODES

    assert set(STATUS_BY_CODE) == set(REFUSAL_CODES)
    assert all(400 <= s < 500 for s in STATUS_BY_CODE.values())
    with pytest.raises(ValueError, match="unknown refusal code"):
        Refused("nope", "a code nobody maps")


def test_a_failure_while_following_changes_rebuilds_the_arrays_next_time(make_ledger, monkeypatch):
    """Placing on rows that missed a change would double-book: a failure halfway through
    following the changes makes the next look rebuild everything."""
    from gpuslice_hub import clusterview

    ledger = make_ledger()
    a, _ = ledger.allocate(ANN, "gpu-1", "a")
    before = ledger.profile_capacity()["gpu-1"][0]  # the arrays are built with a held
    ledger.release(a["id"], "ann", "done")

    real = clusterview._Layout.host_state
    calls = {"n": 0}

    def fail_once(self, *args, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("a database hiccup while following the release")
        return real(self, *args, **kw)

    monkeypatch.setattr(clusterview._Layout, "host_state", fail_once)
    with pytest.raises(RuntimeError):
        ledger.profile_capacity()
    assert ledger.profile_capacity()["gpu-1"][0] == before + 1  # the release is seen


def test_the_active_cache_tells_which_allocations_changed_between_two_states(make_ledger):
    """What the placement arrays follow: the allocations that changed between two states,
    either way round, and None once that is no longer known (a journal outgrown, a full
    read), when the arrays compare every view instead."""
    ledger = make_ledger()
    cache = ledger.active_cache

    def state():
        with ledger.db.reading() as s:
            return cache.state(s)

    first = state()
    a, _ = ledger.allocate(ANN, "gpu-1", "a")
    b, _ = ledger.allocate(ANN, "gpu-1", "b")
    ledger.release(a["id"], "ann", "done")
    second = state()
    assert set(second.views) == set(first.views) | {b["id"]}
    assert cache.changed_between(first.mark, second.mark) == {a["id"], b["id"]}
    assert cache.changed_between(second.mark, first.mark) == {a["id"], b["id"]}
    assert cache.changed_between(second.mark, second.mark) == set()
    cache.JOURNAL = 2  # (a small journal: the service keeps 4 096 changes)
    for i in range(3):
        c, _ = ledger.allocate(ANN, "gpu-1", f"c{i}")
        ledger.release(c["id"], "ann", "done")
    third = state()
    assert cache.changed_between(second.mark, third.mark) is None
    cache._marker = None  # what a failure while following does: everything is read again
    fourth = state()
    assert cache.changed_between(third.mark, fourth.mark) is None
    assert cache.changed_between(fourth.mark, state().mark) == set()


def test_a_recorded_event_is_answered_as_it_is_stored_and_listed(make_ledger):
    ledger = make_ledger()
    detail = {"scope": ("kernel", "server"), "reclaimed_gpu_hours": 1.25, "note": "café ☃"}
    recorded = ledger.record_event("idle-culled", "ann", "service", "idle for 2 h", detail)
    (listed,) = ledger.events(user="ann", kinds=["idle-culled"])
    # what the caller is told is what the log says: the tuple is stored as JSON's list
    assert recorded == listed
    assert recorded["detail"]["scope"] == ["kernel", "server"]
    assert recorded["reason"] == "idle for 2 h" and recorded["user"] == "ann"


def test_one_state_of_the_active_allocations_is_shared_until_it_changes(make_ledger):
    """A pass tries each blocked shape against the same state: it is handed out once, not
    copied per try; a change hands out a new one and leaves the old one as it was."""
    ledger = make_ledger(quotas={"default_user": {"max_slices": 6}})
    first, _ = ledger.try_allocate(ANN, "share-250", "s1")
    cache = ledger.active_cache
    state, held = cache.state_kept(), cache.held()
    assert cache.state_kept() is state and cache.held() is held
    assert set(state.views) == {first["id"]} and held.users["ann"].slices == 1
    second, _ = ledger.try_allocate(ANN, "share-250", "s2")
    after, held_after = cache.state_kept(), cache.held()
    assert after is not state and held_after is not held
    assert set(after.views) == {first["id"], second["id"]}
    assert held_after.users["ann"].slices == 2
    # what was handed out before is as it was
    assert set(state.views) == {first["id"]} and held.users["ann"].slices == 1
    ledger.release(second["id"], "ann", "done")
    assert set(cache.state_kept().views) == {first["id"]}
    assert cache.held().users["ann"].slices == 1


def test_profiles_no_host_could_hold_are_named_drained_gpus_still_count(make_ledger):
    profiles = [
        {"name": "gpu-1", "kind": "gpu", "count": 1},
        {"name": "h100", "kind": "gpu", "count": 1, "models": ["NVIDIA H100 80GB HBM3"]},
        {"name": "mig-7g", "kind": "mig", "mig_profile": "7g.80gb"},
        {"name": "gpu-16", "kind": "gpu", "count": 16},
    ]
    ledger = make_ledger(profiles=profiles)
    assert ledger.never_placed() == ["gpu-16", "h100", "mig-7g"]
    # a drained GPU is back in service later: what it could hold is not "never"
    _hosts, gpus, _active = ledger.snapshot()
    for gpu in gpus:
        if gpu.mig_mode != "enabled":
            ledger.set_drained(gpu.uuid, True, "admin", "test")
    assert ledger.profile_capacity()["gpu-1"] == (0, 0)
    assert ledger.never_placed() == ["gpu-16", "h100", "mig-7g"]
