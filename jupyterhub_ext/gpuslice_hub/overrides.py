"""What admins change at runtime, kept in the ledger database: quota overrides and idle
exemptions. Each change is recorded as an event naming who made it and why.

A quota override replaces the configured limit of one user, one group (its ``borrow_from``
stays as configured) or of the default user quota, until it is removed; the config file
stays the baseline an admin can always go back to.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from gpuslice.isotime import iso

from .db.admin_models import IdleExemptionRow, QuotaOverrideRow
from .db.engine import Database
from .db.models import EventRow, utcnow
from .errors import Refused
from .quotas import Limit, Quotas
from .snapshot import bump_generation

SUBJECTS = ("user", "group", "default_user")
# Event kinds an admin's actions leave in the ledger; the panel's action log lists them.
ADMIN_EVENT_KINDS = (
    "quota-set",
    "quota-reset",
    "idle-exempted",
    "idle-unexempted",
    "gpu-drained",
    "gpu-undrained",
    "job-preempt-requested",
    "job-cancel-requested",
)


def apply_overrides(base: Quotas, rows: Iterable[Any]) -> Quotas:
    users = dict(base.users)
    groups = dict(base.groups)
    default = base.default_user
    for r in rows:
        if r.subject == "default_user":
            default = Limit(r.max_slices, r.max_milli)
        elif r.subject == "user":
            users[r.name] = Limit(r.max_slices, r.max_milli)
        elif r.subject == "group":
            old = groups.get(r.name)
            borrow = old.borrow_from if old is not None else ()
            groups[r.name] = Limit(r.max_slices, r.max_milli, borrow)
    return replace(base, default_user=default, users=users, groups=groups)


def limit_json(limit: Limit | None) -> dict[str, Any] | None:
    if limit is None:
        return None
    out: dict[str, Any] = {"max_slices": limit.max_slices, "max_milli": limit.max_milli}
    if limit.borrow_from:
        out["borrow_from"] = list(limit.borrow_from)
    return out


def quotas_json(q: Quotas) -> dict[str, Any]:
    return {
        "default_user": limit_json(q.default_user),
        "users": {u: limit_json(v) for u, v in sorted(q.users.items())},
        "groups": {g: limit_json(v) for g, v in sorted(q.groups.items())},
    }


# Far beyond any cluster, and small enough that every figure derived from them stays finite.
MAX_SLICES = 1_000_000
MAX_MILLI = 1_000_000_000


def parse_limit_body(body: Mapping[str, Any]) -> tuple[float | None, int | None]:
    """``max_slices`` (number >= 0 or null) and ``max_milli`` (integer >= 0 or null)."""
    slices = body.get("max_slices")
    if slices is not None and (
        isinstance(slices, bool)
        or not isinstance(slices, int | float)
        or not 0 <= slices <= MAX_SLICES
    ):
        raise Refused(
            "bad_request", f"field 'max_slices' must be a number from 0 to {MAX_SLICES} or null"
        )
    milli = body.get("max_milli")
    if milli is not None and (
        isinstance(milli, bool) or not isinstance(milli, int) or not 0 <= milli <= MAX_MILLI
    ):
        raise Refused(
            "bad_request",
            f"field 'max_milli' must be an integer from 0 to {MAX_MILLI} (milli-GPU) or null",
        )
    if "max_slices" not in body and "max_milli" not in body:
        raise Refused("bad_request", "give 'max_slices' and/or 'max_milli' (null: no limit)")
    return (None if slices is None else float(slices)), milli


def override_json(r: QuotaOverrideRow) -> dict[str, Any]:
    return {
        "subject": r.subject,
        "name": r.name,
        "max_slices": r.max_slices,
        "max_milli": r.max_milli,
        "set_by": r.set_by,
        "set_at": iso(r.set_at),
        "reason": r.reason,
    }


def exemption_json(r: IdleExemptionRow) -> dict[str, Any]:
    return {
        "user": r.user,
        "set_by": r.set_by,
        "set_at": iso(r.set_at),
        "expires_at": iso(r.expires_at),
        "reason": r.reason,
    }


class AdminSettings:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- quotas -----------------------------------------------------------------------------

    def overrides(self) -> list[dict[str, Any]]:
        with self.db.reading() as s:
            rows = s.scalars(
                select(QuotaOverrideRow).order_by(QuotaOverrideRow.subject, QuotaOverrideRow.name)
            )
            return [override_json(r) for r in rows]

    def set_quota(
        self,
        subject: str,
        name: str,
        max_slices: float | None,
        max_milli: int | None,
        actor: str,
        reason: str,
    ) -> dict[str, Any]:
        _check_subject(subject, name)
        with self.db.writing() as s:
            row = s.get(QuotaOverrideRow, (subject, name))
            if row is None:
                row = QuotaOverrideRow(subject=subject, name=name)
                s.add(row)
            row.max_slices, row.max_milli = max_slices, max_milli
            row.set_by, row.set_at, row.reason = actor, utcnow(), reason
            # The ledger caches its effective quotas per generation.
            bump_generation(s)
            detail = {"subject": subject, "name": name, "max_slices": max_slices}
            detail["max_milli"] = max_milli
            record_admin_event(
                s, "quota-set", name if subject == "user" else None, actor, reason, detail
            )
            s.flush()
            return override_json(row)

    def reset_quota(self, subject: str, name: str, actor: str, reason: str) -> bool:
        _check_subject(subject, name)
        with self.db.writing() as s:
            row = s.get(QuotaOverrideRow, (subject, name))
            if row is None:
                return False
            s.delete(row)
            bump_generation(s)
            detail = {"subject": subject, "name": name}
            record_admin_event(
                s, "quota-reset", name if subject == "user" else None, actor, reason, detail
            )
            return True

    # -- idle exemptions ---------------------------------------------------------------------

    def exemptions(self, now: datetime | None = None) -> list[dict[str, Any]]:
        now = now or utcnow()
        with self.db.reading() as s:
            rows = s.scalars(select(IdleExemptionRow).order_by(IdleExemptionRow.user))
            return [exemption_json(r) for r in rows if _live(r, now)]

    def exemption(self, user: str, now: datetime | None = None) -> dict[str, Any] | None:
        with self.db.reading() as s:
            row = s.get(IdleExemptionRow, user)
            return exemption_json(row) if row is not None and _live(row, now or utcnow()) else None

    def exempt(self, user: str, actor: str, reason: str, hours: float | None) -> dict[str, Any]:
        now = utcnow()
        with self.db.writing() as s:
            row = s.get(IdleExemptionRow, user)
            if row is None:
                row = IdleExemptionRow(user=user)
                s.add(row)
            row.set_by, row.set_at, row.reason = actor, now, reason
            row.expires_at = now + timedelta(hours=hours) if hours else None
            detail = {"expires_at": iso(row.expires_at)}
            record_admin_event(s, "idle-exempted", user, actor, reason, detail)
            s.flush()
            return exemption_json(row)

    def unexempt(self, user: str, actor: str, reason: str) -> bool:
        with self.db.writing() as s:
            gone = s.execute(delete(IdleExemptionRow).where(IdleExemptionRow.user == user))
            if not gone.rowcount:  # type: ignore[attr-defined]
                return False
            record_admin_event(s, "idle-unexempted", user, actor, reason, {})
            return True


def _live(row: IdleExemptionRow, now: datetime) -> bool:
    expires = row.expires_at
    return expires is None or expires > now


def _check_subject(subject: str, name: str) -> None:
    if subject not in SUBJECTS:
        raise Refused(
            "not_found", f"quota subject must be one of {list(SUBJECTS)}, not {subject!r}"
        )
    if (subject == "default_user") != (name == ""):
        raise Refused(
            "bad_request", "the default user quota has no name; users and groups need one"
        )
    if len(name) > 255:
        raise Refused("bad_request", "name too long (255 characters at most)")


def record_admin_event(
    s: Session, kind: str, user: str | None, actor: str, reason: str, detail: dict[str, Any]
) -> None:
    """Record an admin action in the transaction that carries it out (both or neither)."""
    s.add(
        EventRow(
            ts=utcnow(), kind=kind, user=user, actor=actor, reason=reason or None, detail=detail
        )
    )
