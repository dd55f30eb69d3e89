"""The admin panel's read models over real SQLite and PostgreSQL ledgers: overview and
holders, fragmentation, usage samples and series, per-group GPU-hours, reclaimed hours.

Timestamps are written into the rows explicitly, so every figure is computed by hand here.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from sqlalchemy import insert, select, update

from gpuslice_hub.admin import sampler as sampler_module
from gpuslice_hub.admin.accounting import group_usage, reclaimed
from gpuslice_hub.admin.fragmentation import fragmented_milli, free_milli
from gpuslice_hub.admin.overview import overview
from gpuslice_hub.admin.reports import is_fresh, used_milli
from gpuslice_hub.admin.usage import FIELDS, prune, series, take_sample
from gpuslice_hub.db.admin_models import UsageReportRow, UsageSampleRow
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import AllocationRow, EventRow, utcnow
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.placement import GPUState, HostState, MigSlotState, Request

ANN = Caller("ann", (), "ann")
BOB = Caller("bob", (), "bob")
PIA = Caller("pia", ("physics",), "pia")


# --- fragmentation: pure, over hand-built states ------------------------------------


def share(milli: int, memory: int = 0) -> Request:
    return Request(kind="share", gpu_milli=milli, gpu_memory_mib=memory)


def test_a_share_gpu_left_with_less_than_the_smallest_share_is_fragmented():
    gpus = [
        GPUState("g0", "A100", 81920, free_milli=100),
        GPUState("g1", "A100", 81920, free_milli=300),
    ]
    host = HostState("h", 32000, 256000, gpus)
    frag = fragmented_milli([host], [share(250), share(500)])
    assert frag == {"g0": 100, "g1": 0}
    # a smaller share makes the 100 milli usable
    assert fragmented_milli([host], [share(100)]) == {"g0": 0, "g1": 0}


def test_a_share_gpu_whose_memory_is_taken_is_fragmented_despite_free_compute():
    gpu = GPUState("g0", "A100", 81920, free_milli=600, free_memory_mib=8000)
    assert fragmented_milli([HostState("h", 32000, 256000, [gpu])], [share(250, 10240)]) == {
        "g0": 600
    }


def test_a_host_out_of_cpu_has_all_its_free_gpu_capacity_fragmented():
    mig = GPUState("m0", "A100", 81920, mig=[MigSlotState("MIG-a", "1g.10gb", 10240, 142)])
    whole = GPUState("g1", "A100", 81920)
    requests = [
        Request(kind="share", cpu_milli=2000, gpu_milli=250),
        Request(kind="mig", cpu_milli=2000, mig_profile="1g.10gb"),
    ]
    busy = HostState("busy", 1000, 256000, [mig, whole])
    idle = HostState(
        "idle",
        4000,
        256000,
        [
            GPUState("g2", "A100", 81920),
            GPUState("m1", "A100", 81920, mig=[MigSlotState("MIG-b", "1g.10gb", 10240, 142)]),
        ],
    )
    assert fragmented_milli([busy, idle], requests) == {"m0": 142, "g1": 1000, "g2": 0, "m1": 0}


def test_mig_instances_count_one_by_one_by_their_profile():
    gpu = GPUState(
        "m0",
        "A100",
        81920,
        mig=[
            MigSlotState("MIG-3g", "3g.40gb", 40960, 428),
            MigSlotState("MIG-1a", "1g.10gb", 10240, 142),
            MigSlotState("MIG-1b", "1g.10gb", 10240, 142, free=False),
        ],
    )
    host = HostState("h", 32000, 256000, [gpu])
    three_g = Request(kind="mig", mig_profile="3g.40gb")
    # no mig-1g profile: the free 1g instance is fragmented, the 3g one is not
    assert fragmented_milli([host], [three_g]) == {"m0": 142}
    assert fragmented_milli([host], [three_g, Request(kind="mig", mig_profile="1g.10gb")]) == {
        "m0": 0
    }
    # shares and whole GPUs never go to a MIG GPU
    assert fragmented_milli([host], [share(100), Request(kind="gpu")]) == {"m0": 570}
    assert free_milli(gpu) == 570


def test_drained_gpus_have_nothing_free_and_nothing_fragmented():
    drained = GPUState("g0", "A100", 81920, free_milli=100, drained=True)
    drained_mig = GPUState(
        "m0", "A100", 81920, mig=[MigSlotState("MIG-x", "2g.20gb", 20480, 285)], drained=True
    )
    host = HostState("h", 32000, 256000, [drained, drained_mig])
    assert fragmented_milli([host], [share(250)]) == {"g0": 0, "m0": 0}
    assert free_milli(drained) == 0 and free_milli(drained_mig) == 0


def test_whole_gpu_profiles_need_enough_whole_gpus_on_one_host_and_an_allowed_model():
    two = Request(kind="gpu", count=2)
    one_free = HostState("a", 32000, 256000, [GPUState("a0", "A100", 81920)])
    two_free = HostState(
        "b", 32000, 256000, [GPUState("b0", "A100", 81920), GPUState("b1", "A100", 81920)]
    )
    assert fragmented_milli([one_free, two_free], [two]) == {"a0": 1000, "b0": 0, "b1": 0}
    h100_only = Request(kind="share", gpu_milli=250, models=("H100",))
    assert fragmented_milli([one_free], [h100_only]) == {"a0": 1000}
    assert fragmented_milli([], [two]) == {}


# --- usage reports: freshness and used milli ----------------------------------------


def test_a_report_is_fresh_for_two_intervals_plus_two_minutes():
    now = utcnow()

    def report(age: float, interval: float = 60, utilization: float | None = 50) -> Any:
        return SimpleNamespace(
            reported_at=now - timedelta(seconds=age),
            interval_seconds=interval,
            utilization=utilization,
        )

    assert is_fresh(report(239), now) and not is_fresh(report(241), now)
    assert is_fresh(report(119, interval=0), now) and not is_fresh(report(121, interval=0), now)
    assert not is_fresh(report(1, utilization=None), now)  # no figure: nothing known


def test_every_stored_timestamp_is_read_back_aware():
    """One time type: SQLite hands back naive datetimes, and the column type (not each
    reader) makes them UTC, so no view compares naive with aware."""
    from sqlalchemy import DateTime

    from gpuslice_hub.db.models import Base, UTCDateTime

    columns = [c for t in Base.metadata.tables.values() for c in t.columns]
    stamps = [c for c in columns if isinstance(c.type, (DateTime, UTCDateTime))]
    assert len(stamps) > 10
    assert [str(c) for c in stamps if not isinstance(c.type, UTCDateTime)] == []


def test_used_milli_scales_by_what_nvml_measured_against():
    def alloc(kind: str, gpu_milli: int) -> Any:
        return SimpleNamespace(kind=kind, gpu_milli=gpu_milli)

    assert used_milli(alloc("mig", 142), 50) == 71  # % of the instance
    assert used_milli(alloc("share", 250), 10) == 100  # % of the whole device
    assert used_milli(alloc("share", 250), 50) == 250  # capped at the share
    # the busiest of two GPUs at 50 %: one device's worth, a lower bound
    assert used_milli(alloc("gpu", 2000), 50) == 500
    assert used_milli(alloc("gpu", 2000), 100) == 1000
    assert used_milli(alloc("gpu", 1000), 100) == 1000


# --- helpers writing rows with chosen timestamps ------------------------------------


def set_allocation(ledger: Ledger, alloc_id: int, **values: Any) -> None:
    with ledger.db.writing() as s:
        s.execute(update(AllocationRow).where(AllocationRow.id == alloc_id).values(**values))


def report(
    ledger: Ledger,
    alloc_id: int,
    utilization: float | None,
    at: datetime,
    interval: float = 60,
    memory: float | None = 1024.0,
    idle: float = 0.0,
) -> None:
    with ledger.db.writing() as s:
        s.execute(
            insert(UsageReportRow).values(
                allocation_id=alloc_id,
                reported_at=at,
                utilization=utilization,
                memory_mib=memory,
                idle_seconds=idle,
                interval_seconds=interval,
            )
        )


def add_job(ledger: Ledger, state: str, allocation_ids: list[int]) -> int:
    with ledger.db.writing() as s:
        job = JobRow(
            name="train",
            user="bob",
            state=state,
            profile="gpu-1",
            priority_class="preemptible",
            checkpoint_interval=600,
            max_runtime=3600,
            backend="local",
            allocation_ids=allocation_ids,
        )
        s.add(job)
        s.flush()
        return job.id


def cull(ledger: Ledger, alloc_id: int | None, gpu_hours: float, at: datetime) -> None:
    with ledger.db.writing() as s:
        s.execute(
            insert(EventRow).values(
                ts=at,
                kind="idle-culled",
                user="ann",
                actor="ann",
                allocation_id=alloc_id,
                detail={"reclaimed_gpu_hours": gpu_hours, "scope": "server"},
            )
        )


def add_sample(ledger: Ledger, ts: datetime, **values: Any) -> None:
    row = {k: 0 for k in FIELDS} | {"used_milli": None} | values
    with ledger.db.writing() as s:
        s.execute(insert(UsageSampleRow).values(ts=ts, **row))


def gpus_by_uuid(view: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {g["uuid"]: g for h in view["hosts"] for g in h["gpus"]}


# --- the overview -----------------------------------------------------------------


def test_overview_shows_every_slice_its_holder_and_the_pool_totals(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    a, _ = ledger.allocate(ANN, "mig-1g.10gb", "lab")
    b, _ = ledger.allocate(BOB, "share-250")
    p, _ = ledger.allocate(PIA, "gpu-1")
    report(ledger, a["id"], 50.0, now - timedelta(seconds=30), memory=2048.0, idle=12.0)
    report(ledger, b["id"], 90.0, now - timedelta(hours=1))  # stale: not in used_milli

    view = overview(ledger, now, "simulated", True)

    assert view["backend"] == "simulated" and view["simulated"] is True
    assert view["totals"] == {
        "capacity_milli": 3000,
        "in_service_milli": 3000,  # no GPU drained
        "allocated_milli": 142 + 250 + 1000,
        "interactive_milli": 142 + 250 + 1000,
        "batch_milli": 0,
        "external_milli": 0,
        "used_milli": 71,  # 50 % of the 1g instance; bob's report is an hour old
        "reported_milli": 142,
        # MIG GPU: 3g + 2g + one 1g free; the share GPU: 750; the whole GPU: nothing
        "free_milli": 428 + 285 + 142 + 750,
        # nobody may ask for a 2g instance
        "fragmented_milli": 285,
        "gpus": 3,
        "drained_gpus": 0,
        "active_allocations": 3,
        "queued_jobs": 0,
        "running_jobs": 0,
    }
    (host,) = view["hosts"]
    assert host["name"] == "node-a" and host["present"] is True
    assert host["cpu_milli_free"] == host["cpu_milli"] == 32000
    gpus = gpus_by_uuid(view)
    mig_gpu = gpus["GPU-sim-node-a-0"]
    profiles = [s["mig_profile"] for s in mig_gpu["slices"]]
    assert profiles == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert {s["kind"] for s in mig_gpu["slices"]} == {"mig"}
    held = [s for s in mig_gpu["slices"] if s["holder"]]
    assert len(held) == 1 and held[0]["mig_uuid"] == a["assignments"][0]["mig_uuid"]
    holder = held[0]["holder"]
    assert holder["allocation_id"] == a["id"] and holder["user"] == "ann"
    assert holder["server_name"] == "lab" and holder["purpose"] == "interactive"
    assert holder["profile"] == "mig-1g.10gb" and holder["job_id"] is None
    assert holder["utilization"] == 50.0 and holder["memory_used_mib"] == 2048.0
    assert holder["idle_seconds"] == 12.0 and holder["reported_at"].endswith("Z")
    assert holder["since"] == a["created_at"]
    assert mig_gpu["allocated_milli"] == 142 and mig_gpu["free_milli"] == 855
    assert mig_gpu["fragmented_milli"] == 285

    share_gpu = gpus[b["assignments"][0]["gpu_uuid"]]
    (slice_,) = share_gpu["slices"]
    assert slice_["kind"] == "share" and slice_["milli"] == 250 and slice_["mig_uuid"] is None
    assert slice_["memory_mib"] == 20480
    # the latest report is shown however old; reported_at says how old
    assert slice_["holder"]["user"] == "bob" and slice_["holder"]["utilization"] == 90.0
    assert share_gpu["free_milli"] == 750 and share_gpu["fragmented_milli"] == 0

    whole_gpu = gpus[p["assignments"][0]["gpu_uuid"]]
    assert [s["kind"] for s in whole_gpu["slices"]] == ["gpu"]
    assert whole_gpu["slices"][0]["holder"]["utilization"] is None  # never reported
    assert whole_gpu["allocated_milli"] == 1000 and whole_gpu["free_milli"] == 0

    # A drained GPU leaves the capacity in service; its holder stays allocated.
    ledger.set_drained(whole_gpu["uuid"], True, "admin", "fan")
    totals = overview(ledger, now, "simulated", True)["totals"]
    assert (totals["capacity_milli"], totals["in_service_milli"]) == (3000, 2000)
    assert totals["drained_gpus"] == 1 and totals["allocated_milli"] == 142 + 250 + 1000


def test_overview_names_the_job_of_a_batch_slice_and_counts_the_queue(make_ledger):
    ledger = make_ledger()
    batch, _ = ledger.allocate(BOB, "gpu-1", "", purpose="batch", preemptible=True)
    running = add_job(ledger, "running", [batch["id"]])
    add_job(ledger, "queued", [])
    add_job(ledger, "preempted", [])
    add_job(ledger, "completed", [])
    view = overview(ledger, utcnow())
    gpu = gpus_by_uuid(view)[batch["assignments"][0]["gpu_uuid"]]
    assert gpu["slices"][0]["holder"]["job_id"] == running
    assert gpu["slices"][0]["holder"]["purpose"] == "batch"
    totals = view["totals"]
    assert totals["queued_jobs"] == 2 and totals["running_jobs"] == 1
    assert totals["batch_milli"] == 1000 and totals["interactive_milli"] == 0
    assert totals["used_milli"] is None and totals["reported_milli"] == 0


def test_a_drained_gpu_is_capacity_but_neither_free_nor_fragmented(make_ledger):
    ledger = make_ledger(profiles=[{"name": "share-600", "kind": "share", "gpu_milli": 600}])
    ledger.set_drained("GPU-sim-node-a-2", True, "admin", "maintenance")
    view = overview(ledger, utcnow())
    totals = view["totals"]
    assert totals["capacity_milli"] == 3000 and totals["drained_gpus"] == 1
    # the MIG GPU's instances are all fragmented (no MIG profile); GPU 1 is usable
    assert totals["free_milli"] == 997 + 1000
    assert totals["fragmented_milli"] == 997
    drained = gpus_by_uuid(view)["GPU-sim-node-a-2"]
    assert drained["drained"] is True
    assert drained["free_milli"] == 0 and drained["fragmented_milli"] == 0
    # one 600 share leaves 400 on GPU 1: no 600 fits there any more
    ledger.allocate(ANN, "share-600")
    assert overview(ledger, utcnow())["totals"]["fragmented_milli"] == 997 + 400


def test_a_host_without_cpu_left_turns_its_free_gpus_into_fragmentation(make_ledger):
    ledger = make_ledger(
        profiles=[
            {"name": "share-250", "kind": "share", "gpu_milli": 250, "cpu_milli": 16000},
            {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb", "cpu_milli": 1},
        ]
    )
    ledger.allocate(ANN, "share-250", "one")
    ledger.allocate(BOB, "share-250", "two")
    view = overview(ledger, utcnow())
    (host,) = view["hosts"]
    assert host["cpu_milli_free"] == 0
    # every free milli is stranded: 3g, 2g and both 1g instances, and both GPUs' remainders
    assert view["totals"]["free_milli"] == 997 + 1500
    assert view["totals"]["fragmented_milli"] == 997 + 1500


# --- samples and series -----------------------------------------------------------


def test_a_sample_stores_the_pool_figures(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    empty = take_sample(ledger, now)
    assert empty["used_milli"] is None and empty["allocated_milli"] == 0
    a, _ = ledger.allocate(ANN, "share-250")
    report(ledger, a["id"], 20.0, now, interval=300)  # fresh for 12 minutes
    ledger.allocate(BOB, "gpu-1", "", purpose="batch")
    add_job(ledger, "queued", [])
    later = now + timedelta(minutes=5)
    taken = take_sample(ledger, later)
    with ledger.db.reading() as s:
        rows = s.scalars(select(UsageSampleRow).order_by(UsageSampleRow.ts)).all()
    assert len(rows) == 2
    row = rows[1]
    stored = {k: getattr(row, k) for k in FIELDS}
    assert stored == {k: taken[k] for k in FIELDS}
    assert stored == {
        "capacity_milli": 3000,
        "in_service_milli": 3000,
        "allocated_milli": 1250,
        "interactive_milli": 250,
        "batch_milli": 1000,
        "used_milli": 200,  # 20 % of the device, within the 250 share
        "reported_milli": 250,
        "fragmented_milli": 285,
        "queued_jobs": 1,
        "running_jobs": 0,
    }
    assert overview(ledger, later)["totals"]["used_milli"] == 200


def test_series_lists_the_window_and_averages_into_buckets(make_ledger):
    ledger = make_ledger()
    now = utcnow().replace(microsecond=0)
    since = now - timedelta(hours=1)
    add_sample(ledger, since - timedelta(minutes=1), allocated_milli=9999)  # before the window
    for i in range(6):  # every 10 minutes from since+5min
        add_sample(
            ledger,
            since + timedelta(minutes=5 + 10 * i),
            capacity_milli=3000,
            allocated_milli=100 * i,
            used_milli=None if i % 2 else 10 * i,
            queued_jobs=i,
        )
    raw = series(ledger, since, now, 100)
    assert [p["allocated_milli"] for p in raw] == [0, 100, 200, 300, 400, 500]
    assert [p["used_milli"] for p in raw] == [0, None, 20, None, 40, None]
    assert raw[0]["ts"] == (since + timedelta(minutes=5)).isoformat().replace("+00:00", "Z")
    assert set(raw[0]) == {"ts", *FIELDS}

    halves = series(ledger, since, now, 2)  # 30-minute buckets of three samples each
    assert [p["allocated_milli"] for p in halves] == [100, 400]
    assert [p["queued_jobs"] for p in halves] == [1, 4]
    # used_milli: the known values of a bucket averaged (0 and 20; 40)
    assert [p["used_milli"] for p in halves] == [10, 40]
    assert [p["capacity_milli"] for p in halves] == [3000, 3000]
    # each point sits in the middle of the samples it stands for
    assert halves[0]["ts"] == (since + timedelta(minutes=15)).isoformat().replace("+00:00", "Z")
    assert len(series(ledger, since, now, 1)) == 1
    # a sample exactly at the end of the window joins the last bucket
    add_sample(ledger, now, allocated_milli=1100)
    halves = series(ledger, since, now, 2)
    assert [p["allocated_milli"] for p in halves] == [100, (300 + 400 + 500 + 1100) // 4]
    assert series(ledger, now + timedelta(minutes=1), now + timedelta(hours=1), 10) == []


def test_prune_deletes_only_older_samples(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    for days in (100, 91, 89, 1):
        add_sample(ledger, now - timedelta(days=days), allocated_milli=days)
    assert prune(ledger, now - timedelta(days=90)) == 2
    left = series(ledger, now - timedelta(days=365), now, 100)
    assert [p["allocated_milli"] for p in left] == [89, 1]


# --- GPU-hours per group, reclaimed hours --------------------------------------------


def test_group_usage_counts_the_part_of_each_allocation_inside_the_window(make_ledger):
    ledger = make_ledger(quotas={"groups": {"ml": {"max_slices": 10}}})
    now = utcnow()
    # charged to ml, the group with a quota, although "aaa" sorts first
    ml = Caller("mo", ("aaa", "ml"), "mo")

    def held(caller: Caller, profile: str, start: timedelta, end: timedelta | None, **kw: Any):
        alloc, _ = ledger.allocate(caller, profile, f"s{start.total_seconds()}", **kw)
        if end is not None:
            ledger.release(alloc["id"], "test", "done")
        set_allocation(
            ledger,
            alloc["id"],
            created_at=now - start,
            released_at=None if end is None else now - end,
        )
        return alloc["id"]

    # ann has no group: 2 days of a whole GPU, 10 to 8 days ago
    a = held(ANN, "gpu-1", timedelta(days=10), timedelta(days=8))
    # pia (physics) has held a quarter share for 40 days and still does
    held(PIA, "share-250", timedelta(days=40), None)
    # mo's job, charged to ml: 1 GPU for an hour, two hours ago
    held(ml, "gpu-1", timedelta(hours=2), timedelta(hours=1), purpose="batch")
    # released 31 days ago: outside every window, but its cull was recorded late
    old = held(PIA, "gpu-1", timedelta(days=35), timedelta(days=31))
    cull(ledger, old, 0.125, now - timedelta(days=29))
    cull(ledger, a, 0.5, now - timedelta(days=8))
    cull(ledger, a, 2.0, now - timedelta(days=40))  # outside 30 days
    cull(ledger, None, 0.25, now - timedelta(days=1))  # a kernel cull: no allocation
    # a Slurm job outside gpuslice, held as an external allocation for a day: no group's use
    outside = held(ANN, "gpu-1", timedelta(days=3), timedelta(days=2))
    set_allocation(ledger, outside, purpose="external", user="slurm:1234", groups=[])

    groups = {g["group"]: g for g in group_usage(ledger, now)}
    assert set(groups) == {"(no group)", "physics", "ml"}
    assert groups["(no group)"] == {
        "group": "(no group)",
        "gpu_hours_7d": 0.0,
        "gpu_hours_30d": pytest.approx(48.0, abs=1e-3),
        "interactive_gpu_hours_30d": pytest.approx(48.0, abs=1e-3),
        "batch_gpu_hours_30d": 0.0,
        "allocations_30d": 1,
        "reclaimed_gpu_hours_30d": pytest.approx(0.75),
    }
    physics = groups["physics"]
    assert physics["gpu_hours_30d"] == pytest.approx(30 * 24 * 0.25, abs=1e-3)
    assert physics["gpu_hours_7d"] == pytest.approx(7 * 24 * 0.25, abs=1e-3)
    assert physics["allocations_30d"] == 1 and physics["reclaimed_gpu_hours_30d"] == 0.125
    assert groups["ml"]["batch_gpu_hours_30d"] == pytest.approx(1.0, abs=1e-3)
    assert groups["ml"]["gpu_hours_7d"] == pytest.approx(1.0, abs=1e-3)
    assert groups["ml"]["interactive_gpu_hours_30d"] == 0.0
    # busiest first
    assert [g["group"] for g in group_usage(ledger, now)] == ["physics", "(no group)", "ml"]

    assert reclaimed(ledger, now) == {
        "total": 2.875,
        "last_7d": 0.25,
        "last_30d": 0.875,
    }
    assert overview(ledger, now)["reclaimed_gpu_hours"]["total"] == 2.875


# --- the sampler loop -------------------------------------------------------------


async def test_the_sampler_samples_at_once_then_periodically_and_survives_failures(
    make_ledger, monkeypatch, caplog
):
    ledger = make_ledger()
    add_sample(ledger, utcnow() - timedelta(days=100))  # past retention: pruned at start
    real = sampler_module.take_sample
    calls = {"n": 0}

    def flaky(ledger: Ledger, now: datetime) -> dict[str, Any]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("database went away")
        return real(ledger, now)

    monkeypatch.setattr(sampler_module, "take_sample", flaky)
    log = logging.getLogger("test.sampler")
    task = sampler_module.start_sampler(ledger, 0.05, 90, log)
    assert task is not None
    try:

        def stored() -> int:
            with ledger.db.reading() as s:
                return len(s.scalars(select(UsageSampleRow)).all())

        deadline = asyncio.get_running_loop().time() + 20
        while stored() < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)
        assert stored() >= 3 and not task.done()
        assert calls["n"] >= 4  # the failed second sample did not stop the loop
        assert "taking a usage sample failed" in caplog.text
        now = utcnow()
        assert series(ledger, now - timedelta(days=365), now - timedelta(days=30), 10) == []
    finally:
        task.cancel()
    assert sampler_module.start_sampler(ledger, 0, 90, log) is None


async def test_the_first_sample_is_taken_at_start_not_after_an_interval(make_ledger):
    ledger = make_ledger()
    task = sampler_module.start_sampler(ledger, 3600, 90, logging.getLogger("test.sampler"))
    assert task is not None
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while asyncio.get_running_loop().time() < deadline:
            if series(ledger, utcnow() - timedelta(minutes=5), utcnow(), 10):
                break
            await asyncio.sleep(0.02)
        (first,) = series(ledger, utcnow() - timedelta(minutes=5), utcnow(), 10)
        assert first["capacity_milli"] == 3000 and first["used_milli"] is None
    finally:
        task.cancel()
