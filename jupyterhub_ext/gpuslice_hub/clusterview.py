"""The placement view of the ledger: free capacity per host, built from ledger views
(``snapshot.py``) or ORM rows, which share attribute names."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .db.loopguard import hold, not_on_loop
from .placement import GPUState, HostState, MigSlotState, Placement, Request
from .placement.fit import fit_counts
from .placement.state import ClusterState, fill_row, from_hosts
from .snapshot import ActiveCache, ActiveState, InventoryView, taken


def build_hosts(
    hosts: Iterable[Any],
    gpus: Iterable[Any],
    active: Iterable[Any],
    ignore_drain: bool = False,
) -> list[HostState]:
    """Free capacity per present host, after subtracting every active allocation.
    ``ignore_drain``: count drained GPUs as if in service (what a drain takes away). The
    GPUs of a host its engine runs no new work on (``engine_out``: Slurm drained it, or
    it is in a reservation) count as drained: the engine would not run a grant there."""
    layout = _Layout(hosts, gpus)
    by_host: dict[str, list[Any]] = defaultdict(list)
    for a in active:
        by_host[a.host].append(a)
    return [layout.host_state(name, by_host.get(name, ()), ignore_drain) for name in layout.names]


class _Layout:
    """The present hosts of an inventory, in rank order, with their present GPUs."""

    def __init__(self, hosts: Iterable[Any], gpus: Iterable[Any]) -> None:
        present = sorted((h for h in hosts if h.present), key=lambda h: h.name)
        self.names = [h.name for h in present]
        self.hosts = {h.name: h for h in present}
        self.rank = {name: r for r, name in enumerate(self.names)}
        self.gpus: dict[str, list[Any]] = {name: [] for name in self.names}
        for g in sorted(gpus, key=lambda g: (g.host, g.index)):
            if g.present and g.host in self.gpus:
                self.gpus[g.host].append(g)

    def host_state(self, name: str, active: Iterable[Any], ignore_drain: bool) -> HostState:
        """Host ``name``'s free capacity after its ``active`` allocations."""
        h = self.hosts[name]
        state = HostState(h.name, h.cpu_milli, h.memory_mib, [], self.rank[name])
        by_uuid: dict[str, GPUState] = {}
        for g in self.gpus[name]:
            slots = [
                MigSlotState(m.uuid, m.profile, m.memory_mib, m.milli)
                for m in g.mig_instances
                if m.present
            ]
            out = getattr(h, "engine_out", None)  # (ORM rows and views alike)
            drained = (g.drained or bool(out)) and not ignore_drain
            gpu = GPUState(g.uuid, g.model, g.memory_mib, mig=slots, drained=drained)
            state.gpus.append(gpu)
            by_uuid[g.uuid] = gpu
        for a in active:
            state.cpu_milli_free -= a.cpu_milli
            state.memory_mib_free -= a.memory_mib
            for c in a.claims:
                held = by_uuid.get(c.gpu_uuid) if c.active else None
                if held is not None:
                    _take(held, c.mig_uuid, *taken(c))
        return state


