"""Batch time windows: parsing (every mistake named at start), opening and closing times
(days, spans across midnight, clock changes), and the scheduler keeping a job inside its
window: it waits until the window opens, and is checkpointed and requeued when it closes.

The scheduler is driven at chosen instants (``tick(now)``) over a real SQLite ledger."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import select, update

from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.errors import ConfigError, Refused
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.jobs.windows import parse_windows
from tests.jobs.full_cluster import PROFILES, IdleBackend, hosts, insert_queued
from tests.service.conftest import build_ledger

BERLIN = ZoneInfo("Europe/Berlin")


def at(text: str, tz: ZoneInfo = BERLIN) -> datetime:
    """A local time in Berlin ("2026-12-04 23:00", a Friday), as the UTC instant it is."""
    return datetime.fromisoformat(text).replace(tzinfo=tz).astimezone(UTC)


def window(spans, tz: str = "Europe/Berlin"):
    return parse_windows({"w": spans}, tz)["w"]


# --- parsing ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spans", "needle"),
    [
        ("2am-6am", "write it as [DAYS ]HH:MM-HH:MM"),
        ("25:00-06:00", "not a time of day"),
        ("02:00-24:30", "not a time of day"),
        ("24:00-02:00", "not a time of day"),
        ("06:00-06:00", "opens and closes at the same time"),
        ("mon-fry 02:00-06:00", "days are mon, tue"),
        ([], "a non-empty list of spans"),
        (7, "a span or a non-empty list"),
    ],
)
def test_a_bad_span_is_refused_naming_the_window(spans, needle):
    with pytest.raises(ConfigError) as e:
        parse_windows({"night": spans}, "UTC")
    assert e.value.key.startswith("JobManager.time_windows.night") and needle in str(e.value)


def test_a_bad_name_or_time_zone_is_refused():
    with pytest.raises(ConfigError) as e:
        parse_windows({"no spaces please": "02:00-06:00"}, "UTC")
    assert e.value.key == "JobManager.time_windows"
    with pytest.raises(ConfigError) as e:
        parse_windows({"night": "02:00-06:00"}, "Mars/Olympus")
    assert e.value.key == "JobManager.time_window_timezone"


def test_class_windows_must_name_a_class_and_a_window(tmp_path: Path):
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    for classes in ({"urgent": "night"}, {"preemptible": "day"}):
        with pytest.raises(ConfigError) as e:
            JobManager(
                ledger,
                ledger.db,
                IdleBackend(),  # type: ignore[arg-type]
                tmp_path / "jobs",
                time_windows={"night": "02:00-06:00"},
                class_time_windows=classes,
            )
        assert e.value.key == "JobManager.class_time_windows"


# --- opening and closing ------------------------------------------------------------------


def test_a_weeknight_span_runs_into_the_next_morning_and_skips_the_weekend():
    w = window("mon-fri 19:00-07:00")
    assert w.is_open(at("2026-12-04 23:00"))  # Friday night
    assert w.is_open(at("2026-12-05 06:59:59"))  # Saturday morning, still Friday's span
    assert not w.is_open(at("2026-12-05 07:00"))
    assert not w.is_open(at("2026-12-05 20:00"))  # Saturday evening: not a listed day
    assert w.opens_at(at("2026-12-05 10:00")) == at("2026-12-07 19:00")  # Monday
    assert w.closes_at(at("2026-12-04 23:00")) == at("2026-12-05 07:00")
    assert w.opens_at(at("2026-12-04 23:00")) is None
    assert w.closes_at(at("2026-12-05 10:00")) is None


def test_days_wrap_around_the_week_and_spans_that_touch_close_once():
    w = window("fri-mon 00:00-24:00")
    assert {w.is_open(at(f"2026-12-0{d} 12:00")) for d in (4, 5, 6, 7)} == {True}
    assert not w.is_open(at("2026-12-08 12:00"))  # Tuesday
    # Friday 00:00 to Tuesday 00:00 without a gap: it closes once, at the end
    assert w.closes_at(at("2026-12-04 12:00")) == at("2026-12-08 00:00")
    # the weekend, then Sunday's night span (starting 20:00) into Monday 06:00
    both = window(["sat,sun 00:00-24:00", "sun-thu 20:00-06:00"])
    assert both.closes_at(at("2026-12-05 12:00")) == at("2026-12-07 06:00")
    # without a Sunday night span, Monday 00:00 is a gap until Monday 20:00
    gap = window(["sat,sun 00:00-24:00", "mon-fri 20:00-06:00"])
    assert gap.closes_at(at("2026-12-05 12:00")) == at("2026-12-07 00:00")


def test_a_night_span_over_a_clock_change_ends_at_the_local_hour():
    # Europe/Berlin goes from CEST to CET at 03:00 on Sunday 2026-10-25: the night is an hour
    # longer, and it still ends at 06:00 local time (05:00 UTC, not 04:00)
    w = window("22:00-06:00")
    assert w.closes_at(at("2026-10-24 23:00")) == datetime(2026, 10, 25, 5, 0, tzinfo=UTC)
    assert w.opens_at(at("2026-10-25 12:00")) == datetime(2026, 10, 25, 21, 0, tzinfo=UTC)


def test_seconds_may_be_given():
    w = window("12:00:30-12:01:00", "UTC")
    assert not w.is_open(datetime(2026, 12, 4, 12, 0, 29, tzinfo=UTC))
    assert w.is_open(datetime(2026, 12, 4, 12, 0, 30, tzinfo=UTC))
    assert not w.is_open(datetime(2026, 12, 4, 12, 1, 0, tzinfo=UTC))


# --- the scheduler ------------------------------------------------------------------------


def scheduler_with(tmp_path: Path, **traits) -> Scheduler:
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=PROFILES, hosts=hosts(1))
    manager = JobManager(ledger, ledger.db, IdleBackend(), tmp_path / "jobs", **traits)  # type: ignore[arg-type]
    manager.run_jobs_as_service_user = True
    return Scheduler(manager)


def job(scheduler: Scheduler, job_id: int) -> JobRow:
    with scheduler.jobs.db.reading() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        s.expunge(row)
        return row


def test_a_job_waits_for_its_window_starts_in_it_and_is_requeued_when_it_closes(tmp_path):
    scheduler = scheduler_with(
        tmp_path, time_windows={"night": "02:00-06:00"}, time_window_timezone="Europe/Berlin"
    )
    db = scheduler.jobs.db
    windowed, anytime = insert_queued(
        db, tmp_path, [("ann", "gpu-1", "preemptible"), ("bob", "gpu-1", "preemptible")]
    )
    with db.writing() as s:
        s.execute(update(JobRow).where(JobRow.id == windowed).values(time_window="night"))

    # Friday 18:00: the cluster is free, but the window is closed
    scheduler.tick(at("2026-12-04 18:00"))
    assert job(scheduler, anytime).state == "starting"
    waiting = job(scheduler, windowed)
    assert waiting.state == "queued"
    assert waiting.waiting_reason == (
        "waits for its time window 'night', 02:00-06:00 (Europe/Berlin), "
        "which opens Sat 2026-12-05 02:00 CET"
    )
    # the pass is due again when the window opens, though nothing else changes
    assert scheduler._next_due == at("2026-12-05 02:00")

    scheduler.tick(at("2026-12-05 02:00"))
    assert job(scheduler, windowed).state == "starting"

    # inside the window nothing happens; at 06:00 the job is asked to checkpoint and go
    scheduler.tick(at("2026-12-05 05:59:59"))
    assert job(scheduler, windowed).state == "starting"
    scheduler.tick(at("2026-12-05 06:00"))
    closed = job(scheduler, windowed)
    assert closed.state == "preempting"
    with db.reading() as s:
        reason = s.scalars(select(JobRow).where(JobRow.id == windowed)).one().transitions[-1].reason
    assert reason == "its time window 'night' closed (by scheduler)"
    # the job without a window runs on
    assert job(scheduler, anytime).state == "starting"


def test_submissions_name_a_known_window_and_keep_their_class_window(tmp_path):
    scheduler = scheduler_with(
        tmp_path,
        time_windows={"night": "02:00-06:00", "weekend": "sat,sun 00:00-24:00"},
        class_time_windows={"preemptible": "night"},
    )
    jobs = scheduler.jobs
    base = {"profile": "gpu-1"}
    assert jobs._validate({**base, "priority": "normal"})["time_window"] is None
    assert (
        jobs._validate({**base, "priority": "normal", "time_window": "weekend"})["time_window"]
        == "weekend"
    )
    # the class's window applies without asking, and cannot be swapped for another
    assert jobs._validate({**base, "priority": "preemptible"})["time_window"] == "night"
    with pytest.raises(Refused) as e:
        jobs._validate({**base, "priority": "preemptible", "time_window": "weekend"})
    assert "preemptible jobs run in the time window 'night'" in e.value.message
    for bad in ("nightly", 3, ""):
        with pytest.raises(Refused) as e:
            jobs._validate({**base, "priority": "normal", "time_window": bad})
        assert e.value.code == "bad_request" and "unknown time window" in e.value.message
    standing = jobs.window_standing(at("2026-12-05 03:00"))
    assert [w["name"] for w in standing["windows"]] == ["night", "weekend"]
    assert [w["open"] for w in standing["windows"]] == [True, True]
    assert standing["class_windows"] == {"preemptible": "night"}
