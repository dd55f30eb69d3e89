"""JSON shapes of ledger rows, as the REST API returns them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuslice.isotime import iso

from .db.models import EventRow


def gpu_fields(g: Any) -> dict[str, Any]:
    """What every GPU listing says about a GPU itself."""
    return {
        "uuid": g.uuid,
        "index": g.index,
        "model": g.model,
        "memory_mib": g.memory_mib,
        "mig_mode": g.mig_mode,
        "present": g.present,
        "drained": g.drained,
    }


def allocation_json(a: Any, gpus: Mapping[str, Any] | None = None) -> dict[str, Any]:
    gpus = gpus or {}
    assignments = []
    for c in a.claims:
        g = gpus.get(c.gpu_uuid)
        mig_profile = None
        if g is not None and c.mig_uuid:
            mig_profile = next((m.profile for m in g.mig_instances if m.uuid == c.mig_uuid), None)
        assignments.append(
            {
                "gpu_uuid": c.gpu_uuid,
                "gpu_index": g.index if g else None,
                "gpu_model": g.model if g else None,
                "milli": c.milli,
                "memory_mib": c.memory_mib,
                "mig_uuid": c.mig_uuid,
                "mig_profile": mig_profile,
                # an overcommitted share: what it takes of the GPU (null: milli and memory_mib)
                "charged_milli": c.charged_milli,
                "charged_memory_mib": c.charged_memory_mib,
            }
        )
    return {
        "id": a.id,
        "user": a.user,
        "server_name": a.server_name,
        "profile": a.profile,
        "kind": a.kind,
        "purpose": a.purpose,
        "priority": a.priority,
        "preemptible": a.preemptible,
        "host": a.host,
        "groups": list(a.groups or []),
        "charged_group": a.charged_group,
        "borrowed": a.borrowed,
        "gpu_milli": a.gpu_milli,
        "state": "active" if a.active else "released",
        "created_at": iso(a.created_at),
        "released_at": iso(a.released_at),
        "release_reason": a.release_reason,
        "assignments": assignments,
    }


def event_json(e: EventRow) -> dict[str, Any]:
    return {
        "id": e.id,
        "ts": iso(e.ts),
        "kind": e.kind,
        "user": e.user,
        "actor": e.actor,
        "allocation_id": e.allocation_id,
        "profile": e.profile,
        "reason": e.reason,
        "detail": e.detail or {},
    }


def inventory_json(
    hosts: Iterable[Any], gpus: Iterable[Any], holders: dict[str, list[dict[str, Any]]]
) -> dict[str, Any]:
    """Hosts and GPUs; ``holders`` maps a GPU or MIG uuid to its claims (names already
    hidden by the caller where the viewer may not see them)."""
    out = []
    for h in sorted(hosts, key=lambda h: h.name):
        host_gpus = []
        for g in sorted((g for g in gpus if g.host == h.name), key=lambda g: g.index):
            held = holders.get(g.uuid, [])
            entry: dict[str, Any] = {
                **gpu_fields(g),
                "allocated_milli": sum(x["milli"] for x in held),
                "mig_instances": [
                    {
                        "uuid": m.uuid,
                        "profile": m.profile,
                        "memory_mib": m.memory_mib,
                        "milli": m.milli,
                        "present": m.present,
                        "holders": holders.get(m.uuid, []),
                    }
                    for m in g.mig_instances
                ],
            }
            entry["holders"] = held
            host_gpus.append(entry)
        out.append(
            {
                "name": h.name,
                "cpu_milli": h.cpu_milli,
                "memory_mib": h.memory_mib,
                "present": h.present,
                "gpus": host_gpus,
            }
        )
    return {"hosts": out}
