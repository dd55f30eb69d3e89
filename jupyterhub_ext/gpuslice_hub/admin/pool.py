"""The pool at one instant, read in one transaction: what the overview and a sample show."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..clusterview import build_hosts
from ..db.admin_models import UsageReportRow
from ..db.jobs_models import JobRow
from ..jobs.states import ACTIVE, TERMINAL
from ..ledger import Ledger
from ..placement import HostState
from ..snapshot import AllocationView, InventoryView
from .fragmentation import fragmented_milli, free_milli
from .reports import pool_used

# A preempted job is on its way back into the queue; it holds no slice.
QUEUED = frozenset({"queued", "preempted"})


@dataclass
class Pool:
    inventory: InventoryView
    active: list[AllocationView]
    # free capacity per present host, as placement sees it
    hosts: list[HostState]
    reports: dict[int, Any]
    queued_jobs: int
    running_jobs: int
    # allocation id -> the unfinished job holding it
    job_of: dict[int, int] = field(default_factory=dict)
    fragmented: dict[str, int] = field(default_factory=dict)


def read_pool(ledger: Ledger, with_jobs: bool = False) -> Pool:
    """Inventory, active allocations, usage reports and the job queue, read together.

    ``with_jobs``: also map allocations to their jobs (the overview names them).
    """
    with ledger.db.reading() as s:
        inv = ledger.inventory_cache.get(s)
        # the ledger's active views, caught up in this transaction (read-only: shared)
        active = ledger.active_cache.get(s)
        reports = {
            r.allocation_id: r
            for r in s.connection().execute(select(UsageReportRow.__table__)).all()
        }
        queued, running = _job_counts(s)
        job_of = _jobs_by_allocation(s) if with_jobs else {}
    hosts = build_hosts(inv.hosts, inv.gpus, active)
    requests = [p.request() for p in ledger.profiles.values()]
    return Pool(
        inventory=inv,
        active=active,
        hosts=hosts,
        reports=reports,
        queued_jobs=queued,
        running_jobs=running,
        job_of=job_of,
        fragmented=fragmented_milli(hosts, requests),
    )


def _job_counts(s: Session) -> tuple[int, int]:
    rows = s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
    queued = sum(n for state, n in rows if state in QUEUED)
    running = sum(n for state, n in rows if state in ACTIVE)
    return queued, running


def _jobs_by_allocation(s: Session) -> dict[int, int]:
    rows = s.execute(
        select(JobRow.id, JobRow.allocation_ids).where(JobRow.state.not_in(TERMINAL))
    ).all()
    return {int(alloc_id): job_id for job_id, ids in rows for alloc_id in ids or ()}


def totals(pool: Pool, now: datetime) -> dict[str, Any]:
    """The pool's figures in milli-GPU, plus counts; the same keys a usage sample stores."""
    present_hosts = {h.name for h in pool.inventory.hosts if h.present}
    gpus = [g for g in pool.inventory.gpus if g.present and g.host in present_hosts]
    used, reported = pool_used(pool.active, pool.reports, now)
    return {
        # the hardware, drained GPUs included: their holders are still allocated on them
        "capacity_milli": 1000 * len(gpus),
        # what can be handed out: a drained GPU keeps its holders but takes no new ones
        "in_service_milli": 1000 * sum(1 for g in gpus if not g.drained),
        "allocated_milli": sum(a.gpu_milli for a in pool.active),
        "interactive_milli": sum(a.gpu_milli for a in pool.active if a.purpose == "interactive"),
        "batch_milli": sum(a.gpu_milli for a in pool.active if a.purpose == "batch"),
        # held by Slurm jobs that did not come through gpuslice (slurm_sync_interval)
        "external_milli": sum(a.gpu_milli for a in pool.active if a.purpose == "external"),
        "used_milli": used,
        "reported_milli": reported,
        "free_milli": sum(free_milli(g) for h in pool.hosts for g in h.gpus),
        "fragmented_milli": sum(pool.fragmented.values()),
        "gpus": len(gpus),
        "drained_gpus": sum(1 for g in gpus if g.drained),
        "active_allocations": len(pool.active),
        "queued_jobs": pool.queued_jobs,
        "running_jobs": pool.running_jobs,
    }