class ClusterCache:
    """The placement arrays of the ledger, kept from one decision to the next.

    Building every host's free capacity and the arrays for each spawn cost time in
    proportion to the whole cluster and every held slice. This keeps the last
    ``ClusterState`` and, when allocations changed since, rebuilds only the rows of the
    hosts they sit on and bumps those rows' versions, so a policy's per-host scores (FGD)
    are recomputed for those hosts only. Allocation views are never modified (a change is
    a new view), so comparing identities finds what changed. A change of inventory
    generation rebuilds everything.

    ``use`` holds a lock while the caller decides: the arrays are the cache's own, and a
    decision must not see them rewritten halfway.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation: int | None = None
        self._layout: _Layout | None = None
        self._state: ClusterState | None = None
        self._views: dict[int, Any] = {}
        # the state the arrays were last brought to (its cache and mark), to ask the cache
        # which allocations changed since rather than compare every view
        self._seen: tuple[ActiveCache, tuple[int, int]] | None = None
        self._by_host: dict[str, dict[int, Any]] = {}
        self.rows_rebuilt = 0  # for tests and benchmarks
        self.views_compared = 0  # ... and how many views were compared to find changes

    @contextmanager
    def use(self, inv: InventoryView, active: ActiveState) -> Iterator[ClusterState | None]:
        """The arrays for ``inv`` with ``active`` subtracted; None when no host is present."""
        with hold(self._lock):
            yield self._bring_up_to_date(inv, active)

    def _bring_up_to_date(self, inv: InventoryView, active: ActiveState) -> ClusterState | None:
        views = active.views
        seen = self._seen
        rebuild = self._state is None or inv.generation != self._generation
        ids = None
        if not rebuild and seen is not None and seen[0] is active.source:
            ids = active.source.changed_between(seen[1], active.mark)
        if rebuild or ids is None or len(ids) > ActiveCache.LOOP_FOLLOWS:
            # (before anything changes or is learned: a short write that gives way leaves
            # all as it was; many changes, as after a burst of releases in threads, mean
            # many rows to rebuild and to score again)
            not_on_loop("building the placement arrays, or following many changes")
        self._seen = None  # (set again once the arrays follow ``active``)
        if rebuild:
            self._state = None  # a failure below leaves nothing half-built behind
            layout = _Layout(inv.hosts, inv.gpus)
            by_host: dict[str, dict[int, Any]] = {name: {} for name in layout.names}
            for a in views.values():
                if a.host in by_host:
                    by_host[a.host][a.id] = a
            hosts = [layout.host_state(n, by_host[n].values(), False) for n in layout.names]
            self._layout, self._by_host, self._views = layout, by_host, views
            self._state = from_hosts(hosts) if hosts else None
            self._generation = inv.generation
            self.rows_rebuilt += len(hosts)
            self._seen = (active.source, active.mark)
            return self._state
        try:
            state = self._follow(views, ids)
        except BaseException:
            # the views were followed only part of the way: rebuild everything next time
            # rather than place on rows that miss a change
            self._state = None
            raise
        self._seen = (active.source, active.mark)
        return state

    def _follow(self, views: dict[int, Any], ids: set[int] | None) -> ClusterState:
        """Rebuild the rows of the hosts whose allocations changed since the last look:
        those of ``ids``, or (None: not known) of every view that is not the one seen."""
        changed: set[str] = set()
        old = self._views
        if ids is None:
            ids = {i for i, view in views.items() if old.get(i) is not view}
            ids.update(old.keys() - views.keys())
            self.views_compared += len(views)
        for alloc_id in ids:
            was, view = old.get(alloc_id), views.get(alloc_id)
            if was is view:
                continue
            if was is not None:
                changed.add(was.host)
                self._by_host.get(was.host, {}).pop(alloc_id, None)
            if view is not None:
                changed.add(view.host)
                if view.host in self._by_host:
                    self._by_host[view.host][alloc_id] = view
        self._views = views
        kept, state = self._layout, self._state
        assert kept is not None and state is not None
        for name in changed:
            r = kept.rank.get(name)
            if r is None:  # a host that left the inventory: its holders hold nothing here
                continue
            fill_row(state, r, kept.host_state(name, self._by_host[name].values(), False))
            state.version[r] += 1
            self.rows_rebuilt += 1
        return state


def apply(hosts: Sequence[HostState], request: Request, placement: Placement) -> None:
    """Subtract a placement from ``hosts`` in place (used to count how many more fit)."""
    host = next(h for h in hosts if h.name == placement.host)
    host.cpu_milli_free -= request.cpu_milli
    host.memory_mib_free -= request.memory_mib
    gpus = {g.uuid: g for g in host.gpus}
    for a in placement.assignments:
        _take(gpus[a.gpu_uuid], a.mig_uuid, a.milli, a.memory_mib)


def _take(gpu: GPUState, mig_uuid: str | None, milli: int, memory_mib: int) -> None:
    """Mark what one claim holds of ``gpu`` as used: its MIG instance, or its share."""
    if mig_uuid:
        for slot in gpu.mig:
            if slot.uuid == mig_uuid:
                slot.free = False
    else:
        gpu.free_milli -= milli
        gpu.free_memory_mib -= memory_mib


def count_fits(request: Request, hosts: Sequence[HostState] | ClusterState | None) -> int:
    """How many more of ``request`` could be placed, one after another: exact at any size
    (see :func:`~.placement.fit.fit_counts`)."""
    if not hosts:
        return 0
    state = hosts if isinstance(hosts, ClusterState) else from_hosts(hosts)
    return int(fit_counts(state, request).sum())
