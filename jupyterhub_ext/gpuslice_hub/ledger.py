"""The allocation ledger: the only code that writes allocations.

Every write happens inside ``Database.writing()``, which holds the ledger lock for the whole
read-place-write sequence, so two requests can never both see the same free slice. The
partial unique indexes on claims and servers are a second, independent guard.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Table, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpuslice.model import Inventory

from .clusterview import ClusterCache, build_hosts, count_fits
from .db.admin_models import QuotaOverrideRow, UsageReportRow
from .db.engine import Database
from .db.models import (
    AllocationRow,
    ClaimRow,
    EventRow,
    GPURow,
    HostRow,
    MigRow,
    utcnow,
)
from .errors import Pending, Refused
from .overrides import apply_overrides
from .placement import Placement, Refusal, place_in
from .placement.engine import Policy
from .placement.state import ClusterState
from .profiles import Profile
from .quotas import Charge, Holding, Quotas, Usage
from .serialize import allocation_json, event_json
from .snapshot import (
    ActiveCache,
    AllocationView,
    ClaimView,
    GPUView,
    HostView,
    InventoryCache,
    InventoryView,
    bump_generation,
    load_active,
    load_allocation,
)

log = logging.getLogger("gpuslice.ledger")

ALLOCATIONS = cast(Table, AllocationRow.__table__)
CLAIMS = cast(Table, ClaimRow.__table__)
EVENTS = cast(Table, EventRow.__table__)

PURPOSES = ("interactive", "batch")
# Events of a stop the service asked for, and how a release that follows one reads.
RECLAIM_KINDS = {
    "idle-culled": "idle-culled",
    "release-requested": "released by its owner",
    "reclaim-silent": "reclaimed: its server stopped reporting",
}
REFUSALS = ("forbidden_profile", "over_quota", "no_capacity")


@dataclass(frozen=True)
class Caller:
    """Who asks: the user the allocation is for, and who actually sent the request."""

    user: str
    groups: tuple[str, ...]
    actor: str


class Ledger:
    def __init__(
        self,
        db: Database,
        profiles: dict[str, Profile],
        quotas: Quotas,
        policy: Policy,
        on_refusal: Callable[[str, str], None] | None = None,
    ) -> None:
        self.db = db
        self.profiles = profiles
        self.quotas = quotas
        self.policy = policy
        self.on_refusal = on_refusal or (lambda profile, code: None)
        # Set by the job manager: (caller, profile, server_name, wait_seconds) -> {"job_id",
        # "retry_after", "message"} when it starts preempting a batch job for this spawn; a
        # str when one could be preempted but not within the spawn's wait (why not); None.
        self.preempt_hook: Callable[
            [Caller, Profile, str, float | None], dict[str, Any] | str | None
        ] = lambda caller, profile, server_name, wait_seconds: None
        self.inventory_cache = InventoryCache()
        self.active_cache = ActiveCache()
        self.cluster_cache = ClusterCache()
        # A learning policy's state is shared by the event loop and the scheduler's thread.
        self._policy_lock = threading.Lock()
        # Held while history is pruned and while the pruned totals are read with the
        # events left (admin/history.py): the two are then one consistent state.
        self.history_lock = threading.Lock()
        self._quota_cache: tuple[int, Quotas] | None = None
        self._capacity_cache: tuple[tuple[int, Any], dict[str, tuple[int, int]]] | None = None
        self._totals_cache: tuple[int, dict[str, int]] | None = None
        self._undrained_cache: tuple[int, dict[str, int]] | None = None

    # -- inventory ---------------------------------------------------------------------

    def sync_inventory(self, inventory: Inventory) -> None:
        """Upsert what discovery found; mark what vanished as absent (holders keep it)."""
        with self.db.writing() as s:
            seen_hosts, seen_gpus, seen_mig = set(), set(), set()
            for h in inventory.hosts:
                seen_hosts.add(h.name)
                s.merge(
                    HostRow(
                        name=h.name, cpu_milli=h.cpu_milli, memory_mib=h.memory_mib, present=True
                    )
                )
                for g in h.gpus:
                    seen_gpus.add(g.uuid)
                    row = s.get(GPURow, g.uuid)
                    drained = row.drained if row is not None else False
                    s.merge(
                        GPURow(
                            uuid=g.uuid,
                            host=h.name,
                            index=g.index,
                            model=g.model,
                            memory_mib=g.memory_mib,
                            mig_mode=g.mig_mode.value,
                            present=True,
                            drained=drained,
                        )
                    )
                    for m in g.mig_instances:
                        seen_mig.add(m.uuid)
                        s.merge(
                            MigRow(
                                uuid=m.uuid,
                                gpu_uuid=g.uuid,
                                profile=m.profile,
                                memory_mib=m.memory_mib,
                                milli=m.milli,
                                present=True,
                            )
                        )
            s.flush()
            for hrow in s.scalars(select(HostRow)):
                hrow.present = hrow.name in seen_hosts
            for grow in s.scalars(select(GPURow)):
                grow.present = grow.uuid in seen_gpus
            for mrow in s.scalars(select(MigRow)):
                mrow.present = mrow.uuid in seen_mig
            bump_generation(s)
            self._event(
                s,
                "inventory",
                None,
                "service",
                reason=f"{inventory.backend}: {len(seen_hosts)} hosts, {len(seen_gpus)} GPUs, "
                f"{len(seen_mig)} MIG instances",
                detail={"backend": inventory.backend, "simulated": inventory.simulated},
            )

    def set_drained(self, gpu_uuid: str, drained: bool, actor: str, reason: str) -> dict[str, Any]:
        with self.db.writing() as s:
            row = s.get(GPURow, gpu_uuid)
            if row is None:
                raise Refused("not_found", f"no GPU {gpu_uuid!r} in the inventory")
            changed = row.drained != drained
            row.drained = drained
            if changed:
                bump_generation(s)
                kind = "gpu-drained" if drained else "gpu-undrained"
                detail = {"gpu": gpu_uuid, "host": row.host, "index": row.index}
                self._event(s, kind, None, actor, None, None, reason or None, detail)
            return {"uuid": gpu_uuid, "drained": drained, "changed": changed}

    # -- allocation --------------------------------------------------------------------

    def allocate(
        self,
        caller: Caller,
        profile_name: str,
        server_name: str = "",
        purpose: str = "interactive",
        priority: int = 0,
        preemptible: bool = False,
        quiet: bool = False,
        wait_seconds: float | None = None,
        learn: bool = True,
    ) -> tuple[dict[str, Any], bool]:
        """Allocate a slice; returns (allocation, created). Raises Refused, or Pending (below).

        Idempotent per server: asking again for the same server and profile returns the
        allocation it already holds (a retried spawn must not hold two slices).
        ``quiet``: do not record refusals (the job scheduler retries every pass).
        ``learn``: a placement policy that learns the request mix counts this request (the
        scheduler's retries of one job are one request: it passes False after the first).
        An interactive spawn that finds no capacity, of a profile with ``preempt_batch``,
        gets ``Pending`` (ask again later) when ``preempt_hook`` starts freeing a slice, but
        only when the job's grace period fits in ``wait_seconds`` (how long the spawn waits).
        """
        profile = self.profiles.get(profile_name)
        if profile is None:
            raise Refused("unknown_profile", f"unknown profile {profile_name!r}")
        if purpose not in PURPOSES:
            raise Refused("bad_request", f"purpose must be one of {list(PURPOSES)}")
        try:
            return self._allocate(
                caller, profile, server_name, purpose, priority, preemptible, learn
            )
        except Refused as refused:
            e = refused
            if e.code == "no_capacity" and purpose == "interactive" and profile.preempt_batch:
                pending = self.preempt_hook(caller, profile, server_name, wait_seconds)
                if isinstance(pending, str):
                    # a job could make room, not in time: the refusal says why not
                    e = Refused(e.code, f"{e.message}; {pending}", **e.detail)
                elif pending is not None:
                    message = pending.pop("message")
                    raise Pending(message, **pending) from None
            if e.code in REFUSALS and not quiet:
                # Recorded in a transaction of its own: the refused one was rolled back.
                with self.db.writing() as s:
                    self._event(
                        s,
                        "refused",
                        caller.user,
                        caller.actor,
                        None,
                        profile.name,
                        e.message,
                        {"code": e.code},
                    )
                self.on_refusal(profile.name, e.code)
            if e is refused:
                raise
            raise e from None

    def _allocate(
        self,
        caller: Caller,
        profile: Profile,
        server_name: str,
        purpose: str,
        priority: int,
        preemptible: bool,
        learn: bool = True,
    ) -> tuple[dict[str, Any], bool]:
        if not profile.allowed_for(caller.groups):
            raise Refused("forbidden_profile", f"{profile.name} is not allowed for your groups")
        request = profile.request()
        try:
            with self.db.writing() as s:
                if purpose == "interactive":
                    held = (
                        s.connection()
                        .execute(
                            select(ALLOCATIONS.c.id, ALLOCATIONS.c.profile).where(
                                ALLOCATIONS.c.active,
                                ALLOCATIONS.c.purpose == "interactive",
                                ALLOCATIONS.c.user == caller.user,
                                ALLOCATIONS.c.server_name == server_name,
                            )
                        )
                        .first()
                    )
                    if held is not None:
                        if held.profile == profile.name:
                            view = load_allocation(s, held.id)
                            assert view is not None
                            return allocation_json(view, self._gpus(s)), False
                        raise Refused(
                            "server_holds_allocation",
                            f"server {server_name or '(default)'} of {caller.user} already holds "
                            f"allocation {held.id} ({held.profile}); release it first",
                            allocation_id=held.id,
                        )
                inv = self.inventory_cache.get(s)
                active = self.active_cache.get(s)
                want = Usage(
                    profile.quota_weight, request.total_gpu_milli or _mig_milli(profile, inv)
                )
                charge = self.effective_quotas(s).check(
                    caller.user, caller.groups, want, _holdings(active)
                )
                if not isinstance(charge, Charge):
                    raise Refused("over_quota", charge)
                with self.cluster_cache.use(inv, active) as state, self._policy_lock:
                    result: Placement | Refusal = Refusal("there are no hosts")
                    if state is not None:
                        result = place_in(request, state, self.policy, learn=learn)
                    if not isinstance(result, Placement):
                        raise self._no_capacity(inv, caller, profile, state)
                row = self._write_allocation(
                    s, caller, profile, result, server_name, purpose, priority, preemptible, charge
                )
                return allocation_json(row, self._gpus(s)), True
        except IntegrityError as e:  # pragma: no cover - the lock makes this unreachable
            log.error("ledger constraint refused an allocation: %s", e)
            raise Refused("conflict", "the slice was taken concurrently; retry") from e

    def _write_allocation(
        self,
        s: Session,
        caller: Caller,
        profile: Profile,
        placement: Placement,
        server_name: str,
        purpose: str,
        priority: int,
        preemptible: bool,
        charge: Charge,
    ) -> AllocationView:
        # Core inserts, not the ORM unit of work: this is the hot path of every spawn.
        values: dict[str, Any] = {
            "user": caller.user,
            "server_name": server_name,
            "profile": profile.name,
            "kind": profile.kind,
            "purpose": purpose,
            "priority": priority,
            "preemptible": preemptible,
            "host": placement.host,
            "groups": sorted(caller.groups),
            "charged_group": charge.group,
            "borrowed": charge.borrowed,
            "quota_weight": profile.quota_weight,
            "gpu_milli": sum(a.milli for a in placement.assignments),
            "cpu_milli": profile.cpu_milli,
            "memory_mib": profile.memory_mib,
            "active": True,
            "created_at": utcnow(),
            "released_at": None,
            "release_reason": None,
        }
        # Core statements on the session's connection: the ORM layer adds nothing here.
        conn = s.connection()
        stmt = insert(ALLOCATIONS).values(**values).returning(ALLOCATIONS.c.id)
        alloc_id = conn.execute(stmt).scalar_one()
        claims: list[dict[str, Any]] = [
            {
                "allocation_id": alloc_id,
                "gpu_uuid": a.gpu_uuid,
                "mig_uuid": a.mig_uuid,
                "milli": a.milli,
                "memory_mib": a.memory_mib,
                # whole GPUs and MIG instances have one holder at a time; shares don't
                "exclusive_key": a.mig_uuid or (a.gpu_uuid if profile.kind == "gpu" else None),
                "active": True,
            }
            for a in placement.assignments
        ]
        conn.execute(insert(CLAIMS), claims)
        detail: dict[str, Any] = {
            "host": placement.host,
            "server_name": server_name,
            "purpose": purpose,
        }
        if charge.group:
            detail["charged_group"] = charge.group
            detail["borrowed"] = charge.borrowed
        self._event(s, "allocated", caller.user, caller.actor, alloc_id, profile.name, None, detail)
        view = AllocationView(id=alloc_id, **values)
        view.claims = [ClaimView(id=0, **c) for c in claims]
        return view

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

    def observe(self, profile_name: str) -> None:
        """Count a request for ``profile_name`` that was not tried (a job refused for the
        reason a job of the same shape was), for a policy that learns the request mix."""
        profile = self.profiles.get(profile_name)
        observe = getattr(self.policy, "observe", None)
        if profile is not None and observe is not None:
            with self._policy_lock:
                observe(profile.request())

    def learn_from_history(self, limit: int = 10_000) -> int:
        """Show a learning policy the newest ``limit`` requests the ledger recorded (slices
        allocated and refused), oldest first, so it does not start from nothing after a
        restart. Returns how many it was shown."""
        observe = getattr(self.policy, "observe", None)
        if observe is None:
            return 0
        with self.db.reading() as s:
            rows = (
                s.connection()
                .execute(
                    select(EVENTS.c.profile)
                    .where(EVENTS.c.kind.in_(("allocated", "refused")))
                    .order_by(EVENTS.c.id.desc())
                    .limit(limit)
                )
                .all()
            )
        shown = 0
        with self._policy_lock:
            for (name,) in reversed(rows):
                profile = self.profiles.get(name)
                if profile is not None:
                    observe(profile.request())
                    shown += 1
        return shown

    # -- release -----------------------------------------------------------------------

    def release(
        self,
        alloc_id: int,
        actor: str,
        reason: str,
        owner: str | None = None,
        server_stopped: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        """Release once; a second release is a no-op that reports ``released=False``.

        ``owner``: when given, only that user's allocation may be released (``not_found``
        otherwise).
        ``server_stopped``: the spawner releases the slice of a server the hub stopped; when
        the service asked for that stop, the release says why (see ``_why_stopped``).
        """
        with self.db.writing() as s:
            view = load_allocation(s, alloc_id)
            if view is None:
                raise Refused("not_found", f"no allocation {alloc_id}")
            if owner is not None and view.user != owner:
                # the same answer as for one that does not exist: ids are not a side channel
                raise Refused("not_found", f"no allocation {alloc_id}")
            if not view.active:
                return allocation_json(view, self._gpus(s)), False
            if server_stopped:
                reason = self._why_stopped(s, alloc_id) or reason
            self._release(s, view, actor, reason)
            return allocation_json(view, self._gpus(s)), True

    @staticmethod
    def _why_stopped(s: Session, alloc_id: int) -> str | None:
        """A server the service asked the hub to stop (idle cull, the owner's release, a
        silent server) is released by its spawner as "server stopped": the release keeps the
        real reason, from the service's own record of the request."""
        row = s.execute(
            select(EVENTS.c.kind, EVENTS.c.reason)
            .where(EVENTS.c.allocation_id == alloc_id, EVENTS.c.kind.in_(RECLAIM_KINDS))
            .order_by(EVENTS.c.id.desc())
            .limit(1)
        ).first()
        if row is None:
            return None
        kind, reason = row
        return f"{RECLAIM_KINDS[kind]}: {reason}" if reason else RECLAIM_KINDS[kind]

    def _release(self, s: Session, view: AllocationView, actor: str, reason: str) -> None:
        now = utcnow()
        conn = s.connection()
        conn.execute(
            update(ALLOCATIONS)
            .where(ALLOCATIONS.c.id == view.id)
            .values(active=False, released_at=now, release_reason=reason[:255])
        )
        conn.execute(update(CLAIMS).where(CLAIMS.c.allocation_id == view.id).values(active=False))
        view.active, view.released_at, view.release_reason = False, now, reason[:255]
        for c in view.claims:
            c.active = False
        self._event(
            s, "released", view.user, actor, view.id, view.profile, reason, {"host": view.host}
        )

    def servers_missing(
        self, existing: set[tuple[str, str]], grace: timedelta, now: datetime | None = None
    ) -> set[tuple[str, str]]:
        """(user, server) of the interactive allocations past ``grace`` whose server is not
        in ``existing``: what :meth:`reconcile_servers` would release. Reads only."""
        with self.db.reading() as s:
            return {(v.user, v.server_name) for v in self._unmatched(s, existing, grace, now)}

    def reconcile_servers(
        self,
        existing: set[tuple[str, str]],
        grace: timedelta,
        now: datetime | None = None,
        only: set[tuple[str, str]] | None = None,
    ) -> list[int]:
        """Release interactive allocations whose server no longer exists on the hub.

        Allocations younger than ``grace`` are left alone: a spawn in progress holds its
        allocation before the hub lists the server as running. ``only``: release none but
        these servers' (the ones the caller has confirmed gone).
        """
        released = []
        with self.db.writing() as s:
            for view in self._unmatched(s, existing, grace, now):
                if only is not None and (view.user, view.server_name) not in only:
                    continue
                self._release(s, view, "reconciler", "server no longer exists on the hub")
                released.append(view.id)
        return released

    @staticmethod
    def _unmatched(
        s: Session, existing: set[tuple[str, str]], grace: timedelta, now: datetime | None
    ) -> list[AllocationView]:
        now = now or utcnow()
        return [
            view
            for view in load_active(s)
            if view.purpose == "interactive"
            and (view.user, view.server_name) not in existing
            and now - view.created_at >= grace
        ]

    # -- queries -----------------------------------------------------------------------

    def get(self, alloc_id: int) -> dict[str, Any] | None:
        with self.db.reading() as s:
            view = load_allocation(s, alloc_id)
            return allocation_json(view, self._gpus(s)) if view else None

    def allocations(
        self,
        user: str | None = None,
        active_only: bool = True,
        limit: int = 500,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; ``before_id``: the page after the one that ended there."""
        with self.db.reading() as s:
            q = select(AllocationRow).order_by(AllocationRow.id.desc()).limit(limit)
            if before_id is not None:
                q = q.where(AllocationRow.id < before_id)
            if user is not None:
                q = q.where(AllocationRow.user == user)
            if active_only:
                q = q.where(AllocationRow.active)
            gpus = self._gpus(s)
            return [allocation_json(r, gpus) for r in s.scalars(q)]

    def events(
        self,
        user: str | None = None,
        since_id: int | None = None,
        limit: int = 200,
        kinds: Iterable[str] | None = None,
        before_id: int | None = None,
    ) -> list[dict[str, Any]]:
        """Newest first; with ``since_id`` the oldest after it first, so that a reader
        following the log page by page (the last id as the next ``since_id``) misses none."""
        with self.db.reading() as s:
            q = select(EventRow).limit(limit)
            if since_id is None:
                q = q.order_by(EventRow.id.desc())
            else:
                q = q.where(EventRow.id > since_id).order_by(EventRow.id.asc())
            if before_id is not None:
                q = q.where(EventRow.id < before_id)
            if user is not None:
                q = q.where(EventRow.user == user)
            if kinds is not None:
                q = q.where(EventRow.kind.in_(list(kinds)))
            return [event_json(e) for e in s.scalars(q)]

    def record_event(
        self, kind: str, user: str | None, actor: str, reason: str | None, detail: dict[str, Any]
    ) -> dict[str, Any]:
        with self.db.writing() as s:
            event_id = self._event(
                s,
                kind,
                user,
                actor,
                detail.get("allocation_id"),
                detail.get("profile"),
                reason,
                detail,
            )
            row = s.get(EventRow, event_id)
            assert row is not None
            return event_json(row)

    def snapshot(self) -> tuple[tuple[HostView, ...], tuple[GPUView, ...], list[AllocationView]]:
        """Inventory and active allocations, read in one transaction."""
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
            return inv.hosts, inv.gpus, self.active_cache.get(s)

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
            holdings = _holdings(self.active_cache.get(s))
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
                    want = Usage(p.quota_weight, p.request().total_gpu_milli or _mig_milli(p, inv))
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
            holdings = _holdings(self.active_cache.get(s))
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

    def effective_quotas(self, s: Session) -> Quotas:
        """The configured quotas with the admins' runtime overrides applied.

        Overrides change the ledger generation, so they are read again only when it moves.
        """
        generation = self.inventory_cache.get(s).generation
        if self._quota_cache is None or self._quota_cache[0] != generation:
            rows = s.connection().execute(select(QuotaOverrideRow.__table__)).all()
            self._quota_cache = (generation, apply_overrides(self.quotas, rows))
        return self._quota_cache[1]

    def record_usage(
        self,
        alloc_id: int,
        utilization: float | None,
        memory_mib: float | None,
        idle_seconds: float,
        interval_seconds: float,
    ) -> datetime:
        """Keep the latest utilization the holder of an active allocation measured."""
        now = utcnow()
        values = {
            "reported_at": now,
            "utilization": utilization,
            "memory_mib": memory_mib,
            "idle_seconds": idle_seconds,
            "interval_seconds": interval_seconds,
        }
        reports = cast(Table, UsageReportRow.__table__)
        upsert = pg_insert if not self.db.is_sqlite else sqlite_insert
        stmt = upsert(reports).values(allocation_id=alloc_id, **values)
        # One statement, safe without the ledger lock: 500 servers reporting every minute
        # do not queue behind spawns.
        stmt = stmt.on_conflict_do_update(index_elements=[reports.c.allocation_id], set_=values)
        with self.db.writing(lock=False) as s:
            s.connection().execute(stmt)
        return now

    # -- helpers -----------------------------------------------------------------------

    def _gpus(self, s: Session) -> dict[str, GPUView]:
        return self.inventory_cache.get(s).by_uuid

    @staticmethod
    def _event(  # type: ignore[no-untyped-def]
        s: Session, kind, user, actor, allocation_id=None, profile=None, reason=None, detail=None
    ) -> int:
        values = {
            "ts": utcnow(),
            "kind": kind,
            "user": user,
            "actor": actor,
            "allocation_id": allocation_id,
            "profile": profile,
            "reason": reason,
            "detail": detail or {},
        }
        stmt = insert(EVENTS).values(**values).returning(EVENTS.c.id)
        return int(s.connection().execute(stmt).scalar_one())


def _holdings(active: Iterable[AllocationView]) -> list[Holding]:
    return [Holding(a.user, a.charged_group, Usage(a.quota_weight, a.gpu_milli)) for a in active]


def _mig_milli(profile: Profile, inv: InventoryView) -> int:
    """A MIG profile's compute share, from any instance of it in the inventory."""
    if profile.kind != "mig":
        return 0
    for g in inv.gpus:
        for m in g.mig_instances:
            if m.profile == profile.mig_profile:
                return m.milli
    return 0
