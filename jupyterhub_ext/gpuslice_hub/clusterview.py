"""The placement view of the ledger: free capacity per host, built from ledger views
(``snapshot.py``) or ORM rows, which share attribute names."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .placement import GPUState, HostState, MigSlotState, Placement, Request
from .placement.fit import fit_counts
from .placement.state import from_hosts


def build_hosts(
    hosts: Iterable[Any],
    gpus: Iterable[Any],
    active: Iterable[Any],
    ignore_drain: bool = False,
) -> list[HostState]:
    """Free capacity per present host, after subtracting every active allocation.
    ``ignore_drain``: count drained GPUs as if in service (what a drain takes away)."""
    states: dict[str, HostState] = {}
    for rank, h in enumerate(sorted((h for h in hosts if h.present), key=lambda h: h.name)):
        states[h.name] = HostState(h.name, h.cpu_milli, h.memory_mib, [], rank)
    by_uuid: dict[str, GPUState] = {}
    for g in sorted(gpus, key=lambda g: (g.host, g.index)):
        if not g.present or g.host not in states:
            continue
        slots = [
            MigSlotState(m.uuid, m.profile, m.memory_mib, m.milli)
            for m in g.mig_instances
            if m.present
        ]
        drained = g.drained and not ignore_drain
        state = GPUState(g.uuid, g.model, g.memory_mib, mig=slots, drained=drained)
        states[g.host].gpus.append(state)
        by_uuid[g.uuid] = state
    for a in active:
        host = states.get(a.host)
        if host is not None:
            host.cpu_milli_free -= a.cpu_milli
            host.memory_mib_free -= a.memory_mib
        for c in a.claims:
            if not c.active or c.gpu_uuid not in by_uuid:
                continue
            gpu = by_uuid[c.gpu_uuid]
            if c.mig_uuid:
                for slot in gpu.mig:
                    if slot.uuid == c.mig_uuid:
                        slot.free = False
            else:
                gpu.free_milli -= c.milli
                gpu.free_memory_mib -= c.memory_mib
    return list(states.values())


def apply(hosts: Sequence[HostState], request: Request, placement: Placement) -> None:
    """Subtract a placement from ``hosts`` in place (used to count how many more fit)."""
    host = next(h for h in hosts if h.name == placement.host)
    host.cpu_milli_free -= request.cpu_milli
    host.memory_mib_free -= request.memory_mib
    gpus = {g.uuid: g for g in host.gpus}
    for a in placement.assignments:
        gpu = gpus[a.gpu_uuid]
        if a.mig_uuid:
            for slot in gpu.mig:
                if slot.uuid == a.mig_uuid:
                    slot.free = False
        else:
            gpu.free_milli -= a.milli
            gpu.free_memory_mib -= a.memory_mib


def count_fits(request: Request, hosts: Sequence[HostState]) -> int:
    """How many more of ``request`` could be placed, one after another: exact at any size
    (see :func:`~.placement.fit.fit_counts`)."""
    if not hosts:
        return 0
    return int(fit_counts(from_hosts(hosts), request).sum())
