"""The capacity check and quota suggestions over real SQLite and PostgreSQL ledgers.

Samples, jobs and allocations are written with explicit timestamps, so every figure and
verdict below is worked out by hand.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from prometheus_client import generate_latest
from sqlalchemy import insert

from gpuslice_hub.admin.capacity_check import CapacityCheckCache, capacity_check
from gpuslice_hub.admin.quota_suggestions import (
    Peak,
    SuggestionSettings,
    change,
    peak_of,
    quota_suggestions,
    suggest,
)
from gpuslice_hub.admin.usage import FIELDS
from gpuslice_hub.db.admin_models import UsageSampleRow
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.ledger import Caller, Ledger
from gpuslice_hub.metrics import make_registry
from gpuslice_hub.quotas import Limit
from tests.service.test_admin_views import set_allocation

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
MINUTE = timedelta(minutes=1)


def sample(ledger: Ledger, ts: datetime, **values: Any) -> None:
    base = {"used_milli": None, "capacity_milli": 10_000, "in_service_milli": 10_000}
    row = {k: 0 for k in FIELDS} | base | values
    with ledger.db.writing() as s:
        s.execute(insert(UsageSampleRow).values(ts=ts, **row))


def job(
    ledger: Ledger,
    submitted: datetime,
    started: datetime | None = None,
    finished: datetime | None = None,
    state: str = "completed",
    run: float = 0.0,
) -> None:
    with ledger.db.writing() as s:
        s.add(
            JobRow(
                name="j",
                user="ann",
                state=state,
                profile="share-250",
                priority_class="preemptible",
                checkpoint_interval=60.0,
                max_runtime=86400.0,
                backend="local",
                submitted_at=submitted,
                started_at=started,
                finished_at=finished,
                run_seconds=run,
            )
        )


def verdicts(check: dict[str, Any]) -> list[str]:
    return [v["code"] for v in check["verdicts"]]


# --- the capacity check --------------------------------------------------------------


def test_allocation_and_effective_utilization_are_sample_averages(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    # 20 days ago (only in the 30-day window): 90 % allocated, 80 % used
    sample(ledger, now - 20 * DAY, allocated_milli=9000, used_milli=8000, reported_milli=9000)
    # this week: 70 % allocated, use known for one sample (7000 reported of it, 2000 used) ...
    sample(ledger, now - 2 * DAY, allocated_milli=7000, used_milli=2000, reported_milli=7000)
    # ... unknown for another (something allocated, no report) ...
    sample(ledger, now - DAY, allocated_milli=7000, used_milli=None, reported_milli=0)
    # ... and nothing allocated at all: known to be 0 used
    sample(ledger, now - HOUR, allocated_milli=0, used_milli=None, reported_milli=0)
    # before both windows
    sample(ledger, now - 40 * DAY, allocated_milli=10_000, used_milli=10_000)

    week, month = capacity_check(ledger, now)["windows"]
    assert (week["days"], month["days"]) == (7, 30)
    assert week["samples"] == 3 and month["samples"] == 4
    assert week["allocation_rate"] == pytest.approx(14_000 / 30_000, abs=1e-4)
    # the unknown sample is left out: 2000 used of the two known samples' 20 000 in service
    assert week["effective_utilization"] == pytest.approx(0.1)
    assert week["use_known_share"] == pytest.approx(2 / 3, abs=1e-4)
    assert week["reported_share"] == 1.0
    assert month["allocation_rate"] == pytest.approx(23_000 / 40_000)
    assert month["effective_utilization"] == pytest.approx(10_000 / 30_000, abs=1e-4)


def test_queue_time_runs_from_submission_to_first_start_and_a_waiting_job_counts_so_far(
    make_ledger,
):
    ledger = make_ledger()
    now = utcnow()
    t0 = now - 3 * DAY
    # five completed jobs: waits 10, 20, 30, 40, 50 min; runs 1, 2, 3, 4, 5 h
    for i in range(1, 6):
        job(ledger, t0, t0 + i * 10 * timedelta(minutes=1), t0 + 6 * HOUR, run=i * 3600.0)
    # still queued for 2 h; cancelled while queued after 5 min; neither ran
    job(ledger, now - 2 * HOUR, state="queued")
    job(ledger, t0, None, t0 + timedelta(minutes=5), state="cancelled")
    # submitted before the week: in the 30-day window only
    job(ledger, now - 10 * DAY, now - 10 * DAY + HOUR, now - 9 * DAY, run=7200.0)

    week, month = capacity_check(ledger, now)["windows"]
    assert week["jobs_submitted"] == 7 and week["jobs_completed"] == 5
    # waits (min): 5, 10, 20, 30, 40, 50, 120 -> median 30 min; runs' median 3 h
    assert week["median_queue_seconds"] == 1800.0
    assert week["median_run_seconds"] == 3 * 3600.0
    assert week["queue_to_run"] == pytest.approx(1 / 6, abs=1e-4)
    assert month["jobs_submitted"] == 8 and month["jobs_completed"] == 6
    # runs 1..5 h and 2 h: median 2.5 h
    assert month["median_run_seconds"] == 2.5 * 3600


def test_too_few_jobs_give_no_queue_to_run_ratio(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    for _ in range(4):
        job(ledger, now - 2 * HOUR, now - HOUR, now, run=3600.0)
    week, _ = capacity_check(ledger, now)["windows"]
    assert week["median_queue_seconds"] == 3600.0 and week["queue_to_run"] is None


def test_no_samples_say_so_rather_than_zero(make_ledger):
    ledger = make_ledger()
    check = capacity_check(ledger, utcnow())
    assert verdicts(check) == ["no-data"]
    assert check["windows"][0]["allocation_rate"] is None
    assert check["windows"][0]["effective_utilization"] is None


@pytest.mark.parametrize(
    ("old", "recent", "used", "queued", "expected"),
    [
        # steadily above 60 % allocated, a queue, 89 % of what reports cover busy: capacity
        (7000, 9000, 8000, 3, ["own", "capacity"]),
        # above 60 % over 30 days only: not steady
        (9000, 5000, 4000, 0, ["between", "no-queue"]),
        # steadily below 40 %
        (3000, 3000, 2000, 0, ["rent", "no-queue"]),
        # a queue while 90 % allocated but what reports cover is 22 % busy: held idle
        (9000, 9000, 2000, 2, ["own", "scheduling"]),
        # a queue at 50 % allocated, well used: what is free does not fit
        (5000, 5000, 4500, 2, ["between", "fit"]),
        # a queue, and no usage report at all: it cannot tell, and says so
        (9000, 9000, None, 2, ["own", "use-unknown"]),
    ],
)
def test_the_decision_lines(make_ledger, old, recent, used, queued, expected):
    ledger = make_ledger()
    now = utcnow()
    # samples over 25 of the 30 days and 6 of the 7: enough history for own/rent
    sample(ledger, now - 25 * DAY, allocated_milli=old, used_milli=old, reported_milli=old)
    # the week: three times as many samples as the older one
    for d in (6, 5, 4):
        sample(
            ledger,
            now - d * DAY,
            allocated_milli=recent,
            used_milli=used,
            reported_milli=recent,
            queued_jobs=queued,
        )
    assert verdicts(capacity_check(ledger, now)) == expected


def test_a_queue_longer_than_half_the_run_says_burst_only_where_hardware_is_short(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    sample(ledger, now - DAY, allocated_milli=9500, used_milli=9000, reported_milli=9500)
    for _ in range(5):  # waits of 2 h for runs of 3 h
        job(ledger, now - 6 * HOUR, now - 4 * HOUR, now - HOUR, run=3 * 3600.0)
    check = capacity_check(ledger, now)
    # a day of samples: too little to say whether owning pays
    assert verdicts(check) == ["history", "capacity", "burst"]
    assert "cover 1 days" in check["verdicts"][0]["text"]
    assert check["verdicts"][-1]["text"].endswith(
        "67 % of the median run time over 7 days (above 50 %): burst now."
    )
    # the same queue with the slices held idle: fix that first
    sample(ledger, now - HOUR, allocated_milli=9500, used_milli=500, reported_milli=9500)
    sample(ledger, now - 2 * HOUR, allocated_milli=9500, used_milli=500, reported_milli=9500)
    check = capacity_check(ledger, now)
    assert verdicts(check) == ["history", "scheduling", "burst"]
    assert "the problem above is cheaper to fix first" in check["verdicts"][-1]["text"]


def test_partial_reports_judge_busyness_by_what_they_cover(make_ledger):
    """Half the allocation reports (the rest: jobs outside gpuslice), and that half is 90 %
    busy: a busy pool, not slices held idle."""
    ledger = make_ledger()
    now = utcnow()
    for d in (6, 4, 2):
        sample(
            ledger,
            now - d * DAY,
            allocated_milli=9000,
            reported_milli=4500,
            used_milli=4050,
            queued_jobs=3,
        )
    week, _ = capacity_check(ledger, now)["windows"]
    assert week["reported_share"] == 0.5 and week["busy_share"] == 0.9
    # of all GPUs: a lower bound, 40.5 %
    assert week["effective_utilization"] == pytest.approx(0.405)
    assert verdicts(capacity_check(ledger, now))[1] == "capacity"
    # a third covered: too little to tell
    for d in (5, 3, 1):
        sample(
            ledger,
            now - d * DAY,
            allocated_milli=9000,
            reported_milli=500,
            used_milli=450,
            queued_jobs=3,
        )
    assert verdicts(capacity_check(ledger, now))[1] == "use-unknown"


def test_drained_gpus_count_as_capacity_and_old_samples_without_in_service_count(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    # half the GPUs drained, their holders still allocated: 60 % of the hardware, not 120 %
    sample(ledger, now - 2 * DAY, in_service_milli=5000, allocated_milli=6000)
    # a sample from before schema revision 0004: no in-service figure
    sample(ledger, now - DAY, in_service_milli=None, allocated_milli=5000)
    week, _ = capacity_check(ledger, now)["windows"]
    assert week["samples"] == 2 and week["allocation_rate"] == pytest.approx(0.55)


def test_jobs_limited_to_a_time_window_are_left_out_of_the_queue(make_ledger):
    ledger = make_ledger()
    now = utcnow()
    for _ in range(5):
        job(ledger, now - 6 * HOUR, now - 6 * HOUR, now - 3 * HOUR, run=3 * 3600.0)
    with ledger.db.writing() as s:
        s.add(
            JobRow(
                name="nightly",
                user="ann",
                state="queued",
                profile="share-250",
                priority_class="preemptible",
                checkpoint_interval=60.0,
                max_runtime=3600.0,
                backend="local",
                submitted_at=now - 2 * DAY,
                time_window="night",
            )
        )
    week, _ = capacity_check(ledger, now)["windows"]
    assert (week["jobs_submitted"], week["jobs_in_time_windows"]) == (5, 1)
    assert week["median_queue_seconds"] == 0.0


def test_the_cache_recomputes_only_after_its_ttl_and_feeds_the_metrics(make_ledger):
    ledger = make_ledger()
    t = [0.0]
    cache = CapacityCheckCache(ledger, 300.0, clock=lambda: t[0])
    now = utcnow()
    sample(ledger, now - HOUR, allocated_milli=5000, used_milli=2500, reported_milli=5000)
    first = cache.get(now)
    sample(ledger, now - 2 * HOUR, allocated_milli=10_000, used_milli=0, reported_milli=10_000)
    t[0] = 299.0
    assert cache.get(now) is first
    registry, _ = make_registry(ledger, cache)
    text = generate_latest(registry).decode()
    assert 'gpuslice_capacity_allocation_ratio{window="7d"} 0.5' in text
    assert 'gpuslice_capacity_effective_utilization_ratio{window="30d"} 0.25' in text
    # no jobs: the ratio is unknown, and absent rather than 0
    assert 'gpuslice_capacity_queue_to_run_ratio{window="7d"}' not in text
    t[0] = 300.0
    assert cache.get(now)["windows"][0]["allocation_rate"] == 0.75


# --- quota suggestions -----------------------------------------------------------------


def test_the_peak_counts_what_was_held_together_and_not_back_to_back():
    # a 1-slice 1000-milli interval 0-10, a 2-slice 250 one 5-15, one of 1000 from 15 to 20
    peak = peak_of([(0, 10, 1.0, 1000), (5, 15, 2.0, 250), (15, 20, 1.0, 1000)])
    assert (peak.slices, peak.slices_at) == (3.0, 5)
    assert (peak.milli, peak.milli_at) == (1250, 5)
    # released at 15 as the next is allocated at 15: 2 + 1 never held together
    assert peak_of([(0, 15, 2.0, 250), (15, 20, 2.0, 250)]).slices == 2.0
    assert peak_of([]) == Peak()


def test_a_suggestion_is_the_peak_times_the_factor_plus_the_buffer_rounded_up():
    settings = SuggestionSettings(30, 1.2, 1.0, 250)
    # 3 slices * 1.2 + 1 = 4.6 -> 5; 1250 * 1.2 + 250 = 1750
    assert suggest(Peak(3.0, 1250), settings, None) == {"max_slices": 5, "max_milli": 1750}
    # 5 * 1.2 + 1 = 7 exactly stays 7; 1010 * 1.2 + 250 = 1462 -> 1500
    assert suggest(Peak(5.0, 1010), settings, None) == {"max_slices": 7, "max_milli": 1500}
    # only the limits the quota in force sets: Apply never adds one the site did not have
    slices_only = Limit(max_slices=10)
    assert suggest(Peak(3.0, 1250), settings, slices_only) == {
        "max_slices": 5,
        "max_milli": None,
    }
    assert suggest(Peak(3.0, 1250), settings, Limit(max_milli=8000)) == {
        "max_slices": None,
        "max_milli": 1750,
    }
    assert change({"max_slices": 5, "max_milli": None}, slices_only) == "lower"
    assert change({"max_slices": 12, "max_milli": None}, slices_only) == "raise"
    assert change({"max_slices": 10, "max_milli": None}, slices_only) == "same"
    assert change({"max_slices": 5, "max_milli": 1750}, None) == "new"


def test_suggestions_per_user_and_group_over_the_window(make_ledger):
    ledger = make_ledger(
        quotas={
            "default_user": {"max_slices": 2},
            "users": {"zed": {"max_slices": 4, "max_milli": 4000}},
            "groups": {"ml": {"max_slices": 10}},
        }
    )
    now = utcnow()
    ann = Caller("ann", (), "ann")
    mo = Caller("mo", ("aaa", "ml"), "mo")

    def held(caller: Caller, profile: str, start: timedelta, end: timedelta | None, **kw: Any):
        alloc, _ = ledger.allocate(caller, profile, f"s{start.total_seconds()}", **kw)
        if end is not None:
            ledger.release(alloc["id"], "test", "done")
        released = None if end is None else now - end
        set_allocation(ledger, alloc["id"], created_at=now - start, released_at=released)

    # ann: a whole GPU 10 to 8 days ago, with a quarter share for a day of it
    held(ann, "gpu-1", 10 * DAY, 8 * DAY)
    held(ann, "share-250", 9 * DAY, 8 * DAY + HOUR)
    # before the window, ann held two more at once: not counted
    held(ann, "gpu-1", 40 * DAY, 35 * DAY)
    held(ann, "gpu-1", 39 * DAY, 36 * DAY)
    # mo's batch job (charged to ml) overlaps his interactive share; both still held
    held(mo, "share-250", 2 * DAY, None)
    held(mo, "gpu-1", 1 * DAY, None, purpose="batch")
    settings = SuggestionSettings(30, 1.2, 1.0, 250)
    with ledger.db.reading() as s:
        effective = ledger.effective_quotas(s)
    view = quota_suggestions(ledger, effective, settings, now)
    rows = {(r["subject"], r["name"]): r for r in view["suggestions"]}
    assert list(rows) == [("group", "ml"), ("user", "ann"), ("user", "mo"), ("user", "zed")]

    ann_row = rows[("user", "ann")]
    assert (ann_row["peak_slices"], ann_row["peak_milli"]) == (2.0, 1250)
    # ann has no quota of her own: the default one (slices only) limits her, so only
    # slices are suggested: 2 * 1.2 + 1 = 3.4 -> 4
    assert ann_row["current"] == {"max_slices": 2, "max_milli": None}
    assert ann_row["current_is_default"]
    assert ann_row["suggested"] == {"max_slices": 4, "max_milli": None}
    assert ann_row["change"] == "raise" and ann_row["no_longer_fits"] == []
    assert ann_row["allocations"] == 2
    assert rows[("user", "mo")]["peak_milli"] == 1250
    ml = rows[("group", "ml")]
    assert (ml["peak_slices"], ml["peak_milli"]) == (2.0, 1250)
    assert ml["current"] == {"max_slices": 10, "max_milli": None}
    assert ml["suggested"] == {"max_slices": 4, "max_milli": None} and ml["change"] == "lower"
    # zed has a quota but held nothing in the window: no suggestion (the buffers alone
    # would lock him out of a whole GPU on his return)
    zed = rows[("user", "zed")]
    assert zed["allocations"] == 0 and zed["suggested"] is None and zed["change"] is None
    assert zed["current"] == {"max_slices": 4, "max_milli": 4000}
    assert not zed["current_is_default"]


def test_a_lowering_suggestion_names_the_profiles_that_would_no_longer_fit(make_ledger):
    ledger = make_ledger(quotas={"users": {"bea": {"max_slices": 4, "max_milli": 4000}}})
    now = utcnow()
    alloc, _ = ledger.allocate(Caller("bea", (), "bea"), "share-250", "lab")
    set_allocation(ledger, alloc["id"], created_at=now - DAY)
    with ledger.db.reading() as s:
        effective = ledger.effective_quotas(s)
    view = quota_suggestions(ledger, effective, SuggestionSettings(30, 1.2, 1.0, 250), now)
    (bea,) = view["suggestions"]
    # 250 * 1.2 + 250 = 550 -> 550 milli: a whole GPU no longer fits
    assert bea["suggested"] == {"max_slices": 3, "max_milli": 550} and bea["change"] == "lower"
    assert "gpu-1" in bea["no_longer_fits"] and "share-250" not in bea["no_longer_fits"]
    assert view["rule"].startswith("the most held at once over 30 days times 1.2")


def test_no_queue_says_by_which_rule_a_short_wait_did_not_count(make_ledger):
    """A job did wait (the panel lists it): the verdict says it was too little to count,
    not that there was no queue."""
    ledger = make_ledger()
    now = utcnow()
    sample(ledger, now - DAY, allocated_milli=3000, used_milli=2000, reported_milli=3000)
    sample(ledger, now - HOUR, allocated_milli=3000, used_milli=2000, reported_milli=3000)
    [_history, no_queue] = capacity_check(ledger, now)["verdicts"]
    assert no_queue["code"] == "no-queue"
    assert no_queue["text"] == (
        "No lasting batch queue in the last 7 days: on average 0.0 jobs waited (a queue "
        "counts from 1; too few jobs finished for median times)."
    )
    for _ in range(5):  # waits of 6 minutes for runs of 3 h: 3 %
        job(ledger, now - 4 * HOUR, now - 4 * HOUR + 6 * MINUTE, now - HOUR, run=3 * 3600.0)
    text = capacity_check(ledger, now)["verdicts"][-1]["text"]
    assert text == (
        "No lasting batch queue in the last 7 days: the median queue time was 3 % of the "
        "median run time (a queue counts above 10 %)."
    ), text
