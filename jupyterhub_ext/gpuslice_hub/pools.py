"""Split pools: GPUs reserved for people, the rest for batch, and borrowing between them.

An admin reserves part of the cluster (``JobManager.reserved_pools``: hosts by name pattern,
or single GPUs by UUID; optionally for some groups only) for interactive servers and
``high`` batch jobs. Every GPU in no reserved pool is the *peak* pool, where every batch job
runs. Interactive servers take the reserved pool first and spill into the peak pool when it
is full, so batch keeps the peak pool free of people as long as it can.

Inside the borrowing window (``JobManager.reserved_pool_borrowing``, a named time window:
nights, weekends) ``preemptible`` jobs may also take idle reserved GPUs, after the peak pool.
They hold them preemptibly: a person who needs the slice preempts the borrower (checkpoint,
requeue) as for any preemptible job, and when the window closes the scheduler returns every
borrowed slice the same way, so the reserved pool is whole again when people arrive.

Which pool a GPU is in follows from the inventory each time (a host added later that matches
a pattern joins its pool); placement sees a request's allowed pools as a mask over the
placement arrays, so the same selection code places in any subset of the cluster.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from .errors import ConfigError
from .jobs.windows import TimeWindow
from .placement.state import ClusterState

KEY = "JobManager.reserved_pools"
PEAK = "peak"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")
_FIELDS = {"hosts", "gpus", "groups"}


@dataclass(frozen=True)
class ReservedPool:
    name: str
    hosts: tuple[str, ...]  # fnmatch patterns of host names: every GPU of those hosts
    gpus: frozenset[str]  # single GPUs by UUID
    groups: frozenset[str]  # empty: for everyone

    def holds(self, host: str, gpu_uuid: str) -> bool:
        return gpu_uuid in self.gpus or any(fnmatch.fnmatchcase(host, p) for p in self.hosts)

    def serves(self, groups: Iterable[str]) -> bool:
        return not self.groups or not self.groups.isdisjoint(groups)

    def describe(self) -> str:
        what = [*self.hosts, *(f"GPU {u}" for u in sorted(self.gpus))]
        who = f" for {', '.join(sorted(self.groups))}" if self.groups else ""
        return f"{', '.join(what)}{who}"


@dataclass(frozen=True)
class Access:
    """The pools one request may use, tried in order (each try a set of pool names, the
    peak pool as ``PEAK``). ``batch``: batch work (its refusals say where the reserved
    capacity is); ``high``: high-priority batch work, which the reserved pools of its
    groups serve."""

    tries: tuple[frozenset[str], ...]
    batch: bool = False
    high: bool = False

    @property
    def widest(self) -> frozenset[str]:
        return self.tries[-1]

    def within(self, only: frozenset[str]) -> Access | None:
        """The same request limited to the ``only`` pools (None: none of its pools left)."""
        tries = tuple(dict.fromkeys(t & only for t in self.tries if t & only))
        return Access(tries, self.batch, self.high) if tries else None


class Pools:
    def __init__(
        self,
        reserved: Mapping[str, ReservedPool],
        borrow_window: TimeWindow | None,
        reserved_priority: int,
    ) -> None:
        self.reserved = dict(reserved)
        self.borrow_window = borrow_window
        # batch work of at least this allocation priority is "high-priority work", which
        # the reserved pools serve as they serve people
        self.reserved_priority = reserved_priority
        self._masks: dict[tuple[int | None, frozenset[str]], np.ndarray] = {}
        # allowed pools -> (generation, the ledger's state, its restricted copy): restrict
        self._kept: dict[frozenset[str], tuple[int, ClusterState, ClusterState]] = {}

    # -- who may use what -----------------------------------------------------------------

    def pool_of(self, host: str, gpu_uuid: str) -> str:
        for pool in self.reserved.values():
            if pool.holds(host, gpu_uuid):
                return pool.name
        return PEAK

    def borrowing_open(self, now: datetime) -> bool:
        return self.borrow_window is not None and self.borrow_window.is_open(now)

    def entitled(self, groups: Iterable[str]) -> frozenset[str]:
        """The reserved pools that serve these groups' people and high-priority work."""
        groups = tuple(groups)
        return frozenset(p.name for p in self.reserved.values() if p.serves(groups))

    def access(
        self, purpose: str, groups: Iterable[str], priority: int, may_borrow: bool
    ) -> Access:
        """People: their reserved pools, then the peak pool. High-priority batch work: the
        peak pool, then the reserved pools that serve its groups (it is never returned, so
        it keeps out of people's way while batch capacity is free). Other batch work: the
        peak pool, then (``may_borrow``: a preemptible job inside the borrowing window)
        every reserved pool."""
        peak = frozenset({PEAK})
        if purpose == "interactive":
            own = self.entitled(groups)
            return Access((own, own | peak) if own else (peak,))
        if priority >= self.reserved_priority:
            own = self.entitled(groups)
            return Access((peak, own | peak) if own else (peak,), batch=True, high=True)
        if may_borrow and self.reserved:
            return Access((peak, peak | set(self.reserved)), batch=True)
        return Access((peak,), batch=True)

    def borrowed(self, groups: Iterable[str], priority: int, pools: Iterable[str]) -> set[str]:
        """Of ``pools`` (where a batch job's slices sit), the reserved ones it only borrows."""
        if priority >= self.reserved_priority:
            return set(pools) - {PEAK} - self.entitled(groups)
        return set(pools) - {PEAK}

    # -- the placement arrays -------------------------------------------------------------

    def mask(
        self, state: ClusterState, allowed: frozenset[str], generation: int | None
    ) -> np.ndarray:
        """bool[N, G]: the GPU slots of ``state`` in the ``allowed`` pools. Cached per
        inventory generation (the layout of the ledger's arrays changes only with it);
        ``generation`` None: not cached."""
        key = (generation, allowed)
        mask = self._masks.get(key) if generation is not None else None
        if mask is None or mask.shape != state.gpu_ok.shape:
            if len(self._masks) > 64:
                self._masks.clear()
            mask = np.zeros(state.gpu_ok.shape, bool)
            for r, (host, uuids) in enumerate(zip(state.names, state.gpu_uuids, strict=True)):
                for i, uuid in enumerate(uuids):
                    mask[r, i] = self.pool_of(host, uuid) in allowed
            if generation is not None:
                self._masks[key] = mask
        return mask

    def restrict(
        self,
        state: ClusterState,
        allowed: frozenset[str],
        generation: int | None,
        keep: bool = False,
    ) -> ClusterState:
        """``state`` with the GPUs outside ``allowed`` taken out (as a drained GPU is): a
        state of its own, so policies' score caches never mix the two.

        ``keep``: ``state`` is the ledger's (``ClusterCache``), kept from one decision to
        the next: so is its restricted copy, brought up to date in the rows whose version
        moved, and a policy's per-host scores (FGD) survive between decisions as they do
        on the whole cluster."""
        if allowed >= {PEAK, *self.reserved}:
            return state
        mask = self.mask(state, allowed, generation)
        if not keep or generation is None:
            return _restricted(state, mask)
        kept = self._kept.get(allowed)
        if kept is None or kept[0] != generation or kept[1] is not state:
            view = _restricted(state, mask)
            self._kept[allowed] = (generation, state, view)
            return view
        view = kept[2]
        rows = np.flatnonzero(state.version != view.version)
        if rows.size:
            assert state.mig_ok is not None and view.mig_ok is not None
            m = mask[rows]
            view.gpu_ok[rows] = state.gpu_ok[rows] & m
            view.gpu_free[rows] = np.where(m, state.gpu_free[rows], 0)
            view.mig_ok[rows] = state.mig_ok[rows] & m
            view.mig_free[rows] = state.mig_free[rows] * m[:, :, None]
            view.tags[rows] = state.tags[rows]
            view.version[rows] = state.version[rows]
        return view

    # -- start-up -------------------------------------------------------------------------

    def check_inventory(self, gpus: Iterable[tuple[str, str]]) -> None:
        """Refuse pools that reserve nothing or everything of the inventory's (host, GPU
        UUID) pairs, and every host pattern or GPU UUID that names no GPU of it (a typo
        would silently reserve less than the admin meant)."""
        pairs = list(gpus)
        uuids = {u for _, u in pairs}
        for pool in self.reserved.values():
            key = f"{KEY}.{pool.name}"
            for pattern in pool.hosts:
                if not any(fnmatch.fnmatchcase(h, pattern) for h, _ in pairs):
                    raise ConfigError(key, f"host pattern {pattern!r} matches no GPU host")
            for uuid in sorted(pool.gpus - uuids):
                raise ConfigError(
                    key, f"{uuid!r} is no GPU of the inventory (give whole GPUs' UUIDs)"
                )
        for h, u in pairs:
            holders = [p.name for p in self.reserved.values() if p.holds(h, u)]
            if len(holders) > 1:
                raise ConfigError(KEY, f"GPU {u} on {h} is in two pools: {', '.join(holders)}")
        if pairs and all(self.pool_of(h, u) != PEAK for h, u in pairs):
            raise ConfigError(KEY, "reserves every GPU: batch jobs (the peak pool) would get none")


