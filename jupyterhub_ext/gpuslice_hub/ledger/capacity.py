"""What is free, said to people: exact counts per profile (cached per ledger state), the
spawn form's availability and quota standing, and the refusal that names what is free
instead."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..clusterview import build_hosts, count_fits
from ..errors import Refused
from ..placement import Request
from ..placement.state import ClusterState, from_hosts
from ..pools import Access
from ..profiles import Profile
from ..quotas import Charge
from ..snapshot import (
    InventoryView,
)
from .base import (
    EVENTS,
    Caller,
    LedgerBase,
    quota_usage,
)


class CapacityMixin(LedgerBase):
    def _no_capacity(
        self,
        inv: InventoryView,
        caller: Caller,
        profile: Profile,
        state: ClusterState | None,
        access: Access | None = None,
        alternatives: bool = True,
    ) -> Refused:
        """``alternatives``: name what else is free (for a person choosing in the spawn
        form; not for a queued job, which cannot change its profile: counted under the
        ledger lock, and a job's waiting reason naming them would change with every
        allocation, rewriting thousands of reasons a pass).

        A person reads the message: it names profiles as the spawn form does (their
        ``display_name``); the refusal's event records the profile's name for admins."""
        allowed = access.widest if access is not None else None
        total = self._totals(inv, allowed)[profile.name]
        others = []
        usable = None
        if alternatives and state is not None:
            usable = self._within(state, allowed, inv.generation, True)
        for other in self.profiles.values() if alternatives else ():
            if other.name == profile.name or not other.allowed_for(caller.groups):
                continue
            free = count_fits(other.request(), usable)
            if free:
                others.append(f"{other.display_name} has {free} free")
        why = self._none_free(profile, total, inv, allowed)
        if total:  # "all in use (...)": said as "No X free (...)"
            message = f"No {profile.display_name} free {why.removeprefix('all in use ')}"
        else:
            message = f"No {profile.display_name} can be placed: {why}"
        if others:
            message += "; " + ", ".join(others)
        if access is not None and access.batch and state is not None:
            message += self._reserved_elsewhere(profile, state, access, inv.generation)
        return Refused("no_capacity", message, alternatives=others)

    def _reserved_elsewhere(
        self, profile: Profile, state: ClusterState, access: Access, generation: int
    ) -> str:
        """What batch work kept out of reserved pools would find there, and who they are
        for: the real reason a job waits beside idle GPUs. (Not said to people: a server
        is refused only where its own pools are full.)"""
        pools = self.pools
        assert pools is not None
        others = frozenset(pools.reserved) - access.widest
        if not others:
            return ""
        free = count_fits(profile.request(), pools.restrict(state, others, generation, keep=True))
        if not free:
            return ""
        names = ", ".join(sorted(others))
        if access.high:
            return f" ({free} more free in reserved pool(s) {names}, which serve other groups)"
        when = (
            f"preemptible jobs borrow them {pools.borrow_window.describe()}"
            if pools.borrow_window is not None
            else "batch jobs never borrow them"
        )
        return f" ({free} more free in reserved pool(s) {names}, kept for interactive use; {when})"

    def profile_capacity(self, allowed: frozenset[str] | None = None) -> dict[str, tuple[int, int]]:
        """Per profile: (slices that could still be placed now, slices on an empty cluster),
        in the ``allowed`` pools (None: the whole cluster)."""
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
            return self._capacity(s, inv, allowed)

    def never_placed(self) -> list[str]:
        """The profiles no GPU of the inventory could hold even empty and undrained (a
        model, MIG instance or GPU count it does not have): a setting that does nothing,
        until the inventory changes."""
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
        totals = self._totals(inv, None, ignore_drain=True)
        return sorted(name for name, total in totals.items() if total == 0)

    def _capacity(
        self, s: Session, inv: InventoryView, allowed: frozenset[str] | None = None
    ) -> dict[str, tuple[int, int]]:
        """``profile_capacity`` within ``s``, computed once per change of the ledger.

        Every write that changes what is free (allocate, release, drain, inventory) records
        an event under the ledger lock, so the newest event id and the generation together
        mark a state; they are read before the allocations, so a write landing in between
        can only make the cache look older than it is, never newer.
        """
        marker = (inv.generation, s.connection().execute(select(func.max(EVENTS.c.id))).scalar())
        cached = self._capacity_cache
        if cached is None or cached[0] != marker:
            cached = self._capacity_cache = (marker, {})
        capacity = cached[1].get(allowed)
        if capacity is not None:
            return capacity
        totals = self._totals(inv, allowed)
        with self.cluster_cache.use(inv, self.active_cache.state(s)) as state:
            usable = None if state is None else self._within(state, allowed, inv.generation, True)
            capacity = {
                name: (count_fits(p.request(), usable), totals[name])
                for name, p in self.profiles.items()
            }
        cached[1][allowed] = capacity
        return capacity

    def _totals(
        self, inv: InventoryView, allowed: frozenset[str] | None = None, ignore_drain: bool = False
    ) -> dict[str, int]:
        """How many of each profile an empty cluster (its ``allowed`` pools) holds: changes
        with the inventory only. ``ignore_drain``: with the drained GPUs back in service
        (the difference is what a drain takes away)."""
        cached = self._totals_cache
        if cached is None or cached[0] != inv.generation:
            cached = self._totals_cache = (inv.generation, {})
        totals = cached[1].get((allowed, ignore_drain))
        if totals is None:
            totals = self._count_empty(inv, ignore_drain, allowed)
            cached[1][(allowed, ignore_drain)] = totals
        return totals

    def _count_empty(
        self, inv: InventoryView, ignore_drain: bool, allowed: frozenset[str] | None
    ) -> dict[str, int]:
        empty = self._empty(inv, ignore_drain, allowed)
        return {name: count_fits(p.request(), empty) for name, p in self.profiles.items()}

    def _empty(
        self, inv: InventoryView, ignore_drain: bool, allowed: frozenset[str] | None
    ) -> ClusterState | None:
        """The ``allowed`` pools with nothing held (kept per inventory generation)."""
        key = (inv.generation, ignore_drain, allowed)
        cached = self._empty_cache.get(key)
        if cached is None:
            if len(self._empty_cache) > 64:
                self._empty_cache.clear()
            hosts = build_hosts(inv.hosts, inv.gpus, [], ignore_drain=ignore_drain)
            empty = from_hosts(hosts) if hosts else None
            if empty is not None:
                empty = self._within(empty, allowed, None)
            cached = self._empty_cache[key] = (empty,)
        return cached[0]

    def _charged_requests(self, s: Session, user: str) -> dict[str, Request]:
        """The share profiles a server of ``user`` is charged less than in full for
        (overcommit.py), as placed."""
        charged = {}
        for p in self.profiles.values():
            request = self.overcommit.request_for(s, user, p, "interactive")
            if request != p.request():
                charged[p.name] = request
        return charged

    def _charged_capacity(
        self,
        s: Session,
        inv: InventoryView,
        charged: dict[str, Request],
        allowed: frozenset[str] | None,
    ) -> dict[str, tuple[int, int]]:
        """(free, total) of ``charged`` requests: what fits for their user, not for a
        holder charged in full."""
        if not charged:
            return {}
        empty = self._empty(inv, False, allowed)
        with self.cluster_cache.use(inv, self.active_cache.state(s)) as state:
            usable = None if state is None else self._within(state, allowed, inv.generation, True)
            return {
                name: (count_fits(r, usable), count_fits(r, empty)) for name, r in charged.items()
            }

    def availability(
        self,
        user: str,
        groups: Iterable[str],
        overcommit: bool = True,
        wait_seconds: float | None = None,
    ) -> list[dict[str, Any]]:
        """Every profile with free / total and, when it can't be had now, why not: for a
        server of this user, so in the pools a server of theirs may use (``overcommit``:
        as its allocations would be charged; False: in full, as a spawner that asks for
        them so is given them). A profile none of which is free is available when a spawn
        would take a preemptible batch job's slice (``spawn_preemption``, within
        ``wait_seconds``, the spawner's wait): ``from_batch``. With reserved
        pools, ``reserved_free`` says how many of the free ones are reserved for people, and
        ``batch_free`` / ``batch_total`` what a batch job may take at any hour (the peak
        pool: the submit dialog's figures)."""
        groups = tuple(groups)
        access = self.access("interactive", groups)
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
            widest = access.widest if access else None
            capacity = self._capacity(s, inv, widest)
            reserved = batch = None
            if access is not None and len(access.tries) > 1:
                reserved = self._capacity(s, inv, access.tries[0])
            batch_access = self.access("batch", groups)
            if batch_access is not None:
                # what a batch job (other than high) may take at any hour: the peak pool
                batch = self._capacity(s, inv, batch_access.widest)
            held = self.active_cache.held(s)
            charged: dict[str, Request] = {}
            if self.overcommit.settings.on and overcommit:
                # the counts for this user, charged from their history
                charged = self._charged_requests(s, user)
                capacity = {**capacity, **self._charged_capacity(s, inv, charged, widest)}
            # what a spawn that finds none free gets by preemption (after_refusal), asked
            # once for every such profile
            full = [
                p
                for p in self.profiles.values()
                if capacity[p.name][0] == 0 and p.allowed_for(groups) and p.preempt_batch
            ]
            by_preemption: dict[str, float | str | None] = {}
            if full and self.spawn_preemption is not None:
                caller = Caller(user, groups, user)
                by_preemption = self.spawn_preemption(caller, full, overcommit, wait_seconds)
            out = []
            for p in self.profiles.values():
                entry = p.to_json()
                free, total = capacity[p.name]
                reason = None
                allowed = p.allowed_for(groups)
                preempted = by_preemption.get(p.name)
                from_batch = isinstance(preempted, float)
                if not allowed:
                    reason = "not allowed for your groups"
                elif free == 0 and isinstance(preempted, str):
                    reason = preempted
                elif free == 0 and not from_batch:
                    reason = self._none_free(p, total, inv, widest, charged.get(p.name))
                else:
                    want = quota_usage(p, inv)
                    charge = self.effective_quotas(s).check(user, groups, want, held)
                    if not isinstance(charge, Charge):
                        reason = charge
                entry.update(
                    free=free, total=total, allowed=allowed, available=reason is None, reason=reason
                )
                if from_batch and reason is None:
                    # a spawn takes a batch job's slice, waiting up to this for it
                    entry["from_batch"] = True
                    entry["from_batch_seconds"] = preempted
                away = self._out_of_service(inv, widest, p.name, total)
                if away:
                    # counted out of free and total, and said why (a drain, Slurm's word)
                    entry["out_of_service"] = away
                if reserved is not None:
                    entry["reserved_free"] = reserved[p.name][0]
                if batch is not None:
                    entry["batch_free"], entry["batch_total"] = batch[p.name]
                out.append(entry)
            return out

    def _out_of_service(
        self, inv: InventoryView, allowed: frozenset[str] | None, name: str, total: int
    ) -> str:
        """How many more of profile ``name`` there would be but for drained GPUs and nodes
        the engine takes no new work on, and why ("": none)."""
        more = self._totals(inv, allowed, ignore_drain=True)[name] - total
        return f"{more} more {_out_words(inv)}" if more > 0 else ""

    def quota_standing(self, user: str, groups: Iterable[str]) -> list[dict[str, Any]]:
        """The quotas that limit *user* and what is held against each (see Quotas.standing)."""
        with self.db.reading() as s:
            return self.effective_quotas(s).standing(user, tuple(groups), self.active_cache.held(s))

    def _none_free(
        self,
        p: Profile,
        total: int,
        inv: InventoryView,
        allowed: frozenset[str] | None,
        charged: Request | None = None,
    ) -> str:
        """Why none of ``p`` is free, saying so when a drain is (part of) the reason.
        ``charged``: the request as placed for this user, when overcommit charges it less
        (``total`` then counts those)."""
        if charged is None:
            drained = self._totals(inv, allowed, ignore_drain=True)[p.name] - total
        else:
            drained = count_fits(charged, self._empty(inv, True, allowed)) - total
        if total == 0:
            if drained > 0:
                return f"every GPU that offers it is {_out_words(inv, every=True)}"
            return f"no host has {p.summary()}"
        more = f"; {drained} more {_out_words(inv)}" if drained > 0 else ""
        if self.overcommit.settings.on and p.kind == "share" and p.gpu_memory_mib > 0:
            # the count is of shares charged in full: holders charged less hold more
            more += ", and more held through overcommit"
        return f"all in use ({total} of {total} in use{more})"


def _out_words(inv: InventoryView, every: bool = False) -> str:
    """Where the capacity that is not offered is: "on GPUs drained for maintenance" (an
    admin's drain in gpuslice) and/or "on nodes that take no new work now (gsn1: drained
    in Slurm: disk swap)" (the engine's word, mirrored by slurmsync.py). ``every``: said
    of every GPU that offers a profile ("drained for maintenance or on nodes ...")."""
    admin = any(g.drained for g in inv.gpus if g.present)
    nodes = [f"{h.name}: {h.engine_out}" for h in inv.hosts if h.present and h.engine_out]
    parts = []
    if admin or not nodes:
        parts.append("drained for maintenance" if every else "on GPUs drained for maintenance")
    if nodes:
        where = "on a node" if every else "on nodes"
        parts.append(
            f"{where} that take{'s' if every else ''} no new work now ({'; '.join(nodes)})"
        )
    return " or ".join(parts)
