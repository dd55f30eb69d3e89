"""Plain, immutable views of the ledger for the hot path.

Loading ORM objects for every GPU on every request dominated the cost of an allocation.
The inventory changes rarely (discovery, drains), so it is cached per *generation*: every
inventory write bumps ``ledger_lock.generation`` inside its transaction, and readers reload
only when the number they read differs. Active allocations are read with two Core queries
into plain objects. Attribute names match the ORM rows, so serializers take either.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import threading
from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import bindparam, func, select, update
from sqlalchemy.engine import Result
from sqlalchemy.orm import Session

from .db.engine import after_commit
from .db.lean import Lean, LeanResult
from .db.loopguard import WouldWait, hold, not_on_loop
from .db.models import AllocationRow, ClaimRow, EventRow, GPURow, HostRow, LedgerLock, MigRow
from .quotas import Held, Usage

_V = TypeVar("_V")


@dataclass(frozen=True)
class HostView:
    name: str
    cpu_milli: int
    memory_mib: int
    present: bool
    # why the engine runs no new work here now (HostRow.engine_out); None: it does
    engine_out: str | None = None


@dataclass(frozen=True)
class MigView:
    uuid: str
    gpu_uuid: str
    profile: str
    memory_mib: int
    milli: int
    present: bool


@dataclass(frozen=True)
class GPUView:
    uuid: str
    host: str
    index: int
    model: str
    memory_mib: int
    mig_mode: str
    present: bool
    drained: bool
    mig_instances: tuple[MigView, ...]


@dataclass(frozen=True)
class InventoryView:
    generation: int
    hosts: tuple[HostView, ...]
    gpus: tuple[GPUView, ...]
    by_uuid: dict[str, GPUView]


@dataclass
class ClaimView:
    id: int
    allocation_id: int
    gpu_uuid: str
    mig_uuid: str | None
    milli: int
    memory_mib: int
    exclusive_key: str | None
    active: bool
    charged_milli: int | None = None
    charged_memory_mib: int | None = None


def taken(claim: Any) -> tuple[int, int]:
    """What a claim (a view or a row) takes of its GPU: its milli-GPU and memory, less than
    its nominal share when overcommitted (``overcommit.py``)."""
    milli = claim.milli if claim.charged_milli is None else claim.charged_milli
    memory = claim.memory_mib if claim.charged_memory_mib is None else claim.charged_memory_mib
    return milli, memory


@dataclass
class AllocationView:
    id: int
    user: str
    server_name: str
    profile: str
    kind: str
    purpose: str
    priority: int
    preemptible: bool
    host: str
    groups: list[str]
    charged_group: str | None
    borrowed: bool
    quota_weight: float
    gpu_milli: int
    cpu_milli: int
    memory_mib: int
    active: bool
    created_at: datetime
    released_at: datetime | None
    release_reason: str | None
    claims: list[ClaimView] = field(default_factory=list)


# Where a session keeps the generation it read: one read per transaction, not one per
# cache asked (an allocation asked three times, each a statement as dear as its insert).
_GENERATION_READ = "gpuslice.generation"


def bump_generation(s: Session) -> None:
    """Call inside any transaction that changes hosts, GPUs or MIG instances."""
    s.connection().execute(
        update(LedgerLock).where(LedgerLock.id == 1).values(generation=LedgerLock.generation + 1)
    )
    s.info.pop(_GENERATION_READ, None)  # read again: this transaction moved it


# Statements of the allocation hot path, built once: building a statement (coercing its
# clauses, computing its cache key) cost about as much as running it on SQLite.
_GENERATION = Lean(select(LedgerLock.generation).where(LedgerLock.id == 1))
NEWEST_EVENT = Lean(select(func.max(EventRow.id)))
_NAMED_SINCE = Lean(
    select(EventRow.allocation_id)
    .where(
        EventRow.id > bindparam("since"),
        EventRow.id <= bindparam("marker"),
        EventRow.allocation_id.is_not(None),
    )
    .distinct()
)
_ALLOCATION = Lean(select(AllocationRow.__table__).where(AllocationRow.id == bindparam("id")))
_ITS_CLAIMS = Lean(
    select(ClaimRow.__table__)
    .where(ClaimRow.allocation_id == bindparam("id"))
    .order_by(ClaimRow.id)
)
_ALLOCATIONS_IN = select(AllocationRow.__table__).where(
    AllocationRow.id.in_(bindparam("ids", expanding=True))
)
_ACTIVE_CLAIMS_IN = (
    select(ClaimRow.__table__)
    .where(ClaimRow.allocation_id.in_(bindparam("ids", expanding=True)), ClaimRow.active)
    .order_by(ClaimRow.id)
)


def current_generation(s: Session) -> int:
    """The inventory's generation, read once per transaction (a session holds one) and
    again after the transaction's own bump. A write holds the ledger lock and SQLite's
    reads a snapshot, so it cannot move under them; a PostgreSQL read (read committed,
    no lock) may then see newer rows under the generation it read first, which costs a
    reload at the next look, never an older view under a newer number."""
    generation = s.info.get(_GENERATION_READ)
    if generation is None:
        generation = int(_GENERATION.execute(s.connection()).scalar() or 0)
        s.info[_GENERATION_READ] = generation
    return int(generation)


def load_inventory(s: Session, generation: int) -> InventoryView:
    hosts = tuple(
        HostView(r.name, r.cpu_milli, r.memory_mib, r.present, r.engine_out)
        for r in s.connection().execute(select(HostRow.__table__)).all()
    )
    migs: dict[str, list[MigView]] = defaultdict(list)
    for r in s.connection().execute(select(MigRow.__table__).order_by(MigRow.uuid)).all():
        migs[r.gpu_uuid].append(
            MigView(r.uuid, r.gpu_uuid, r.profile, r.memory_mib, r.milli, r.present)
        )
    gpus = tuple(
        GPUView(
            r.uuid,
            r.host,
            r._mapping["index"],
            r.model,
            r.memory_mib,
            r.mig_mode,
            r.present,
            r.drained,
            tuple(migs.get(r.uuid, ())),
        )
        for r in s.connection().execute(select(GPURow.__table__)).all()
    )
    return InventoryView(generation, hosts, gpus, {g.uuid: g for g in gpus})


def _views(cls: type[_V], result: Result[Any] | LeanResult) -> list[_V]:
    """One ``cls`` per row, by column name. (``Row._asdict`` builds the row's key map
    again for every row: a third of a full read of 4 400 allocations went there.)"""
    keys = tuple(result.keys())
    return [cls(**dict(zip(keys, row, strict=True))) for row in result]


def load_active(s: Session) -> list[AllocationView]:
    conn = s.connection()
    allocs = {
        a.id: a
        for a in _views(
            AllocationView,
            conn.execute(select(AllocationRow.__table__).where(AllocationRow.active)),
        )
    }
    for c in _views(ClaimView, conn.execute(select(ClaimRow.__table__).where(ClaimRow.active))):
        alloc = allocs.get(c.allocation_id)
        if alloc is not None:
            alloc.claims.append(c)
    return list(allocs.values())


def load_allocation(s: Session, alloc_id: int) -> AllocationView | None:
    conn = s.connection()
    found = _views(AllocationView, _ALLOCATION.execute(conn, {"id": alloc_id}))
    if not found:
        return None
    view = found[0]
    view.claims = _views(ClaimView, _ITS_CLAIMS.execute(conn, {"id": alloc_id}))
    return view


def load_allocations(s: Session, ids: Sequence[int]) -> dict[int, AllocationView]:
    """The allocations ``ids`` (active or not) with their active claims."""
    views: dict[int, AllocationView] = {}
    conn = s.connection()
    for start in range(0, len(ids), 500):  # bounded IN lists
        chunk = {"ids": list(ids[start : start + 500])}
        for a in _views(AllocationView, conn.execute(_ALLOCATIONS_IN, chunk)):
            views[a.id] = a
        for c in _views(ClaimView, conn.execute(_ACTIVE_CLAIMS_IN, chunk)):
            view = views.get(c.allocation_id)
            if view is not None:
                view.claims.append(c)
    return views


class _HeldIndex:
    """What the active allocations hold against quotas, by user and by charged group,
    kept as they come and go. A total is replaced, never changed in place, so a snapshot
    (a copy of the two dicts) stays as it was; a key leaves with its last holding, which
    also drops the rounding a float sum gathers."""

    def __init__(self) -> None:
        self.users: dict[str, Usage] = {}
        self.groups: dict[str, Usage] = {}
        # holdings behind each total (a snapshot copies the totals alone, in one C call:
        # an allocation's quota check takes one, with hundreds of users holding slices)
        self._counts: dict[tuple[bool, str], int] = {}
        # the last snapshot, handed out again until a total changes: a pass tries a
        # queue's shapes one after the other against the same state
        self._snapshot: Held | None = None

    def add(self, view: AllocationView) -> None:
        self._change(view, 1)

    def remove(self, view: AllocationView) -> None:
        self._change(view, -1)

    def _change(self, view: AllocationView, sign: int) -> None:
        if view.purpose == "external":
            return  # held by the engine outside gpuslice: counts against nobody
        self._snapshot = None
        for group, totals, key in (
            (False, self.users, view.user),
            (True, self.groups, view.charged_group),
        ):
            if key is None:
                continue
            count = self._counts.get((group, key), 0) + sign
            if count <= 0:
                totals.pop(key, None)
                self._counts.pop((group, key), None)
                continue
            self._counts[group, key] = count
            used = totals.get(key, Usage())
            totals[key] = Usage(
                used.slices + sign * view.quota_weight, used.milli + sign * view.gpu_milli
            )

    def snapshot(self) -> Held:
        """The totals now: read only, shared by every caller until they change."""
        if self._snapshot is None:
            self._snapshot = Held(dict(self.users), dict(self.groups))
        return self._snapshot


_OWN_WRITES = "gpuslice.own_writes"


@dataclass
class OwnWrites:
    """One write transaction's allocation changes, as its writer knows them: the events it
    recorded (id, allocation named) and the state it left each allocation in (None: no
    longer held). Views put here are never modified afterwards."""

    events: list[tuple[int, int | None]] = field(default_factory=list)
    states: dict[int, AllocationView | None] = field(default_factory=dict)


@dataclass(frozen=True)
class ActiveState:
    """The active allocations as of one state of an :class:`ActiveCache`: their views by
    id (the views are shared and never modified), and the state's ``mark``, which
    :meth:`ActiveCache.changed_between` compares. One state, its dict included, is handed
    to every caller until the cache changes (a pass tries a queue's shapes against the
    same one, and a copy each was hundreds of views), so nobody may modify ``views``."""

    views: dict[int, AllocationView]  # (shared by the callers of one state: read only)
    mark: tuple[int, int]  # (the cache's read count, its change count)
    source: ActiveCache


class ActiveCache:
    """The active allocations, brought up to date from the events recorded since.

    Every write that changes an allocation (allocate, release) records an event naming it,
    in its transaction and under the ledger lock, so events commit in id order and the
    newest event id marks a state. When it moved, only the allocations named by the newer
    events are read again (a spawn no longer rereads thousands of held slices). The marker
    is read before anything else: a write that lands in between makes the cache look older
    than it is, never newer, and reading an allocation again is harmless. Callers get their
    own list; the views in it are shared and never modified. Safe to call from several
    threads (the event loop and the scheduler's worker).
    """

    # Past this many new events a full read is as cheap as following them.
    FULL_READ_AFTER = 2000
    # A short write on the event loop follows at most this many (db/loopguard.py).
    LOOP_FOLLOWS = 100
    # How many changes ``changed_between`` can tell back (more: the caller compares all)
    JOURNAL = 4096

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._marker: int | None = None
        self._views: dict[int, AllocationView] = {}
        self._held = _HeldIndex()
        self.full_reads = 0  # for tests and benchmarks: how often everything was read
        self.read_back = 0  # ... and how many allocations were read again after an event
        # Every change of a view, numbered (the change count), so that a follower (the
        # placement arrays: ClusterCache) learns which allocations changed between two
        # states without comparing thousands of views: (change number, allocation id), the
        # numbers after ``_journal_from`` all there. A full read starts a new journal.
        self._changes = 0
        self._journal: list[tuple[int, int]] = []
        self._journal_from = 0
        self._state: ActiveState | None = None  # the last state handed out (_as_state)

    def get(self, s: Session) -> list[AllocationView]:
        with self._up_to_date(s):
            return list(self._views.values())

    def state(self, s: Session) -> ActiveState:
        """The views by id, and the mark of this state, brought up to date in ``s``."""
        with self._up_to_date(s):
            return self._as_state()

    def state_kept(self) -> ActiveState:
        """The views as the last look (or this process's own writes since) left them,
        without a database read: a state the ledger was in, maybe not the newest."""
        with hold(self._lock):
            return self._as_state()

    def _as_state(self) -> ActiveState:
        """The views now, as a state (the lock held): the one handed out last, while
        nothing changed since."""
        state = self._state
        if state is None:
            state = self._state = ActiveState(
                dict(self._views), (self.full_reads, self._changes), self
            )
        return state

    def catch_up(self, s: Session, marker: int | None = None) -> None:
        """Bring the views up to what ``s`` reads (for ``state_kept`` after it).
        ``marker``: the newest event id, read in ``s`` before (a write since then is seen
        by the next look, as with any marker read first)."""
        with self._up_to_date(s, marker):
            pass

    def changed_between(self, a: tuple[int, int], b: tuple[int, int]) -> set[int] | None:
        """The ids of the allocations whose views changed between the states marked ``a``
        and ``b`` (either may be the older); None when that is no longer known (a full
        read since, or more changes than the journal keeps)."""
        with hold(self._lock):
            if a[0] != b[0] or a[0] != self.full_reads:
                return None
            low, high = sorted((a[1], b[1]))
            if low < self._journal_from:
                return None
            start = bisect.bisect_right(self._journal, (low, math.inf))
            end = bisect.bisect_right(self._journal, (high, math.inf))
            return {alloc_id for _, alloc_id in self._journal[start:end]}

    def held(self, s: Session | None = None) -> Held:
        """What the active allocations hold against quotas, brought up to date in ``s``;
        without ``s``, as the last look left them (or a newer state's): for a caller that
        has just called ``get`` under the ledger lock, where nothing could change since."""
        if s is None:
            with hold(self._lock):
                return self._held.snapshot()
        with self._up_to_date(s):
            return self._held.snapshot()

    @contextlib.contextmanager
    def _up_to_date(self, s: Session, marker: int | None = None) -> Iterator[None]:
        """Holding the lock, with the views caught up with what ``s`` can read (up to
        ``marker``, the newest event id, when the caller read it)."""
        if marker is None:
            marker = int(NEWEST_EVENT.execute(s.connection()).scalar() or 0)
        with hold(self._lock):
            # A reader whose transaction began before the newest write asks for an older
            # state: it gets the newer one (never older than what it could read).
            if self._marker is None or marker > self._marker:
                self._catch_up(s, marker)
            yield

    def _put(self, alloc_id: int, view: AllocationView | None, journal: bool = True) -> None:
        """The allocation's new state (None or inactive: no longer held). ``journal``:
        number the change (a full read starts a new journal instead)."""
        self._state = None
        was = self._views.pop(alloc_id, None)
        if was is not None:
            self._held.remove(was)
        if view is not None and view.active:
            self._views[alloc_id] = view
            self._held.add(view)
        if not journal:
            return
        self._changes += 1
        self._journal.append((self._changes, alloc_id))
        if len(self._journal) > 2 * self.JOURNAL:
            self._journal_from = self._journal[-self.JOURNAL - 1][0]
            del self._journal[: -self.JOURNAL]

    def wrote(self, s: Session) -> OwnWrites:
        """What ``s``'s write transaction records of its own allocation changes; once it
        has committed, the cache follows them without reading them back (``_follow_own``).
        """
        own = s.info.get(_OWN_WRITES)
        if own is None:
            own = s.info[_OWN_WRITES] = OwnWrites()
            after_commit(s, lambda: self._follow_own(own))
        return own

    def _follow_own(self, own: OwnWrites) -> None:
        """After this process committed ``own``: when its events are exactly the ones that
        follow the marker, and it holds the new state of every allocation they name, the
        cache takes those states and moves the marker past them. Otherwise (another
        process's event in between, an event whose allocation it did not record) it does
        nothing, and the next ``get`` reads the change back as it always did."""
        try:
            with hold(self._lock):
                try:
                    self._take_own(own)
                except BaseException:
                    self._marker = None  # taken part of the way: read everything next time
                    raise
        except WouldWait:
            pass  # (on the loop, the cache busy: the next look reads the change back)

    def _take_own(self, own: OwnWrites) -> None:
        if self._marker is None or not own.events:
            return
        first = self._marker + 1
        ids = [event_id for event_id, _ in own.events]
        if ids != list(range(first, first + len(ids))):
            return
        if any(a is not None and a not in own.states for _, a in own.events):
            return
        for alloc_id, view in own.states.items():
            self._put(alloc_id, view)
        self._marker = ids[-1]

    def _catch_up(self, s: Session, marker: int) -> None:
        since = self._marker
        if since is None or marker - since > self.LOOP_FOLLOWS:
            not_on_loop("reading the active allocations back")
        if since is None or marker - since > self.FULL_READ_AFTER:
            self._marker = None  # a failure below leaves nothing half-read behind
            self._views, self._held, self._state = {}, _HeldIndex(), None
            # a new journal: a follower of the old one starts again from the views
            self.full_reads += 1
            for v in load_active(s):
                self._put(v.id, v, journal=False)
            self._journal, self._journal_from = [], self._changes
        else:
            named: list[int] = [
                int(alloc_id)
                for alloc_id in _NAMED_SINCE.execute(
                    s.connection(), {"since": since, "marker": marker}
                ).scalars()
                if alloc_id is not None
            ]
            fresh = load_allocations(s, named)
            self.read_back += len(named)
            for alloc_id in named:
                self._put(alloc_id, fresh.get(alloc_id))
        self._marker = marker


class InventoryCache:
    """The newest inventory view, reloaded when the generation in the database moves."""

    def __init__(self) -> None:
        self._view: InventoryView | None = None

    def kept(self) -> InventoryView | None:
        """The view as the last ``get`` left it (None before the first)."""
        return self._view

    def get(self, s: Session) -> InventoryView:
        generation = current_generation(s)
        if self._view is None or self._view.generation != generation:
            not_on_loop("reading a new inventory")
            self._view = load_inventory(s, generation)
        return self._view