def _restricted(state: ClusterState, mask: np.ndarray) -> ClusterState:
    """A copy of ``state`` without the GPU slots outside ``mask``; the arrays placement
    only reads per host (CPU, memory, models) are shared, the ledger rewrites them in place."""
    assert state.mig_ok is not None
    return replace(
        state,
        gpu_ok=state.gpu_ok & mask,
        gpu_free=np.where(mask, state.gpu_free, 0),
        mig_ok=state.mig_ok & mask,
        mig_free=state.mig_free * mask[:, :, None],
        version=state.version.copy(),
        tags=state.tags.copy(),
        cache={},
    )


def parse_pools(
    raw: Any, borrowing: str, windows: Mapping[str, TimeWindow], reserved_priority: int
) -> Pools | None:
    """``JobManager.reserved_pools`` and ``reserved_pool_borrowing``; None when no pool is
    set. Every mistake is a ConfigError naming the setting."""
    if not isinstance(raw, Mapping):
        raise ConfigError(KEY, f"must be a dict of name -> pool, got {type(raw).__name__}")
    pools = {}
    for name, spec in raw.items():
        if not isinstance(name, str) or not _NAME.match(name) or name == PEAK:
            raise ConfigError(
                KEY, f"{name!r}: a name of letters, digits, '.', '_' or '-' (not {PEAK!r})"
            )
        key = f"{KEY}.{name}"
        if not isinstance(spec, Mapping):
            raise ConfigError(key, 'must be a dict like {"hosts": ["gpu-a*"]}')
        unknown = sorted(set(spec) - _FIELDS)
        if unknown:
            raise ConfigError(key, f"unknown key {unknown[0]!r} (known: hosts, gpus, groups)")
        lists = {f: _strings(spec.get(f, []), f"{key}.{f}") for f in _FIELDS}
        if not lists["hosts"] and not lists["gpus"]:
            raise ConfigError(key, "reserves nothing: give hosts (name patterns) or gpus (UUIDs)")
        pools[name] = ReservedPool(
            name, tuple(lists["hosts"]), frozenset(lists["gpus"]), frozenset(lists["groups"])
        )
    window = None
    if borrowing:
        if not pools:
            raise ConfigError(
                "JobManager.reserved_pool_borrowing", "has nothing to borrow: no reserved_pools"
            )
        window = windows.get(borrowing)
        if window is None:
            known = ", ".join(sorted(windows)) or "none are set"
            raise ConfigError(
                "JobManager.reserved_pool_borrowing",
                f"{borrowing!r} is not a window of JobManager.time_windows ({known})",
            )
    return Pools(pools, window, reserved_priority) if pools else None


def check_borrowers_can_borrow(pools: Pools | None, preemptible_window: TimeWindow | None) -> None:
    """Refuse a borrowing window that preemptible jobs, limited to their class's time
    window, could never use: the two never open together in a week."""
    if pools is None or pools.borrow_window is None or preemptible_window is None:
        return
    borrow = pools.borrow_window
    start = datetime(2026, 1, 5, tzinfo=UTC)  # a Monday; minute by minute over a week
    for minute in range(7 * 24 * 60 + 1):
        at = start + timedelta(minutes=minute)
        if borrow.is_open(at) and preemptible_window.is_open(at):
            return
    raise ConfigError(
        "JobManager.reserved_pool_borrowing",
        f"{borrow.name!r} ({borrow.describe()}) never overlaps the time window preemptible "
        f"jobs run in ({preemptible_window.name!r}, {preemptible_window.describe()}): "
        "they could never borrow",
    )


def _strings(value: Any, key: str) -> list[str]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise ConfigError(key, f"must be a list of strings, got {value!r}")
    if not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(key, "must be a list of non-empty strings")
    return [v.strip() for v in value]
