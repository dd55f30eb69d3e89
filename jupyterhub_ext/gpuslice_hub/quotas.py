"""Quotas per user and per group, with borrowing of another group's idle quota.

A quota limits what one holder has *at once*: ``max_slices`` (each allocation counts its
profile's ``quota_weight``) and ``max_milli`` (GPU demand in milli-GPU). An allocation is
charged to one group: the first of the user's groups (by name) that has a quota with room;
failing that, a group listed in one of those groups' ``borrow_from`` whose unused quota
covers it. Users in no group with a quota are limited by their user quota alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigError


@dataclass(frozen=True)
class Limit:
    max_slices: float | None = None
    max_milli: int | None = None
    borrow_from: tuple[str, ...] = ()

    def room(self, used: Usage, want: Usage) -> bool:
        return not any(self._over(used, want))

    def _over(self, used: Usage, want: Usage) -> tuple[bool, bool]:
        """Whether ``want`` would take ``used`` past the slice limit, and the GPU limit.
        (Booleans: ``room`` is asked for every profile and group on every request.)"""
        slices = self.max_slices is not None and used.slices + want.slices > self.max_slices + 1e-9
        milli = self.max_milli is not None and used.milli + want.milli > self.max_milli
        return slices, milli

    @property
    def unbounded(self) -> bool:
        """Neither limit set (an admin's "no limit" override): it limits nothing."""
        return self.max_slices is None and self.max_milli is None

    def describe(self, used: Usage) -> str:
        if self.unbounded:
            return "no limit"
        parts = []
        if self.max_slices is not None:
            parts.append(f"{used.slices:g} of {_count(self.max_slices, 'slice')}")
        if self.max_milli is not None:
            parts.append(f"{used.milli / 1000:g} of {_count(self.max_milli / 1000, 'GPU')}")
        return " and ".join(parts) + " in use"

    def refusal(self, used: Usage, want: Usage) -> str:
        """What is held and what the request needs, in the terms of the limits it exceeds
        (a request larger than the whole quota must not read as a contradiction)."""
        slices, milli = self._over(used, want)
        wants = ((slices, _count(want.slices, "slice")), (milli, _count(want.milli / 1000, "GPU")))
        needs = [text for over, text in wants if over]
        return f"{self.describe(used)}; this needs {' and '.join(needs)}"

    def standing(self, used: Usage) -> dict[str, Any]:
        """This limit and what is held against it, for the people it limits."""
        return {
            "max_slices": self.max_slices,
            "max_milli": self.max_milli,
            "used_slices": round(used.slices, 3),
            "used_milli": used.milli,
            "text": self.describe(used),
        }


def _count(value: float, unit: str) -> str:
    return f"{value:g} {unit}" + ("" if value == 1 else "s")


@dataclass
class Usage:
    slices: float = 0.0
    milli: int = 0

    def add(self, other: Usage) -> None:
        self.slices += other.slices
        self.milli += other.milli


@dataclass(frozen=True)
class Holding:
    """One active allocation, as the quota check sees it."""

    user: str
    charged_group: str | None
    usage: Usage


@dataclass(frozen=True)
class Held:
    """What is held against quotas at one moment: by each user, and charged to each group.
    The ledger keeps it up to date as slices come and go (``snapshot.ActiveCache``): a
    check no longer sums every held slice (8 ms at 4 400 of them)."""

    users: Mapping[str, Usage] = field(default_factory=dict)
    groups: Mapping[str, Usage] = field(default_factory=dict)

    @classmethod
    def of(cls, holdings: Iterable[Holding]) -> Held:
        users: dict[str, Usage] = {}
        groups: dict[str, Usage] = {}
        for h in holdings:
            users.setdefault(h.user, Usage()).add(h.usage)
            if h.charged_group is not None:
                groups.setdefault(h.charged_group, Usage()).add(h.usage)
        return cls(users, groups)


@dataclass(frozen=True)
class Charge:
    group: str | None
    borrowed: bool = False


@dataclass(frozen=True)
class Quotas:
    default_user: Limit | None = None
    users: Mapping[str, Limit] = field(default_factory=dict)
    groups: Mapping[str, Limit] = field(default_factory=dict)

    @property
    def bounded(self) -> bool:
        """Whether any limit here could refuse a request: only then does what one user
        holds change the answer to another request."""
        limits = [self.default_user, *self.users.values(), *self.groups.values()]
        return any(limit is not None and not limit.unbounded for limit in limits)

    def check(self, user: str, groups: Iterable[str], want: Usage, held: Held) -> Charge | str:
        """The group to charge, or the reason the request is over quota."""
        by_user, by_group = held.users.get(user, Usage()), held.groups
        limit = self.users.get(user, self.default_user)
        if limit is not None and not limit.room(by_user, want):
            return f"over your quota ({limit.refusal(by_user, want)})"
        mine = sorted(g for g in set(groups) if g in self.groups)
        if not mine:
            return Charge(None)
        for g in mine:
            if self.groups[g].room(by_group.get(g, Usage()), want):
                return Charge(g)
        for g in mine:
            for lender in self.groups[g].borrow_from:
                if lender in self.groups and self.groups[lender].room(
                    by_group.get(lender, Usage()), want
                ):
                    return Charge(lender, borrowed=True)
        g = mine[0]
        held_by_group = by_group.get(g, Usage())
        return f"over the quota of group {g} ({self.groups[g].refusal(held_by_group, want)})"

    def standing(self, user: str, groups: Iterable[str], held: Held) -> list[dict[str, Any]]:
        """Every quota that limits *user* (their own, then their groups'), with its use."""
        by_user, by_group = held.users.get(user, Usage()), held.groups
        out = []
        limit = self.users.get(user, self.default_user)
        if limit is not None and not limit.unbounded:
            out.append({"scope": "user", "name": user, **limit.standing(by_user)})
        for g in sorted(set(groups) & set(self.groups)):
            if self.groups[g].unbounded:
                continue
            used = by_group.get(g, Usage())
            out.append({"scope": "group", "name": g, **self.groups[g].standing(used)})
        return out


def _limit(raw: Any, key: str, groups: bool) -> Limit:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"must be a dict, got {type(raw).__name__}")
    allowed = {"max_slices", "max_milli"} | ({"borrow_from"} if groups else set())
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(f"{key}.{sorted(unknown)[0]}", f"unknown key; known: {sorted(allowed)}")
    slices = raw.get("max_slices")
    if slices is not None and (
        isinstance(slices, bool) or not isinstance(slices, (int, float)) or slices < 0
    ):
        raise ConfigError(f"{key}.max_slices", f"must be a number >= 0, got {slices!r}")
    milli = raw.get("max_milli")
    if milli is not None and (isinstance(milli, bool) or not isinstance(milli, int) or milli < 0):
        raise ConfigError(f"{key}.max_milli", f"must be an integer >= 0 (milli-GPU), got {milli!r}")
    borrow = raw.get("borrow_from", [])
    if isinstance(borrow, str) or not isinstance(borrow, (list, tuple)):
        raise ConfigError(f"{key}.borrow_from", f"must be a list of group names, got {borrow!r}")
    return Limit(slices, milli, tuple(borrow))


