"""Times as the API writes them: ISO 8601 in UTC with a ``Z`` (``2026-12-07T15:04:05Z``).

One writer for the service's JSON (datetimes from the ledger, which stores UTC without a
zone) and for the server extension's and the runner's (epoch seconds)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload


@overload
def iso(when: datetime | float) -> str: ...
@overload
def iso(when: None) -> None: ...
@overload
def iso(when: datetime | float | None) -> str | None: ...


def iso(when: datetime | float | None) -> str | None:
    """``when`` in ISO 8601 UTC with a ``Z``: a datetime (one without a zone is UTC, as the
    ledger stores it) or epoch seconds; None stays None."""
    if when is None:
        return None
    if not isinstance(when, datetime):
        when = datetime.fromtimestamp(when, UTC)
    elif when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
