"""The idle policy that applies to one user's server on one profile: the admin's
``idle_policy`` (defaults, per-profile overrides, exemptions from config) over the profile's
own ``idle_timeout``, and any exemption set in the admin panel. The single-user server
applies it (``GET api/idle-policy``) and the spawn form announces it, so both say the same."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from gpuslice.idle_policy import IdlePolicy, PolicyConfig

from . import clock
from .profiles import Profile


def effective_policy(
    config: PolicyConfig,
    profiles: Mapping[str, Profile],
    user: str,
    groups: Iterable[str],
    profile: str | None,
    exemption: Mapping[str, Any] | None,
) -> IdlePolicy:
    """``exemption``: the user's exemption from the admin panel (``AdminSettings.exemption``),
    or None."""
    parsed = profiles.get(profile) if profile else None
    policy = config.resolve(user, groups, profile, parsed.idle_timeout if parsed else None)
    if parsed is not None and policy.exempt_reason == f"profile {profile} is exempt":
        # said to the researcher (spawn form, lab): the profile as the spawn form names it
        policy = replace(policy, exempt_reason=f"profile {parsed.display_name} is exempt")
    if exemption is not None and not policy.exempt:
        until = f" until {exemption['expires_at']}" if exemption["expires_at"] else ""
        why = f"exempted by {exemption['set_by']}{until}: {exemption['reason']}"
        policy = replace(policy, exempt=True, exempt_reason=why)
    return policy


def announced(policy: IdlePolicy) -> dict[str, Any]:
    """What the spawn form shows of a policy (``ProfileAvailability.idle`` in the API)."""
    return {
        "timeout": 0 if policy.exempt else policy.idle_timeout,
        "action": policy.action,
        "exempt": policy.exempt,
        "exempt_reason": policy.exempt_reason or None,
    }


def allocation_age(alloc: Mapping[str, Any]) -> float:
    """Seconds since an allocation (as the API serves it) was made: an upper bound of any
    idle time reported about it."""
    # serialize.iso writes every timestamp as UTC with a "Z"
    created = datetime.fromisoformat(str(alloc["created_at"]).replace("Z", "+00:00"))
    return max(0.0, (clock.now() - created).total_seconds())


def reclaim_record(
    alloc: Mapping[str, Any], idle_seconds: float, voluntary: bool
) -> tuple[str, dict[str, Any]]:
    """The event (kind, detail) recording that a server's slice is given back: culled for
    idleness after ``idle_seconds`` (bounded by the slice's age), or released by its owner
    (``voluntary``: nothing reclaimed). The admin panel's reclaimed GPU-hours add up the
    details' ``reclaimed_gpu_hours``."""
    idle = min(float(idle_seconds), allocation_age(alloc))
    gpu_hours = 0.0 if voluntary else alloc["gpu_milli"] / 1000 * idle / 3600
    detail = {
        "allocation_id": alloc["id"],
        "profile": alloc["profile"],
        "server_name": alloc["server_name"],
        "scope": "server",
        "idle_seconds": idle,
        "gpu_milli": alloc["gpu_milli"],
        # The GPU share times the idle time that ended with the cull.
        "reclaimed_gpu_hours": gpu_hours,
    }
    return ("release-requested" if voluntary else "idle-culled"), detail
