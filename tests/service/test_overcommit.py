"""Overcommit of shares from history over real SQLite and PostgreSQL ledgers: who is charged
what, how many shares then fit on a GPU, what the holder is still promised, and what the
admin view and the metrics say. Every figure is worked out by hand from the history the
test writes."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import insert, select

from gpuslice_hub.admin.overcommit import overcommit_view
from gpuslice_hub.db.admin_models import UsageReportRow
from gpuslice_hub.db.models import AllocationRow, ClaimRow, utcnow
from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.victims import pick_victim
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.metrics import OvercommitCollector
from gpuslice_hub.overcommit import (
    Observed,
    OvercommitHistory,
    OvercommitSettings,
    charge_factor,
    charged_request,
)
from gpuslice_hub.profiles import parse_profiles

HOUR = timedelta(hours=1)
SHARE = {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480}
UNCAPPED = {"name": "share-half", "kind": "share", "gpu_milli": 500}
SMALL = {"name": "share-100", "kind": "share", "gpu_milli": 100, "gpu_memory_mib": 8192}
PROFILES = [SHARE, UNCAPPED, {"name": "gpu-1", "kind": "gpu", "count": 1}, SMALL]
ONE_GPU = [
    {
        "name": "node-a",
        "cpu_milli": 64000,
        "memory_mib": 512000,
        "gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920}],
    }
]
ON = OvercommitSettings(ratio=1.25, headroom=1.2, days=30, min_hours=24)


def history(
    ledger: Ledger,
    user: str,
    peak_mib: float | None,
    held: timedelta,
    ended_ago: timedelta = HOUR,
    profile: str = "share-250",
    purpose: str = "interactive",
) -> None:
    """A released share allocation of ``user``, held for ``held`` and ended ``ended_ago``,
    whose reports peaked at ``peak_mib``."""
    released = utcnow() - ended_ago
    with ledger.db.writing() as s:
        alloc_id = s.execute(
            insert(AllocationRow)
            .values(
                user=user,
                server_name="old",
                profile=profile,
                kind="share",
                purpose=purpose,
                host="node-a",
                groups=[],
                gpu_milli=250,
                active=False,
                created_at=released - held,
                released_at=released,
                release_reason="stopped",
            )
            .returning(AllocationRow.id)
        ).scalar_one()
        s.execute(
            insert(UsageReportRow).values(
                allocation_id=alloc_id,
                reported_at=released,
                memory_mib=peak_mib,
                peak_memory_mib=peak_mib,
            )
        )


def overcommitting(make_ledger: Any, settings: OvercommitSettings = ON) -> Ledger:
    ledger = make_ledger(profiles=PROFILES, hosts=ONE_GPU)
    ledger.overcommit = OvercommitHistory(settings)
    return ledger


def spawn(
    ledger: Ledger, user: str, server: str, profile: str = "share-250", purpose: str = "interactive"
) -> dict[str, Any]:
    alloc, created = ledger.allocate(Caller(user, (), user), profile, server, purpose=purpose)
    assert created
    return alloc


def test_the_charge_is_the_peak_with_headroom_bounded_by_the_ratio():
    (share, uncapped, gpu, _) = parse_profiles(PROFILES).values()
    # 8 GiB peak x 1.2 = 9.6 of 20 GiB: 0.48, but never under 1 / 1.25
    assert charge_factor(share, Observed(8192, 48), ON) == pytest.approx(0.8)
    # 15 GiB x 1.2 = 18 of 20 GiB
    assert charge_factor(share, Observed(15360, 48), ON) == pytest.approx(0.9)
    # near the cap: in full
    assert charge_factor(share, Observed(18000, 48), ON) == 1.0
    # too little history, no cap, not a share, overcommit off: in full
    assert charge_factor(share, Observed(1000, 23.9), ON) == 1.0
    assert charge_factor(uncapped, Observed(1000, 48), ON) == 1.0
    assert charge_factor(gpu, Observed(1000, 48), ON) == 1.0
    assert charge_factor(share, Observed(1000, 48), OvercommitSettings()) == 1.0
    request = charged_request(share.request(), 0.9)
    assert (request.gpu_milli, request.gpu_memory_mib) == (225, 18432)


def test_peak_memory_is_the_most_any_report_gave(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    alloc = spawn(ledger, "ann", "")
    for memory in (5000.0, None, 3000.0):
        ledger.record_usage(alloc["id"], 50.0, memory, 0.0, 60.0)
    with ledger.db.reading() as s:
        row = s.get(UsageReportRow, alloc["id"])
        assert row is not None
        assert row.memory_mib == 3000.0 and row.peak_memory_mib == 5000.0


def test_a_holder_with_room_in_their_history_fits_one_more_share_per_gpu(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR)  # 6000 x 1.2 / 20480 < 0.8: charged 0.8
    history(ledger, "bob", 6000, held=10 * HOUR)  # too little history: in full
    allocs = [spawn(ledger, "ann", f"s{i}") for i in range(5)]
    for alloc in allocs:
        (a,) = alloc["assignments"]
        # what the holder is promised, and so their memory cap, is unchanged
        assert alloc["gpu_milli"] == 250 and a["milli"] == 250 and a["memory_mib"] == 20480
        assert a["charged_milli"] == 200 and a["charged_memory_mib"] == 16384
    # five of 0.8 fill the GPU: nothing for ann's sixth, nor for bob (charged in full)
    for user, server in (("ann", "s5"), ("bob", "")):
        with pytest.raises(Refused) as refused:
            ledger.allocate(Caller(user, (), user), "share-250", server)
        assert refused.value.code == "no_capacity"
        # the count is of full shares: the message says more are held
        assert "4 of 4 in use, and more held through overcommit" in refused.value.message
    ledger.release(allocs[0]["id"], "ann", "done")
    # 800 milli and 65536 MiB charged: 200 milli free, not enough for bob's full 250
    with pytest.raises(Refused):
        ledger.allocate(Caller("bob", (), "bob"), "share-250", "")
    ledger.release(allocs[1]["id"], "ann", "done")
    # 600 milli and 49152 MiB charged: bob's 250 milli and 20480 MiB fit
    (b,) = spawn(ledger, "bob", "")["assignments"]
    assert b["charged_milli"] is None and b["charged_memory_mib"] is None
    with ledger.db.reading() as s:
        charged = s.scalars(select(ClaimRow.charged_milli).where(ClaimRow.active)).all()
    assert sorted(charged, key=lambda c: c or 0) == [None, 200, 200, 200]


def test_a_slice_asked_without_overcommit_is_placed_and_charged_in_full(make_ledger: Any):
    # a spawner whose engine counts shares at their full size (Kubernetes' replicas, Slurm's
    # shards) asks so: the history that lets ann fit five shares above does not apply
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR)
    ann = Caller("ann", (), "ann")
    for i in range(4):
        alloc, _ = ledger.try_allocate(ann, "share-250", f"s{i}", overcommit=False)
        (a,) = alloc["assignments"]
        assert a["milli"] == 250 and a["charged_milli"] is None
    with pytest.raises(Refused) as refused:  # four full shares fill the GPU
        ledger.allocate(ann, "share-250", "s4")
    assert refused.value.code == "no_capacity"


def test_history_outside_the_window_or_without_memory_counts_for_nothing(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR, ended_ago=timedelta(days=31))
    history(ledger, "bob", None, held=30 * HOUR)
    # half of carol's 30 hours fall inside the 30 days: 15 hours, not enough
    history(ledger, "carol", 6000, held=30 * HOUR, ended_ago=timedelta(days=30) - 15 * HOUR)
    for user in ("ann", "bob", "carol"):
        (a,) = spawn(ledger, user, "")["assignments"]
        assert a["charged_milli"] is None, user


def test_the_highest_peak_of_a_users_allocations_sets_the_charge(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 4000, held=20 * HOUR)
    history(ledger, "ann", 15360, held=10 * HOUR)  # 30 hours in all; 15 GiB x 1.2 = 18 GiB
    (a,) = spawn(ledger, "ann", "")["assignments"]
    assert (a["charged_milli"], a["charged_memory_mib"]) == (225, 18432)
    # quotas count the promise
    used = ledger.snapshot()[2][0]
    assert used.gpu_milli == 250


def test_the_admin_view_and_metrics_show_what_was_promised_and_what_it_cost(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR)
    allocs = [spawn(ledger, "ann", f"s{i}") for i in range(5)]
    ledger.record_usage(allocs[0]["id"], 90.0, 19000.0, 0.0, 60.0)
    ledger.record_usage(allocs[1]["id"], 10.0, 1000.0, 0.0, 60.0)
    detail = {"allocation_id": allocs[0]["id"], "profile": "share-250", "scope": "kernel"}
    ledger.record_event("memory-warning", "ann", "ann", "near the cap", detail)
    ledger.record_event("memory-culled", "ann", "ann", "over the cap", detail)
    view = overcommit_view(ledger, utcnow())
    assert view["settings"]["enabled"] is True and view["settings"]["ratio"] == 1.25
    (gpu,) = view["gpus"]
    assert gpu["memory_mib"] == 81920
    assert gpu["promised_memory_mib"] == 5 * 20480 and gpu["charged_memory_mib"] == 5 * 16384
    assert gpu["promised_milli"] == 1250 and gpu["charged_milli"] == 1000
    assert gpu["in_use_memory_mib"] == 20000.0
    assert {h["memory_mib"] for h in gpu["holders"]} == {19000.0, 1000.0, None}
    assert view["totals"] == {
        "overcommitted_shares": 5,
        "gpus": 1,
        "promised_beyond_memory_mib": 5 * 20480 - 81920,
    }
    cost = view["cost"]
    assert cost["overcommitted_allocations"] == 5
    assert (cost["memory_warnings"], cost["memory_culled"]) == (1, 1)
    (next_charge,) = view["next_charges"]
    assert next_charge["user"] == "ann" and next_charge["charge"] == 0.8
    assert next_charge["hours"] == 30.0 and next_charge["peak_memory_mib"] == 6000

    registry = CollectorRegistry()
    registry.register(OvercommitCollector(ledger))
    text = generate_latest(registry).decode()
    assert "gpuslice_overcommit_shares 5.0" in text
    assert f"gpuslice_overcommit_memory_mib {5 * (20480 - 16384)}.0" in text
    assert "gpuslice_overcommit_milli 250.0" in text


def test_off_by_default(make_ledger: Any):
    ledger = make_ledger(profiles=PROFILES, hosts=ONE_GPU)
    history(ledger, "ann", 1000, held=100 * HOUR)
    for i in range(4):
        (a,) = spawn(ledger, "ann", f"s{i}")["assignments"]
        assert a["charged_milli"] is None
    with pytest.raises(Refused):
        ledger.allocate(Caller("ann", (), "ann"), "share-250", "s4")
    view = overcommit_view(ledger, utcnow())
    assert view["gpus"] == [] and view["next_charges"] == []
    assert view["settings"]["enabled"] is False


def test_the_history_is_read_again_only_after_a_while(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    (a,) = spawn(ledger, "ann", "s0")["assignments"]
    assert a["charged_milli"] is None
    history(ledger, "ann", 6000, held=30 * HOUR)
    # read a moment ago: the new history counts from the next read on
    (a,) = spawn(ledger, "ann", "s1")["assignments"]
    assert a["charged_milli"] is None
    ledger.overcommit.forget()
    (a,) = spawn(ledger, "ann", "s2")["assignments"]
    assert a["charged_milli"] == 200


def test_the_spawn_form_counts_what_fits_for_each_user(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR)

    def free(user: str, overcommit: bool = True) -> tuple[int, int]:
        listed = ledger.availability(user, (), overcommit)
        (entry,) = [p for p in listed if p["name"] == "share-250"]
        return entry["free"], entry["total"]

    assert free("ann") == (5, 5) and free("bob") == (4, 4)
    # asked for by a Kubernetes or Slurm spawner, ann's shares are placed in full: so counted
    assert free("ann", overcommit=False) == (4, 4)
    for i in range(3):
        spawn(ledger, "ann", f"s{i}")
    # 600 milli and 49 152 MiB charged: two more of ann's 200, one of bob's 250
    assert free("ann") == (2, 5) and free("bob") == (1, 4)


def test_a_charge_just_under_the_share_keeps_the_whole_cap(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    # 17 015 x 1.2 / 20 480 = 0.99697: 249.2 milli rounds up to 250, memory to 20 418 MiB
    history(ledger, "ann", 17015, held=30 * HOUR)
    (a,) = spawn(ledger, "ann", "")["assignments"]
    assert (a["milli"], a["memory_mib"]) == (250, 20480)  # the cap the server is told
    assert (a["charged_milli"], a["charged_memory_mib"]) == (250, 20418)


def test_servers_and_batch_jobs_are_charged_from_their_own_history(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR)  # servers
    history(ledger, "bob", 6000, held=30 * HOUR, purpose="batch")  # batch jobs
    (a,) = spawn(ledger, "ann", "job-1", purpose="batch")["assignments"]
    assert a["charged_milli"] is None  # ann's servers say nothing of her jobs
    (b,) = spawn(ledger, "bob", "job-2", purpose="batch")["assignments"]
    assert b["charged_milli"] == 200
    (c,) = spawn(ledger, "bob", "")["assignments"]
    assert c["charged_milli"] is None
    rows = {(r["user"], r["purpose"]) for r in overcommit_view(ledger, utcnow())["next_charges"]}
    assert rows == {("ann", "interactive"), ("bob", "batch")}


def test_a_preemption_makes_room_for_the_share_as_it_will_be_charged(make_ledger: Any):
    ledger = overcommitting(make_ledger)
    history(ledger, "ann", 6000, held=30 * HOUR)
    for i in range(3):
        spawn(ledger, "ann", f"s{i}")  # 3 x (200 milli, 16 384 MiB)
    spawn(ledger, "bob", "a", "share-100")
    spawn(ledger, "bob", "b", "share-100")
    job_alloc = spawn(ledger, "cy", "job-7", "share-100", purpose="batch")
    # 900 milli and 73 728 MiB taken; the job's 100 / 8 192 freed leaves 200 / 16 384:
    # enough for ann's share as charged, not for a full one
    job = SimpleNamespace(
        id=7,
        priority_class="preemptible",
        state="running",
        attempt_started_at=utcnow(),
        allocation_ids=[job_alloc["id"]],
    )
    share = ledger.profiles["share-250"]
    charged = ledger.request_for("ann", share, "interactive")
    assert (charged.gpu_milli, charged.gpu_memory_mib) == (200, 16384)
    assert pick_victim(ledger, share, [job], below_rank=9, request=charged) is job
    assert pick_victim(ledger, share, [job], below_rank=9) is None
    assert ledger.request_for("bob", share, "interactive") == share.request()
