"""Who holds a batch job's slice in the ledger: the allocation's server name, ``job-<id>``.

The link from a slice back to its job once the job no longer lists it (a finished job's
``allocation_ids`` are emptied before its slice is released: jobs/recovery.py)."""

from __future__ import annotations

PREFIX = "job-"


def job_holder(job_id: int) -> str:
    """The server name of the allocations that job ``job_id`` holds."""
    return f"{PREFIX}{job_id}"


def holder_job(server_name: str) -> int | None:
    """The job whose allocation has this server name, or None (a person's server)."""
    rest = server_name.removeprefix(PREFIX) if server_name.startswith(PREFIX) else ""
    return int(rest) if rest.isascii() and rest.isdigit() else None
