"""The ledger's state and what every part of it shares: the database, the profiles,
quotas and placement policy, the caches of inventory, active allocations and placement
arrays, and how an event is written."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Table, insert, select
from sqlalchemy.orm import Session

from ..clusterview import ClusterCache
from ..db.admin_models import QuotaOverrideRow
from ..db.engine import Database
from ..db.lean import Lean
from ..db.models import (
    AllocationRow,
    ClaimRow,
    EventRow,
    utcnow,
)
from ..overcommit import OvercommitHistory, OvercommitSettings
from ..overrides import apply_overrides
from ..placement.engine import Policy
from ..placement.state import ClusterState
from ..pools import Access, Pools
from ..profiles import Profile
from ..quotas import Quotas, Usage
from ..snapshot import (
    ActiveCache,
    AllocationView,
    GPUView,
    HostView,
    InventoryCache,
    InventoryView,
)

log = logging.getLogger("gpuslice.ledger")

ALLOCATIONS = cast(Table, AllocationRow.__table__)
CLAIMS = cast(Table, ClaimRow.__table__)
EVENTS = cast(Table, EventRow.__table__)

PURPOSES = ("interactive", "batch")
# built once (see snapshot.py): every allocation and release writes an event
_INSERT_EVENT = Lean(insert(EVENTS).returning(EVENTS.c.id))
# Events of a stop the service asked for, and how a release that follows one reads.
RECLAIM_KINDS = {
    "idle-culled": "culled for idleness",
    "release-requested": "released by its owner",
    "reclaim-silent": "reclaimed: its server stopped reporting",
}
REFUSALS = ("forbidden_profile", "over_quota", "no_capacity")


def stops_a_server(kind: str, detail: Any) -> bool:
    """Whether an event is a request to stop a server (and so to give its slice back).

    A kernel's idle cull is recorded under the same kind as a server's (``idle-culled``,
    told apart by its ``scope``) but stops nothing: the server and its slice stay. Read as a
    stop request, it had the reconciler stop the server of someone who was still working
    (issue 44). Older records without a scope are a server's unless they name a kernel."""
    if kind not in RECLAIM_KINDS:
        return False
    detail = detail if isinstance(detail, dict) else {}
    scope = detail.get("scope")
    if scope is None:
        return detail.get("kernel_id") is None
    return bool(scope == "server")


@dataclass(frozen=True)
class Caller:
    """Who asks: the user the allocation is for, and who actually sent the request."""

    user: str
    groups: tuple[str, ...]
    actor: str


class LedgerBase:
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
        # (the last argument: whether the spawn is placed overcommitted, as it asked)
        self.preempt_hook: Callable[
            [Caller, Profile, str, float | None, bool], dict[str, Any] | str | None
        ] = lambda caller, profile, server_name, wait_seconds, overcommit: None
        # Set with it: (caller, profiles, overcommit, wait_seconds) -> for each profile, what
        # a spawn that finds none free would get by preemption (JobManager.spawn_preemption),
        # for the spawn form; None: no job manager
        self.spawn_preemption: (
            Callable[[Caller, list[Profile], bool, float | None], dict[str, float | str | None]]
            | None
        ) = None
        # Set by the job manager when an admin split the cluster (pools.py)
        self.pools: Pools | None = None
        # Replaced by the service when GPUSliceService.share_overcommit_ratio > 1
        self.overcommit = OvercommitHistory(OvercommitSettings())
        self.inventory_cache = InventoryCache()
        self.active_cache = ActiveCache()
        self.cluster_cache = ClusterCache()
        # A learning policy's state is shared by the event loop and the scheduler's thread.
        self._policy_lock = threading.Lock()
        # Held while history is pruned and while the pruned totals are read with the
        # events left (admin/history.py): the two are then one consistent state.
        self.history_lock = threading.Lock()
        self._quota_cache: tuple[int, Quotas] | None = None
        # per ledger state, then per set of pools counted in (None: all of them)
        self._capacity_cache: (
            tuple[tuple[int, Any], dict[frozenset[str] | None, dict[str, tuple[int, int]]]] | None
        ) = None
        # the pools with nothing held, per (inventory generation, drains ignored, pools)
        self._empty_cache: dict[
            tuple[int, bool, frozenset[str] | None], tuple[ClusterState | None]
        ] = {}
        self._totals_cache: (
            tuple[int, dict[tuple[frozenset[str] | None, bool], dict[str, int]]] | None
        ) = None

    def snapshot(self) -> tuple[tuple[HostView, ...], tuple[GPUView, ...], list[AllocationView]]:
        """Inventory and active allocations, read in one transaction."""
        with self.db.reading() as s:
            inv = self.inventory_cache.get(s)
            return inv.hosts, inv.gpus, self.active_cache.get(s)

    def access(
        self, purpose: str, groups: Iterable[str], priority: int = 0, may_borrow: bool = False
    ) -> Access | None:
        """The pools a request may use, in the order tried (None: the whole cluster)."""
        if self.pools is None:
            return None
        return self.pools.access(purpose, groups, priority, may_borrow)

    def _within(
        self,
        state: ClusterState,
        allowed: frozenset[str] | None,
        generation: int | None,
        keep: bool = False,
    ) -> ClusterState:
        """``state`` limited to the ``allowed`` pools (all of it for None). ``generation``:
        the inventory generation ``state`` was built from, for the pools' mask cache (None:
        a state of another layout, not cached). ``keep``: ``state`` is the ledger's own
        (``ClusterCache``), whose restricted copy is kept up to date between decisions."""
        if allowed is None or self.pools is None:
            return state
        return self.pools.restrict(state, allowed, generation, keep)

    def effective_quotas(self, s: Session) -> Quotas:
        """The configured quotas with the admins' runtime overrides applied.

        Overrides change the ledger generation, so they are read again only when it moves.
        """
        generation = self.inventory_cache.get(s).generation
        if self._quota_cache is None or self._quota_cache[0] != generation:
            rows = s.connection().execute(select(QuotaOverrideRow.__table__)).all()
            self._quota_cache = (generation, apply_overrides(self.quotas, rows))
        return self._quota_cache[1]

    def _gpus(self, s: Session) -> dict[str, GPUView]:
        return self.inventory_cache.get(s).by_uuid

    def _event(  # type: ignore[no-untyped-def]
        self,
        s: Session,
        kind,
        user,
        actor,
        allocation_id=None,
        profile=None,
        reason=None,
        detail=None,
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
        event_id = int(_INSERT_EVENT.execute(s.connection(), values).scalar_one())
        self.active_cache.wrote(s).events.append((event_id, allocation_id))
        return event_id


def quota_usage(profile: Profile, inv: InventoryView) -> Usage:
    """What one more slice of ``profile`` would count against a quota."""
    return Usage(
        profile.quota_weight, profile.request().total_gpu_milli or _mig_milli(profile, inv)
    )


def _mig_milli(profile: Profile, inv: InventoryView) -> int:
    """A MIG profile's compute share, from any instance of it in the inventory."""
    if profile.kind != "mig":
        return 0
    for g in inv.gpus:
        for m in g.mig_instances:
            if m.profile == profile.mig_profile:
                return m.milli
    return 0
