"""Durations as the service writes them for people (job logs, waiting reasons)."""

from __future__ import annotations


def work_span(seconds: float) -> str:
    """Work done or lost, to the second, as the lab and the admin panel write it: "0s",
    "45s", "1m 31s", "2h 05m". Whole seconds, rounded down: one rule wherever a person reads
    a job's lost work (issue 44: the panel said "2 min" where the lab said "1m 31s")."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def spoken(seconds: float) -> str:
    """A span as people say it: "45 s", "12 min", "2 h 5 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
