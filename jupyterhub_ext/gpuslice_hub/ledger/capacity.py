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
from ..placement.state import ClusterState
from ..profiles import Profile
from ..quotas import Charge
from ..snapshot import (
    InventoryView,
)
from .base import (
    EVENTS,
    Caller,
    LedgerBase,
    holdings_of,
    quota_usage,
)


class CapacityMixin(LedgerBase):
    def _no_capacity(
        self, inv: InventoryView, caller: Caller, profile: Profile, state: ClusterState | None
    ) -> Refused:
        total = self._totals(inv)[profile.name]
        others = []
        for other in self.profiles.values():
            if other.name == profile.name or not other.allowed_for(caller.groups):
                continue
            free = count_fits(other.request(), state)
            if free:
                others.append(f"{other.name} has {free} free")
        why = self._none_free(profile, total, inv)
        if total:  # "all in use (...)": said as "No X free (...)"
            message = f"No {profile.name} free {why.removeprefix('all in use ')}"
        else:
            message = f"No {profile.name} can be placed: {why}"
        if others:
            message += "; " + ", ".join(others)
        return Refused("no_capacity", message, alternatives=others)

    def profile_capacity(self) -> dict[str, tuple[int, int]]:
        """Per profile: (slices that could still be placed now, slices on an empty cluster)."""
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
            return self._capacity(s, inv)

    def _capacity(self, s: Session, inv: InventoryView) -> dict[str, tuple[int, int]]:
        """``profile_capacity`` within ``s``, computed once per change of the ledger.

        Every write that changes what is free (allocate, release, drain, inventory) records
        an event under the ledger lock, so the newest event id and the generation together
        mark a state; they are read before the allocations, so a write landing in between
        can only make the cache look older than it is, never newer.
        """
        marker = (inv.generation, s.connection().execute(select(func.max(EVENTS.c.id))).scalar())
        cached = self._capacity_cache
        if cached is not None and cached[0] == marker:
            return cached[1]
        totals = self._totals(inv)
        with self.cluster_cache.use(inv, self.active_cache.get(s)) as state:
            capacity = {
                name: (count_fits(p.request(), state), totals[name])
                for name, p in self.profiles.items()
            }
        self._capacity_cache = (marker, capacity)
        return capacity

    def _totals(self, inv: InventoryView) -> dict[str, int]:
        """How many of each profile an empty cluster holds: changes with the inventory only."""
        cached = self._totals_cache
        if cached is None or cached[0] != inv.generation:
            cached = (inv.generation, self._count_empty(inv, ignore_drain=False))
            self._totals_cache = cached
        return cached[1]

    def _undrained_totals(self, inv: InventoryView) -> dict[str, int]:
        """``_totals`` with the drained GPUs back in service: what a drain takes away."""
        cached = self._undrained_cache
        if cached is None or cached[0] != inv.generation:
            cached = (inv.generation, self._count_empty(inv, ignore_drain=True))
            self._undrained_cache = cached
        return cached[1]

    def _count_empty(self, inv: InventoryView, ignore_drain: bool) -> dict[str, int]:
        empty = build_hosts(inv.hosts, inv.gpus, [], ignore_drain=ignore_drain)
        return {name: count_fits(p.request(), empty) for name, p in self.profiles.items()}

    def availability(self, user: str, groups: Iterable[str]) -> list[dict[str, Any]]:
        """Every profile with free / total and, when it can't be had now, why not."""
        groups = tuple(groups)
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
            capacity = self._capacity(s, inv)
            holdings = holdings_of(self.active_cache.get(s))
            out = []
            for p in self.profiles.values():
                entry = p.to_json()
                free, total = capacity[p.name]
                reason = None
                allowed = p.allowed_for(groups)
                if not allowed:
                    reason = "not allowed for your groups"
                elif free == 0:
                    reason = self._none_free(p, total, inv)
                else:
                    want = quota_usage(p, inv)
                    charge = self.effective_quotas(s).check(user, groups, want, holdings)
                    if not isinstance(charge, Charge):
                        reason = charge
                entry.update(
                    free=free, total=total, allowed=allowed, available=reason is None, reason=reason
                )
                out.append(entry)
            return out

    def quota_standing(self, user: str, groups: Iterable[str]) -> list[dict[str, Any]]:
        """The quotas that limit *user* and what is held against each (see Quotas.standing)."""
        with self.db.reading() as s:
            holdings = holdings_of(self.active_cache.get(s))
            return self.effective_quotas(s).standing(user, tuple(groups), holdings)

    def _none_free(self, p: Profile, total: int, inv: InventoryView) -> str:
        """Why none of ``p`` is free, saying so when a drain is (part of) the reason."""
        drained = self._undrained_totals(inv)[p.name] - total
        if total == 0:
            if drained > 0:
                return "every GPU that offers it is drained for maintenance"
            return f"no host has {p.summary()}"
        more = f"; {drained} more on GPUs drained for maintenance" if drained > 0 else ""
        return f"all in use ({total} of {total} in use{more})"
