"""Durations as the service writes them for people (job logs, waiting reasons)."""

from __future__ import annotations


def spoken(seconds: float) -> str:
    """A span as people say it: "45 s", "12 min", "2 h 5 min"."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"
