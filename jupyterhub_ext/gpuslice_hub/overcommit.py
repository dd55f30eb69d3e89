"""Overcommit of time-sliced shares from history (GPUSliceService.share_overcommit_ratio).

A share promises its holder ``gpu_milli`` of a GPU's time and a memory cap. Most holders
never come near the cap: someone who asked for 20 GiB and, over the last 30 days, never
used more than 8 GiB leaves 12 GiB of the GPU unused whenever they hold it. With overcommit
on, such a holder's next share of that profile is *charged* less than it promises — its
observed peak times a headroom, never less than the promise divided by the ratio — so more
shares fit on a GPU:

* the charge scales the share's milli-GPU and memory by the same factor, so a GPU takes at
  most ``ratio`` times its memory in caps and ``ratio`` times its compute in shares (time
  slicing divides compute among whoever runs; memory is the resource that can run out);
* the holder's memory cap is unchanged: the server extension still enforces the whole
  promised cap per kernel (``memcap.py``), and what overcommit costs — memory-cap warnings
  and kills of overcommitted holders — is counted in the admin panel;
* a holder without enough history (``share_overcommit_min_hours`` of reported use of that
  profile in ``share_overcommit_days``), a share without a memory cap, and every whole GPU
  and MIG instance are charged in full;
* servers and batch jobs are told apart: a batch job is charged from its owner's batch
  jobs of that profile (their runners' reports), a server from their servers';
* quotas count the promise, not the charge: overcommit is the site's risk, not a discount
  on a researcher's quota.

The history is each allocation's peak reported memory (``usage_reports.peak_memory_mib``),
read once every few minutes, not on every spawn.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from .clock import now as clock_now
from .db.admin_models import UsageReportRow
from .db.loopguard import hold, not_on_loop
from .db.models import AllocationRow
from .placement import Request
from .profiles import Profile

# How long a read of the history is used before it is read again: a new peak changes the
# charge of the next spawn a few minutes late, which matters less than a query per spawn.
REFRESH = timedelta(minutes=5)
MAX_RATIO = 2.0


@dataclass(frozen=True)
class OvercommitSettings:
    ratio: float = 1.0  # 1: off
    headroom: float = 1.2
    days: float = 30.0
    min_hours: float = 24.0

    @property
    def on(self) -> bool:
        return self.ratio > 1.0

    def json(self) -> dict[str, float | bool]:
        return {
            "enabled": self.on,
            "ratio": self.ratio,
            "headroom": self.headroom,
            "days": self.days,
            "min_hours": self.min_hours,
        }


@dataclass(frozen=True)
class Observed:
    """One user's use of one share profile, for one purpose, over the history window."""

    peak_mib: float  # the most memory any of their allocations reported
    hours: float  # how long they held it, counting allocations with a report only


Key = tuple[str, str, str]  # (user, profile, purpose)


def read_history(s: Session, since: datetime, now: datetime) -> dict[Key, Observed]:
    """Per (user, profile, purpose) of share allocations held since ``since``: the peak
    and the hours held (of the part of each allocation inside the window)."""
    rows = s.execute(
        select(
            AllocationRow.user,
            AllocationRow.profile,
            AllocationRow.purpose,
            AllocationRow.created_at,
            AllocationRow.released_at,
            UsageReportRow.peak_memory_mib,
        )
        .join(UsageReportRow, UsageReportRow.allocation_id == AllocationRow.id)
        .where(
            AllocationRow.kind == "share",
            UsageReportRow.peak_memory_mib.is_not(None),
            or_(AllocationRow.released_at.is_(None), AllocationRow.released_at >= since),
        )
    )
    peak: dict[Key, float] = defaultdict(float)
    hours: dict[Key, float] = defaultdict(float)
    for user, profile, purpose, created, released, mib in rows:
        key = (user, profile, purpose)
        peak[key] = max(peak[key], float(mib or 0.0))
        held = min(released or now, now) - max(created, since)
        hours[key] += max(held.total_seconds(), 0.0) / 3600
    return {k: Observed(peak[k], hours[k]) for k in peak}


def charge_factor(profile: Profile, seen: Observed | None, settings: OvercommitSettings) -> float:
    """The fraction of ``profile``'s nominal share a holder with history ``seen`` is charged
    (1: in full)."""
    cap = profile.gpu_memory_mib
    if not settings.on or profile.kind != "share" or cap <= 0:
        return 1.0
    if seen is None or seen.hours < settings.min_hours:
        return 1.0
    return max(1.0 / settings.ratio, min(1.0, seen.peak_mib * settings.headroom / cap))


def charged_request(request: Request, factor: float) -> Request:
    """``request`` (a share) charged ``factor`` of its milli-GPU and memory, rounded up."""
    if factor >= 1.0:
        return request
    return replace(
        request,
        gpu_milli=max(1, math.ceil(request.gpu_milli * factor)),
        gpu_memory_mib=max(1, math.ceil(request.gpu_memory_mib * factor)),
    )


class OvercommitHistory:
    """The history the charges are computed from, read again every ``REFRESH``."""

    def __init__(self, settings: OvercommitSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._read_at: datetime | None = None
        self._seen: dict[Key, Observed] = {}

    def observed(self, s: Session) -> dict[Key, Observed]:
        now = clock_now()
        with hold(self._lock):
            if self._read_at is None or not self._read_at <= now < self._read_at + REFRESH:
                not_on_loop("reading the usage history")
                since = now - timedelta(days=self.settings.days)
                self._seen = read_history(s, since, now)
                self._read_at = now
            return self._seen

    def forget(self) -> None:
        """Read the history again at the next spawn (tests, and after an admin's change)."""
        with self._lock:
            self._read_at = None

    def request_for(self, s: Session, user: str, profile: Profile, purpose: str) -> Request:
        """What a slice of ``profile`` for ``user``'s ``purpose`` (a server, a batch job)
        is placed as: a share charged from history, anything else as it asks."""
        request = profile.request()
        if not self.settings.on or profile.kind != "share" or profile.gpu_memory_mib <= 0:
            return request
        seen = self.observed(s).get((user, profile.name, purpose))
        return charged_request(request, charge_factor(profile, seen, self.settings))
