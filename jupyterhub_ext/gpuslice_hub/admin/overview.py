"""``GET api/admin/overview``: every host, GPU and slice, who holds it, and how busy it is."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any

from gpuslice.isotime import iso

from ..ledger import Ledger
from ..serialize import gpu_fields
from ..snapshot import AllocationView, ClaimView, GPUView
from .accounting import reclaimed
from .fragmentation import free_milli
from .pool import Pool, read_pool, totals


def overview(
    ledger: Ledger, now: datetime, backend: str | None = None, simulated: bool = False
) -> dict[str, Any]:
    pool = read_pool(ledger, with_jobs=True)
    return {
        "generated_at": iso(now),
        "backend": backend,
        "simulated": simulated,
        "totals": totals(pool, now),
        "reclaimed_gpu_hours": reclaimed(ledger, now),
        "hosts": _hosts(pool),
    }


def _hosts(pool: Pool) -> list[dict[str, Any]]:
    held_cpu: dict[str, int] = defaultdict(int)
    held_memory: dict[str, int] = defaultdict(int)
    claims: dict[str, list[tuple[AllocationView, ClaimView]]] = defaultdict(list)
    for a in pool.active:
        held_cpu[a.host] += a.cpu_milli
        held_memory[a.host] += a.memory_mib
        for c in a.claims:
            claims[c.gpu_uuid].append((a, c))
    free = {g.uuid: g for h in pool.hosts for g in h.gpus}
    gpus_of: dict[str, list[GPUView]] = defaultdict(list)
    for g in sorted(pool.inventory.gpus, key=lambda g: g.index):
        gpus_of[g.host].append(g)
    out = []
    for h in sorted(pool.inventory.hosts, key=lambda h: h.name):
        gpus = gpus_of[h.name]
        out.append(
            {
                "name": h.name,
                "present": h.present,
                "cpu_milli": h.cpu_milli,
                "memory_mib": h.memory_mib,
                "cpu_milli_free": h.cpu_milli - held_cpu[h.name],
                "memory_mib_free": h.memory_mib - held_memory[h.name],
                "gpus": [_gpu(pool, g, claims[g.uuid], free.get(g.uuid)) for g in gpus],
            }
        )
    return out


def _gpu(
    pool: Pool, g: GPUView, held: list[tuple[AllocationView, ClaimView]], state: Any
) -> dict[str, Any]:
    if g.mig_instances:
        by_mig = {c.mig_uuid: a for a, c in held if c.mig_uuid}
        slices = [
            {
                "kind": "mig",
                "mig_uuid": m.uuid,
                "mig_profile": m.profile,
                "milli": m.milli,
                "memory_mib": m.memory_mib,
                "holder": _holder(pool, by_mig[m.uuid]) if m.uuid in by_mig else None,
            }
            for m in g.mig_instances
        ]
    else:
        slices = [
            {
                "kind": "share" if a.kind == "share" else "gpu",
                "mig_uuid": None,
                "mig_profile": None,
                "milli": c.milli,
                "memory_mib": c.memory_mib,
                "charged_milli": c.charged_milli,
                "charged_memory_mib": c.charged_memory_mib,
                "holder": _holder(pool, a),
            }
            for a, c in sorted(held, key=lambda ac: ac[0].id)
        ]
    return {
        **gpu_fields(g),
        "allocated_milli": sum(c.milli for _, c in held),
        # absent GPUs (and GPUs of absent hosts) have no placement state: nothing is free
        "free_milli": free_milli(state) if state is not None else 0,
        "fragmented_milli": pool.fragmented.get(g.uuid, 0),
        "slices": slices,
    }


def _holder(pool: Pool, a: AllocationView) -> dict[str, Any]:
    report = pool.reports.get(a.id)
    return {
        "allocation_id": a.id,
        "user": a.user,
        "server_name": a.server_name,
        "purpose": a.purpose,
        "job_id": pool.job_of.get(a.id),
        "profile": a.profile,
        "since": iso(a.created_at),
        # the latest report, however old: reported_at says how much to trust it
        "utilization": report.utilization if report else None,
        "memory_used_mib": report.memory_mib if report else None,
        "idle_seconds": report.idle_seconds if report else None,
        "reported_at": iso(report.reported_at) if report else None,
    }
