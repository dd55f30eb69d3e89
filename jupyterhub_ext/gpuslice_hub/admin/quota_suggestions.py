"""Quota suggestions from history: the most each user and group held at once over the last
``days``, times ``factor``, plus a buffer; next to the quota in force.

What counts is what a quota counts (``quotas.py``): every allocation but Slurm's foreign
holdings, each with its profile's ``quota_weight`` in slices and its GPU share in milli.
A group's figure counts the allocations charged to it, else those of users whose first
group it is (the same attribution as the per-group GPU-hours).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select

from gpuslice.isotime import iso

from ..ledger import Ledger
from ..ledger.base import quota_usage
from ..quotas import Limit, Quotas
from .accounting import ALLOCATIONS, NO_GROUP, counted_group
from .sqltime import epoch

# max_milli is rounded up to a twentieth of a GPU: a suggestion of 1.237 GPUs reads as
# false precision
MILLI_STEP = 50


@dataclass(frozen=True)
class SuggestionSettings:
    days: float = 30.0
    factor: float = 1.2
    buffer_slices: float = 1.0
    buffer_milli: int = 250

    def describe(self) -> str:
        return (
            f"the most held at once over {self.days:g} days times {self.factor:g}, plus "
            f"{self.buffer_slices:g} slice(s) and {self.buffer_milli / 1000:g} GPU"
        )


@dataclass
class Peak:
    slices: float = 0.0
    milli: int = 0
    slices_at: float | None = None
    milli_at: float | None = None
    allocations: int = 0


def peak_of(intervals: list[tuple[float, float, float, int]]) -> Peak:
    """The most held at once, in slices and in milli (each at its own moment), over
    ``(start, end, slices, milli)`` intervals. Something released at the instant another
    is allocated is not held together with it."""
    events: list[tuple[float, int, float, int]] = []
    for start, end, slices, milli in intervals:
        if end <= start:
            continue
        events.append((start, 1, slices, milli))
        events.append((end, 0, -slices, -milli))  # 0 sorts releases first
    peak = Peak(allocations=len(events) // 2)
    slices_now, milli_now = 0.0, 0
    for t, _, ds, dm in sorted(events):
        slices_now += ds
        milli_now += dm
        if slices_now > peak.slices + 1e-9:
            peak.slices, peak.slices_at = slices_now, t
        if milli_now > peak.milli:
            peak.milli, peak.milli_at = milli_now, t
    peak.slices = round(peak.slices, 3)
    return peak


def suggest(peak: Peak, settings: SuggestionSettings, current: Limit | None) -> dict[str, Any]:
    """The suggested limits: on the dimensions the quota in force limits (slices, GPUs),
    both when none is in force. A limit the site never set is never added by Apply."""
    slices = math.ceil(peak.slices * settings.factor + settings.buffer_slices - 1e-9)
    milli = peak.milli * settings.factor + settings.buffer_milli
    limits = current or Limit()
    unlimited = limits.max_slices is None and limits.max_milli is None
    keep_slices = unlimited or limits.max_slices is not None
    keep_milli = unlimited or limits.max_milli is not None
    return {
        "max_slices": slices if keep_slices else None,
        "max_milli": MILLI_STEP * math.ceil(milli / MILLI_STEP - 1e-9) if keep_milli else None,
    }


def change(suggested: dict[str, Any], current: Limit | None) -> str:
    """``new`` (no quota in force), ``lower`` (either limit goes down), ``raise`` or ``same``."""
    if current is None or (current.max_slices is None and current.max_milli is None):
        return "new"
    pairs = [
        (suggested["max_slices"], current.max_slices),
        (suggested["max_milli"], current.max_milli),
    ]
    if any(new < old for new, old in pairs if new is not None and old is not None):
        return "lower"
    if any(new > old for new, old in pairs if new is not None and old is not None):
        return "raise"
    return "same"


def _no_longer_fits(
    ledger: Ledger, inv: Any, groups: set[str], suggested: dict[str, Any]
) -> list[str]:
    """The profiles these groups may ask for of which not even one would fit the limits."""
    out = []
    for name, profile in sorted(ledger.profiles.items()):
        if not profile.allowed_for(groups):
            continue
        one = quota_usage(profile, inv)
        slices, milli = suggested["max_slices"], suggested["max_milli"]
        if (slices is not None and one.slices > slices + 1e-9) or (
            milli is not None and one.milli > milli
        ):
            out.append(name)
    return out


def _limit_json(limit: Limit | None) -> dict[str, Any] | None:
    if limit is None:
        return None
    return {"max_slices": limit.max_slices, "max_milli": limit.max_milli}


def _at(t: float | None) -> str | None:
    return None if t is None else iso(datetime.fromtimestamp(t, UTC))


def quota_suggestions(
    ledger: Ledger, quotas: Quotas, settings: SuggestionSettings, now: datetime
) -> dict[str, Any]:
    """Per user and group that held something in the window or has a quota: the peak,
    the suggested quota and the one in force (``quotas``: the effective ones)."""
    since = now - timedelta(days=settings.days)
    start, end = since.timestamp(), now.timestamp()
    cols = ALLOCATIONS.c
    with ledger.db.reading() as s:
        inv = ledger.inventory_cache.get(s)
        rows = s.execute(
            select(
                cols.user,
                cols.groups,
                counted_group(),
                cols.quota_weight,
                cols.gpu_milli,
                epoch(cols.created_at),
                epoch(cols.released_at),
            ).where(
                cols.purpose != "external",
                cols.created_at < now,
                or_(cols.released_at.is_(None), cols.released_at > since),
            )
        ).all()
    by: dict[tuple[str, str], list[tuple[float, float, float, int]]] = defaultdict(list)
    # the groups a subject asks with: a user's as their allocations recorded them
    groups_of: dict[tuple[str, str], set[str]] = defaultdict(set)
    for user, groups, group, weight, milli, created, released in rows:
        interval = (
            max(float(created), start),
            end if released is None else min(float(released), end),
            float(weight),
            int(milli),
        )
        by[("user", user)].append(interval)
        groups_of[("user", user)].update(groups or ())
        if group != NO_GROUP:
            by[("group", group)].append(interval)
            groups_of[("group", group)].add(group)
    for name in quotas.users:
        by.setdefault(("user", name), [])
    for name in quotas.groups:
        by.setdefault(("group", name), [])
    out = []
    for (subject, name), intervals in sorted(by.items()):
        peak = peak_of(intervals)
        limit = quotas.groups.get(name) if subject == "group" else quotas.users.get(name)
        current = limit if limit is not None or subject == "group" else quotas.default_user
        # nothing held in the window: no history to suggest from (the buffers alone would
        # lock out someone back from a month away)
        suggested = suggest(peak, settings, current) if peak.allocations else None
        groups = groups_of[(subject, name)] or ({name} if subject == "group" else set())
        out.append(
            {
                "subject": subject,
                "name": name,
                "allocations": peak.allocations,
                "peak_slices": peak.slices,
                "peak_slices_at": _at(peak.slices_at),
                "peak_milli": peak.milli,
                "peak_milli_at": _at(peak.milli_at),
                "suggested": suggested,
                "current": _limit_json(current),
                # the user's quota is the default one, not one of their own
                "current_is_default": subject == "user" and limit is None and current is not None,
                "change": change(suggested, current) if suggested else None,
                "no_longer_fits": (
                    _no_longer_fits(ledger, inv, groups, suggested) if suggested else []
                ),
            }
        )
    return {
        "generated_at": iso(now),
        "from": iso(since),
        "to": iso(now),
        "rule": settings.describe(),
        "settings": {
            "days": settings.days,
            "factor": settings.factor,
            "buffer_slices": settings.buffer_slices,
            "buffer_milli": settings.buffer_milli,
        },
        "suggestions": out,
    }
