"""The split pools at one instant: each pool's GPUs and who holds them (people, batch work
the pool serves, batch work that only borrows it), for the admin panel, its API and
``/metrics``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..ledger import Ledger
from ..pools import PEAK, Pools
from ..snapshot import taken

USES = ("interactive", "batch", "borrowed", "external")


def pool_standing(ledger: Ledger, now: datetime) -> dict[str, Any]:
    """``{"pools": [...], "borrowing": window or None}``; no pools: an empty list."""
    pools = ledger.pools
    if pools is None:
        return {"pools": [], "borrowing": None}
    hosts, gpus, active = ledger.snapshot()
    present_hosts = {h.name for h in hosts if h.present}
    figures: dict[str, dict[str, Any]] = {
        name: _empty(name, pools) for name in [*pools.reserved, PEAK]
    }
    pool_of_gpu: dict[str, str] = {}
    drained: set[str] = set()
    for g in gpus:
        if not g.present or g.host not in present_hosts:
            continue
        name = pool_of_gpu[g.uuid] = pools.pool_of(g.host, g.uuid)
        entry = figures[name]
        entry["gpus"] += 1
        entry["capacity_milli"] += 1000
        if g.drained:
            entry["drained_gpus"] += 1
            drained.add(g.uuid)
        else:
            entry["in_service_milli"] += 1000
            entry["free_milli"] += 1000
    for a in active:
        for c in a.claims:
            where = pool_of_gpu.get(c.gpu_uuid)
            if where is None or not c.active:
                continue
            use = _use(pools, a.purpose, a.groups, a.priority, where)
            # what the claim takes of the GPU (an overcommitted share less than it promises),
            # so that held and free add up to the pool's capacity
            milli = taken(c)[0]
            figures[where][f"{use}_milli"] += milli
            if c.gpu_uuid not in drained:
                # (a drained GPU's holders keep it, but it offers nothing more)
                figures[where]["free_milli"] -= milli
    window = pools.borrow_window
    return {
        "pools": list(figures.values()),
        "borrowing": window.standing(now) if window is not None else None,
    }


def _use(pools: Pools, purpose: str, groups: list[str], priority: int, pool: str) -> str:
    if purpose in ("interactive", "external"):
        return purpose
    return "borrowed" if pools.borrowed(groups, priority, {pool}) else "batch"


def _empty(name: str, pools: Pools) -> dict[str, Any]:
    spec = pools.reserved.get(name)
    entry: dict[str, Any] = {
        "name": name,
        "reserved": spec is not None,
        "hosts": list(spec.hosts) if spec else [],
        "listed_gpus": sorted(spec.gpus) if spec else [],
        "groups": sorted(spec.groups) if spec else [],
        "gpus": 0,
        "drained_gpus": 0,
        # every present GPU's, as the pool figures of the admin panel count capacity
        "capacity_milli": 0,
        "in_service_milli": 0,
        "free_milli": 0,
    }
    entry.update({f"{use}_milli": 0 for use in USES})
    return entry