def parse_quotas(raw: Any) -> Quotas:
    if not isinstance(raw, Mapping):
        raise ConfigError("quotas", f"must be a dict, got {type(raw).__name__}")
    unknown = set(raw) - {"default_user", "users", "groups"}
    if unknown:
        raise ConfigError(
            f"quotas.{sorted(unknown)[0]}",
            "unknown key; known: ['default_user', 'groups', 'users']",
        )
    default = raw.get("default_user")
    users_raw = raw.get("users", {})
    groups_raw = raw.get("groups", {})
    for k, v in (("users", users_raw), ("groups", groups_raw)):
        if not isinstance(v, Mapping):
            raise ConfigError(f"quotas.{k}", f"must be a dict of name -> limits, got {v!r}")
    groups = {g: _limit(v, f"quotas.groups.{g}", True) for g, v in groups_raw.items()}
    for g, lim in groups.items():
        for i, lender in enumerate(lim.borrow_from):
            if lender not in groups:
                raise ConfigError(
                    f"quotas.groups.{g}.borrow_from[{i}]",
                    f"group {lender!r} has no quota to borrow from",
                )
    return Quotas(
        default_user=_limit(default, "quotas.default_user", False) if default is not None else None,
        users={u: _limit(v, f"quotas.users.{u}", False) for u, v in users_raw.items()},
        groups=groups,
    )
