"""Allocation and release: the only code that writes allocations.

Every write happens inside ``Database.writing()``, which holds the ledger lock for the whole
read-place-write sequence, so two requests can never both see the same free slice. The
partial unique indexes on claims and servers are a second, independent guard.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NoReturn

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from ..clusterview import build_hosts
from ..db.lean import Lean
from ..db.loopguard import hold
from ..db.models import (
    utcnow,
)
from ..errors import Pending, Refused
from ..placement import Placement, Refusal, Request, place_in
from ..placement.state import ClusterState, from_hosts
from ..pools import Access
from ..profiles import Profile
from ..quotas import Charge, Quotas
from ..serialize import allocation_json
from ..snapshot import (
    ActiveState,
    AllocationView,
    ClaimView,
    InventoryView,
    load_active,
    load_allocation,
)
from .base import (
    ALLOCATIONS,
    CLAIMS,
    EVENTS,
    PURPOSES,
    RECLAIM_KINDS,
    REFUSALS,
    Caller,
    log,
    quota_usage,
    stops_a_server,
)
from .capacity import CapacityMixin
from .holders import HOLDERS, engine_of

# Statements of every spawn and release, built once (see snapshot.py).
_SERVERS_SLICE = Lean(
    select(ALLOCATIONS.c.id, ALLOCATIONS.c.profile).where(
        ALLOCATIONS.c.active,
        ALLOCATIONS.c.purpose == "interactive",
        ALLOCATIONS.c.user == bindparam("b_user"),
        ALLOCATIONS.c.server_name == bindparam("b_server"),
    ),
    named=True,
)
_INSERT_ALLOCATION = Lean(insert(ALLOCATIONS).returning(ALLOCATIONS.c.id))
# one statement per claim: most allocations have one (a share, a MIG instance, a GPU)
_INSERT_CLAIM = Lean(insert(CLAIMS).returning(CLAIMS.c.id))
_RELEASE = Lean(
    update(ALLOCATIONS)
    .where(ALLOCATIONS.c.id == bindparam("b_id"))
    .values(active=False, released_at=bindparam("b_at"), release_reason=bindparam("b_reason"))
)
_RELEASE_CLAIMS = Lean(
    update(CLAIMS).where(CLAIMS.c.allocation_id == bindparam("b_id")).values(active=False)
)


# the reclaims recorded of an allocation, newest first: the newest that stopped its server
# says why (``_why_stopped``; a kernel's cull, of the same kind, stopped nothing)
_RECLAIM_REQUESTS = Lean(
    select(EVENTS.c.kind, EVENTS.c.reason, EVENTS.c.detail)
    .where(EVENTS.c.allocation_id == bindparam("b_id"), EVENTS.c.kind.in_(RECLAIM_KINDS))
    .order_by(EVENTS.c.id.desc())
)


class AllocationMixin(CapacityMixin):
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
        may_borrow: bool = False,
        only: frozenset[str] | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> tuple[dict[str, Any], bool]:
        """Allocate a slice; returns (allocation, created). Raises Refused, or Pending (below).

        Idempotent per server: asking again for the same server and profile returns the
        allocation it already holds (a retried spawn must not hold two slices).
        ``quiet``: do not record refusals (the job scheduler retries every pass).
        ``learn``: a placement policy that learns the request mix counts this request (the
        scheduler's retries of one job are one request: it passes False after the first).
        ``may_borrow``: a preemptible batch job inside the reserved pools' borrowing window
        may take idle reserved GPUs (pools.py); the pools a request may use are tried in
        their order. ``only``: of those, these pools only (the scheduler keeps a job out of
        the pools a job ahead of it waits for). ``avoid``: hosts it may not be placed on
        (room being made there for another job by moving preemptible ones).
        An interactive spawn that finds no capacity, of a profile with ``preempt_batch``,
        gets ``Pending`` (ask again later) when ``preempt_hook`` starts freeing a slice, but
        only when the job's grace period fits in ``wait_seconds`` (how long the spawn waits).
        """
        try:
            return self.try_allocate(
                caller,
                profile_name,
                server_name,
                purpose,
                priority,
                preemptible,
                learn=learn,
                may_borrow=may_borrow,
                only=only,
                avoid=avoid,
            )
        except Refused as refused:
            self.after_refusal(
                refused, caller, profile_name, server_name, wait_seconds, quiet, purpose
            )

    def try_allocate(
        self,
        caller: Caller,
        profile_name: str,
        server_name: str = "",
        purpose: str = "interactive",
        priority: int = 0,
        preemptible: bool = False,
        learn: bool = True,
        may_borrow: bool = False,
        only: frozenset[str] | None = None,
        avoid: frozenset[str] = frozenset(),
        overcommit: bool = True,
    ) -> tuple[dict[str, Any], bool]:
        """The ledger's part of :meth:`allocate`: the allocation, or ``Refused`` with nothing
        recorded and no one asked to make room (``after_refusal`` does that). It reads and
        writes the ledger only, so the API may run it on the event loop (db/short_writes.py).
        ``overcommit=False``: placed and charged as the profile asks even where overcommit
        would charge less (a spawner whose engine counts each share at its full size).
        """
        profile = self.profiles.get(profile_name)
        if profile is None:
            raise Refused("unknown_profile", f"unknown profile {profile_name!r}")
        if purpose not in PURPOSES:
            raise Refused("bad_request", f"purpose must be one of {list(PURPOSES)}")
        access = self._access_within(profile, purpose, caller, priority, may_borrow, only)
        return self._allocate(
            caller,
            profile,
            server_name,
            purpose,
            priority,
            preemptible,
            learn,
            access=access,
            avoid=avoid,
            overcommit=overcommit,
        )

    def _access_within(
        self,
        profile: Profile,
        purpose: str,
        caller: Caller,
        priority: int,
        may_borrow: bool,
        only: frozenset[str] | None,
    ) -> Access | None:
        """The pools a request may use (``access``), of them ``only`` these; refused when
        that leaves none."""
        access = self.access(purpose, caller.groups, priority, may_borrow)
        if access is not None and only is not None:
            access = access.within(only)
            if access is None:
                raise Refused(
                    "no_capacity", f"No {profile.display_name} free in the pools it may use"
                )
        return access

    def after_refusal(
        self,
        refused: Refused,
        caller: Caller,
        profile_name: str,
        server_name: str = "",
        wait_seconds: float | None = None,
        quiet: bool = False,
        purpose: str = "interactive",
        overcommit: bool = True,
    ) -> NoReturn:
        """What follows a refusal of :meth:`try_allocate`: for an interactive spawn of a
        profile with ``preempt_batch``, ask ``preempt_hook`` to make room (``Pending``);
        record the refusal (unless ``quiet``); raise what the caller is to be told."""
        e = refused
        profile = self.profiles.get(profile_name)
        if profile is None or e.code in ("unknown_profile", "bad_request"):
            raise refused  # a request that was never tried: nothing to record
        if e.code == "no_capacity" and purpose == "interactive" and profile.preempt_batch:
            pending = self.preempt_hook(caller, profile, server_name, wait_seconds, overcommit)
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
            raise refused
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
        host: str | None = None,
        enforce_quota: bool = True,
        access: Access | None = None,
        avoid: frozenset[str] = frozenset(),
        overcommit: bool = True,
        engine_placed: bool = False,
    ) -> tuple[dict[str, Any], bool]:
        if enforce_quota:
            _allowed(profile, caller)
        try:
            with self.db.writing() as s:
                # a share of a holder whose history leaves room is placed as less than it
                # promises (overcommit.py); everything else as the profile asks
                request = (
                    self.overcommit.request_for(s, caller.user, profile, purpose)
                    if overcommit
                    else profile.request()
                )
                if purpose == "interactive":
                    held = _SERVERS_SLICE.execute(
                        s.connection(), {"b_user": caller.user, "b_server": server_name}
                    ).first()
                    if held is not None:
                        if held.profile == profile.name:
                            view = load_allocation(s, held.id)
                            assert view is not None
                            return allocation_json(view, self._gpus(s)), False
                        other = self.profiles.get(held.profile)
                        shown = other.display_name if other is not None else held.profile
                        raise Refused(
                            "server_holds_allocation",
                            f"server {server_name or '(default)'} of {caller.user} already holds "
                            f"allocation {held.id} ({shown}); release it first",
                            allocation_id=held.id,
                        )
                inv = self.inventory_cache.get(s)
                active = self.active_cache.state(s)
                charge = self._charge(self.effective_quotas(s), inv, caller, profile, enforce_quota)
                with self.cluster_cache.use(inv, active) as state, hold(self._policy_lock):
                    try:
                        result = self._place(
                            inv,
                            state,
                            caller,
                            profile,
                            request,
                            access,
                            purpose,
                            learn,
                            host,
                            avoid,
                        )
                    except Refused:
                        found = None
                        if engine_placed and host is not None:
                            found = self._where_engine_runs(inv, active, request, host)
                        if found is None:
                            raise
                        result = found
                row = self._write_allocation(
                    s,
                    caller,
                    profile,
                    result,
                    server_name,
                    purpose,
                    priority,
                    preemptible,
                    charge,
                    overcommitted=request != profile.request(),
                )
                # (``inv``, not read again: nothing may give way after the policy learned)
                return allocation_json(row, inv.by_uuid), True
        except IntegrityError as e:  # pragma: no cover - the lock makes this unreachable
            log.error("ledger constraint refused an allocation: %s", e)
            raise Refused("conflict", "the slice was taken concurrently; retry") from e

    def _charge(
        self,
        quotas: Quotas,
        inv: InventoryView,
        caller: Caller,
        profile: Profile,
        enforce_quota: bool = True,
    ) -> Charge:
        """What one more slice of ``profile`` charges ``caller`` (``over_quota`` refused),
        against what the active allocations hold as the cache's last look left them (the
        caller brought it up to date)."""
        charge = quotas.check(
            caller.user, caller.groups, quota_usage(profile, inv), self.active_cache.held()
        )
        if isinstance(charge, Charge):
            return charge
        if enforce_quota:
            raise Refused("over_quota", charge)
        return Charge(None)  # counted against the user, beyond their quota

    def _place(
        self,
        inv: InventoryView,
        state: ClusterState | None,
        caller: Caller,
        profile: Profile,
        request: Request,
        access: Access | None,
        purpose: str,
        learn: bool,
        host: str | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Placement:
        """Where ``request`` goes on ``state`` (the placement arrays, held under the policy
        lock), in the pools of ``access`` in their order; else the ``Refused`` an
        allocation raises."""
        result: Placement | Refusal = Refusal("there are no hosts")
        tries = access.tries if access is not None else (None,)
        for i, allowed in enumerate(tries):
            if state is None:
                break
            usable = self._within(state, allowed, inv.generation, keep=True)
            # one request, however many pools it is tried in
            result = place_in(
                request, usable, self.policy, learn=learn and not i, host=host, avoid=avoid
            )
            if isinstance(result, Placement):
                return result
        if host is not None:
            raise Refused("no_capacity", f"no free {profile.name} on {host} in the ledger")
        raise self._no_capacity(inv, caller, profile, state, access, purpose == "interactive")

    def _where_engine_runs(
        self, inv: InventoryView, active: ActiveState, request: Request, host: str
    ) -> Placement | None:
        """A slice for work the engine already runs on ``host``, drained GPUs included: a
        drain (an admin's in gpuslice, or the engine's own, which lets running work end,
        and a reservation the work was sent into) keeps new grants off a node, never the
        record of what runs there. None where even then none is free."""
        hosts = build_hosts(
            [h for h in inv.hosts if h.name == host],
            [g for g in inv.gpus if g.host == host],
            [a for a in active.views.values() if a.host == host],
            ignore_drain=True,
        )
        result = (
            place_in(request, from_hosts(hosts), self.policy, learn=False, host=host)
            if hosts
            else None
        )
        return result if isinstance(result, Placement) else None

    def catch_up(self, s: Session, newest_event: int | None = None) -> None:
        """Bring the kept inventory, quotas and active allocations up to what ``s`` reads:
        ``refusal_as_kept`` answers from them. ``newest_event``: the newest event id,
        already read in ``s``."""
        self.effective_quotas(s)  # (reads the inventory's generation too)
        self.active_cache.catch_up(s, newest_event)

    def refusal_as_kept(
        self,
        caller: Caller,
        profile_name: str,
        purpose: str = "batch",
        priority: int = 0,
        may_borrow: bool = False,
        only: frozenset[str] | None = None,
        avoid: frozenset[str] = frozenset(),
    ) -> Refused | None:
        """The refusal an allocation (``try_allocate``) of ``profile_name`` would meet on the
        ledger as this process last saw it (its last look, and its own writes since),
        without a transaction or a database read; None where it might be granted, or the
        kept state cannot tell (then ask ``allocate``).

        A state seen earlier, not the one an allocation would see: any change since moves
        the ledger's newest event or generation, so a caller that asks again after each
        such change (the scheduler's pass, whose marker holds both) misses nothing. Its
        queued jobs are tried a few times a pass, each a write transaction that almost
        always finds no room. Not for servers (a server's held slice is not kept) nor where
        overcommit places a share by its holder's history (read from the database). The
        policy learns nothing here (``observe`` counts the request)."""
        profile = self.profiles.get(profile_name)
        inv = self.inventory_cache.kept()
        quotas = self._quota_cache
        if (
            profile is None
            or purpose != "batch"
            or self.overcommit.settings.on
            or inv is None
            or quotas is None
            or quotas[0] != inv.generation
        ):
            return None
        try:
            access = self._access_within(profile, purpose, caller, priority, may_borrow, only)
            _allowed(profile, caller)
            self._charge(quotas[1], inv, caller, profile)
            active = self.active_cache.state_kept()
            with self.cluster_cache.use(inv, active) as state, hold(self._policy_lock):
                self._place(
                    inv,
                    state,
                    caller,
                    profile,
                    profile.request(),
                    access,
                    purpose,
                    False,
                    None,
                    avoid,
                )
        except Refused as refused:
            return refused
        return None

    def record_placed(
        self,
        caller: Caller,
        profile_name: str,
        host: str,
        server_name: str,
        priority: int = 0,
        preemptible: bool = False,
    ) -> dict[str, Any]:
        """Hold a slice of ``profile_name`` on ``host`` for batch work an engine already
        runs there (Slurm chose the node): the ledger records what is, so neither quotas
        nor group limits refuse it (Slurm's limits applied when it started the job); it is
        charged like any batch slice. Refused ``no_capacity`` when the ledger has no free
        slice of that kind on ``host``."""
        profile = self.profiles.get(profile_name)
        if profile is None:
            raise Refused("unknown_profile", f"unknown profile {profile_name!r}")
        alloc, _ = self._allocate(
            caller,
            profile,
            server_name,
            "batch",
            priority,
            preemptible,
            learn=False,
            host=host,
            enforce_quota=False,
            engine_placed=True,
        )
        return alloc

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
        overcommitted: bool = False,
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
            # what the slice promises (an overcommitted share is placed as less: see below)
            "gpu_milli": (
                profile.gpu_milli
                if profile.kind == "share"
                else sum(a.milli for a in placement.assignments)
            ),
            "cpu_milli": profile.cpu_milli,
            "memory_mib": profile.memory_mib,
            "active": True,
            "created_at": utcnow(),
            "released_at": None,
            "release_reason": None,
        }
        # Core statements on the session's connection: the ORM layer adds nothing here.
        conn = s.connection()
        alloc_id = _INSERT_ALLOCATION.execute(conn, values).scalar_one()
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
                "charged_milli": None,
                "charged_memory_mib": None,
            }
            for a in placement.assignments
        ]
        if overcommitted:
            # placed as charged (overcommit.py): the claim keeps what it promises, the
            # holder's cap, and records what it takes of the GPU
            claims[0]["charged_milli"] = claims[0]["milli"]
            claims[0]["charged_memory_mib"] = claims[0]["memory_mib"]
            claims[0]["milli"] = profile.gpu_milli
            claims[0]["memory_mib"] = profile.gpu_memory_mib
        claim_ids = [_INSERT_CLAIM.execute(conn, claim).scalar_one() for claim in claims]
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
        view.claims = [ClaimView(id=i, **c) for i, c in zip(claim_ids, claims, strict=True)]
        self.active_cache.wrote(s).states[alloc_id] = view
        return view

    def request_for(
        self, user: str, profile: Profile, purpose: str, overcommit: bool = True
    ) -> Request:
        """What a slice of ``profile`` for ``user``'s ``purpose`` is placed as (a share may
        be charged less than it promises: overcommit.py; not when asked with
        ``overcommit=False``); for preemption and moves, which must make room for what
        will be placed."""
        if not (overcommit and self.overcommit.settings.on):
            return profile.request()
        with self.db.reading() as s:
            return self.overcommit.request_for(s, user, profile, purpose)

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
            if view.purpose == "external":
                # the engine holds it: releasing it here would offer a device in use until
                # the mirror's next pass took it back
                engine = engine_of(view.profile)
                raise Refused(
                    "wrong_state",
                    f"allocation {alloc_id} is held by {HOLDERS[engine]} outside gpuslice; "
                    f"it is released when {engine} frees it",
                )
            if server_stopped:
                reason = self._why_stopped(s, alloc_id) or reason
            self._release(s, view, actor, reason)
            return allocation_json(view, self._gpus(s)), True

    @staticmethod
    def _why_stopped(s: Session, alloc_id: int) -> str | None:
        """A server the service asked the hub to stop (idle cull, the owner's release, a
        silent server) is released by its spawner as "server stopped": the release keeps the
        real reason, from the service's own record of the request."""
        rows = _RECLAIM_REQUESTS.execute(s.connection(), {"b_id": alloc_id})
        row = next((r for r in rows if stops_a_server(r[0], r[2])), None)
        if row is None:
            return None
        kind, reason, _detail = row
        return f"{RECLAIM_KINDS[kind]}: {reason}" if reason else RECLAIM_KINDS[kind]

    def _release(self, s: Session, view: AllocationView, actor: str, reason: str) -> None:
        now = utcnow()
        conn = s.connection()
        _RELEASE.execute(conn, {"b_id": view.id, "b_at": now, "b_reason": reason[:255]})
        _RELEASE_CLAIMS.execute(conn, {"b_id": view.id})
        view.active, view.released_at, view.release_reason = False, now, reason[:255]
        for c in view.claims:
            c.active = False
        self.active_cache.wrote(s).states[view.id] = None
        self._event(
            s, "released", view.user, actor, view.id, view.profile, reason, {"host": view.host}
        )

    def servers_missing(
        self, existing: set[tuple[str, str]], grace: timedelta, now: datetime | None = None
    ) -> set[tuple[str, str]]:
        """(user, server) of the interactive allocations at least ``grace`` old whose server
        is not in ``existing``: the ones to ask the hub about before
        :meth:`reconcile_servers`. Reads only."""
        with self.db.reading() as s:
            return {(v.user, v.server_name) for v in self._unmatched(s, existing, grace, now)}

    def reconcile_servers(
        self,
        existing: set[tuple[str, str]],
        grace: timedelta,
        now: datetime | None = None,
        only: set[tuple[str, str]] | None = None,
        stopped: dict[tuple[str, str], datetime] | None = None,
    ) -> list[int]:
        """Release interactive allocations whose server no longer exists on the hub.

        ``stopped``: the servers the hub reported stopped (it has their user and lists the
        server as neither running nor starting nor stopping), each with when it was asked.
        Their allocations granted before then are released whatever their age: a spawn
        holds its allocation only while the hub lists its server as starting (``pending``
        "spawn"), so the hub knew of it, and it is over. Other allocations missing from
        ``existing`` are released only past ``grace``: the hub may not list a spawn yet (a
        grant made after it was asked), or could not tell (a user it does not have). With
        ``only``, of these, none but those servers' (the ones the caller confirmed gone).
        """
        released = []
        stopped = stopped or {}
        now = now or utcnow()
        with self.db.writing() as s:
            for view in self._unmatched(s, existing, timedelta(0), now):
                key = (view.user, view.server_name)
                asked = stopped.get(key)
                if asked is not None and view.created_at < asked:
                    # its spawner's release did not reach the service (the hub stops its
                    # services before its servers when it shuts down): the record of a
                    # stop the service asked for (an idle cull) says why, as it would have
                    reason = self._why_stopped(s, view.id) or "server stopped on the hub"
                elif now - view.created_at >= grace and (only is None or key in only):
                    reason = "server no longer exists on the hub"
                else:
                    continue
                self._release(s, view, "reconciler", reason)
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


def _allowed(profile: Profile, caller: Caller) -> None:
    """Refused ``forbidden_profile`` where the caller's groups may not use ``profile``."""
    if not profile.allowed_for(caller.groups):
        raise Refused("forbidden_profile", f"{profile.display_name} is not allowed for your groups")
