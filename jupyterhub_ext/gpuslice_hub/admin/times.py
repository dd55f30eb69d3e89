"""Timestamps as the admin views compare them."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(ts: datetime) -> datetime:
    """SQLite hands back naive datetimes; every timestamp the ledger stores is UTC."""
    return ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)
