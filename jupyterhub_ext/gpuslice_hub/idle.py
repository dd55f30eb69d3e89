"""The idle policy that applies to one user's server on one profile: the admin's
``idle_policy`` (defaults, per-profile overrides, exemptions from config) over the profile's
own ``idle_timeout``, and any exemption set in the admin panel. The single-user server
applies it (``GET api/idle-policy``) and the spawn form announces it, so both say the same."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from gpuslice.idle_policy import IdlePolicy, PolicyConfig

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
