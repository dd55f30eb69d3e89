"""Batch time windows: a job (or every job of a priority class) runs only inside a window.

An admin names windows in ``JobManager.time_windows``, each one or more spans such as
``"02:00-06:00"`` (every day), ``"mon-fri 19:00-07:00"`` (starting on those days, ending the
next morning) or ``"sat,sun 00:00-24:00"``, in ``JobManager.time_window_timezone``. A queued
job waits until its window opens; a running one is checkpointed and requeued when it closes
(the scheduler preempts it, as it would for a person's spawn) and resumes at the next opening.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, tzinfo
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from ..errors import ConfigError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY = 86400  # seconds
_TIME = r"\d{1,2}:\d{2}(?::\d{2})?"
_SPAN = re.compile(rf"^(?:(?P<days>[a-z,\-]+)\s+)?(?P<start>{_TIME})-(?P<end>{_TIME})$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True)
class Span:
    """From ``start`` to ``end`` (seconds of the day), starting on ``days`` (0 = Monday); an
    ``end`` at or before ``start`` is on the next day."""

    days: frozenset[int]
    start: int
    end: int
    text: str

    def _bounds(self, day: date, tz: tzinfo) -> tuple[datetime, datetime]:
        begin = datetime.combine(day, _clock(self.start), tzinfo=tz)
        end_day = day + timedelta(days=1 if self.end <= self.start or self.end == DAY else 0)
        stop = datetime.combine(end_day, _clock(self.end % DAY), tzinfo=tz)
        return begin, stop

    def containing(self, now: datetime, tz: tzinfo) -> datetime | None:
        """The end of this span's occurrence that ``now`` is in, if any."""
        local = now.astimezone(tz).date()
        for back in (0, 1):
            day = local - timedelta(days=back)
            if day.weekday() in self.days:
                begin, stop = self._bounds(day, tz)
                if begin <= now < stop:
                    return stop
        return None

    def next_start(self, now: datetime, tz: tzinfo) -> datetime | None:
        local = now.astimezone(tz).date()
        for ahead in range(8):
            day = local + timedelta(days=ahead)
            if day.weekday() in self.days:
                begin, _ = self._bounds(day, tz)
                if begin > now:
                    return begin
        return None


@dataclass(frozen=True)
class TimeWindow:
    name: str
    spans: tuple[Span, ...]
    tz: tzinfo
    tz_name: str

    def is_open(self, now: datetime) -> bool:
        return any(s.containing(now, self.tz) is not None for s in self.spans)

    def opens_at(self, now: datetime) -> datetime | None:
        """When it next opens (None while open)."""
        if self.is_open(now):
            return None
        starts = [t for s in self.spans if (t := s.next_start(now, self.tz)) is not None]
        return min(starts, default=None)

    def closes_at(self, now: datetime) -> datetime | None:
        """When it next closes (None while closed); spans that follow each other without a
        gap ("mon-fri 00:00-24:00") close once, at the end of the last."""
        end: datetime | None = None
        t = now
        for _ in range(16):
            ends = [e for s in self.spans if (e := s.containing(t, self.tz)) is not None]
            if not ends:
                break
            end = t = max(ends)
        return end

    def describe(self) -> str:
        return f"{', '.join(s.text for s in self.spans)} ({self.tz_name})"

    def standing(self, now: datetime) -> dict[str, Any]:
        """For the API: the window, whether it is open, and when that changes."""
        opens, closes = self.opens_at(now), self.closes_at(now)
        return {
            "name": self.name,
            "text": self.describe(),
            "open": opens is None,
            "opens_at": opens.isoformat() if opens else None,
            "closes_at": closes.isoformat() if closes else None,
        }


def _clock(seconds: int) -> time:
    return time(seconds // 3600, seconds // 60 % 60, seconds % 60)


def _seconds(text: str, key: str, end: bool) -> int:
    hours, minutes, seconds = (int(x) for x in (text + ":0").split(":")[:3])
    if (
        minutes > 59
        or seconds > 59
        or hours > 24
        or (hours == 24 and (minutes or seconds or not end))
    ):
        raise ConfigError(key, f"{text!r} is not a time of day (00:00 to 23:59; 24:00 to end)")
    return hours * 3600 + minutes * 60 + seconds


def _days(text: str | None, key: str) -> frozenset[int]:
    if text is None:
        return frozenset(range(7))
    out: set[int] = set()
    for item in text.split(","):
        first, _, last = item.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise ConfigError(key, f"{item!r}: days are {', '.join(DAYS)} or ranges like mon-fri")
        a, b = DAYS.index(first), DAYS.index(last or first)
        out.update((a + i) % 7 for i in range((b - a) % 7 + 1))
    return frozenset(out)


def parse_span(text: Any, key: str) -> Span:
    if not isinstance(text, str):
        raise ConfigError(key, f"must be a string like 'mon-fri 02:00-06:00', got {text!r}")
    m = _SPAN.match(text.strip().lower())
    if m is None:
        raise ConfigError(
            key, f"{text!r}: write it as [DAYS ]HH:MM-HH:MM, e.g. 'sat,sun 00:00-24:00'"
        )
    start = _seconds(m["start"], key, end=False)
    end = _seconds(m["end"], key, end=True)
    if start == end % DAY and end != DAY:
        raise ConfigError(key, f"{text!r} opens and closes at the same time")
    return Span(_days(m["days"], key), start, end, text.strip())


def local_zone_name() -> str:
    """The machine's IANA time zone ($TZ, /etc/timezone, the /etc/localtime link), else UTC:
    a fixed UTC offset would be an hour off for half the year where clocks change."""
    candidates = [os.environ.get("TZ", "").lstrip(":")]
    with contextlib.suppress(OSError):
        candidates.append(Path("/etc/timezone").read_text().strip())
    with contextlib.suppress(OSError):
        candidates.append(os.readlink("/etc/localtime").partition("zoneinfo/")[2])
    for name in candidates:
        if name:
            with contextlib.suppress(ZoneInfoNotFoundError, ValueError):
                ZoneInfo(name)
                return name
    return "UTC"


def parse_windows(raw: Any, tz_name: str) -> dict[str, TimeWindow]:
    """``{name: span or [spans]}`` from ``JobManager.time_windows``; errors name the key."""
    key = "JobManager.time_windows"
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"must be a dict of name -> spans, got {type(raw).__name__}")
    tz_name = tz_name or local_zone_name()
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(
            "JobManager.time_window_timezone", f"{tz_name!r} is not a time zone"
        ) from None
    out = {}
    for name, spans in raw.items():
        if not isinstance(name, str) or not _NAME.match(name):
            raise ConfigError(key, f"{name!r}: a name of letters, digits, '.', '_' or '-'")
        listed = [spans] if isinstance(spans, str) else spans
        if not isinstance(listed, list | tuple) or not listed:
            raise ConfigError(f"{key}.{name}", "must be a span or a non-empty list of spans")
        parsed = tuple(parse_span(s, f"{key}.{name}[{i}]") for i, s in enumerate(listed))
        out[name] = TimeWindow(name, parsed, tz, tz_name)
    return out
