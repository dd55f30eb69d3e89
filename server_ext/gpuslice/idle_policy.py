"""The idle policy: what happens to a session idle on its GPU, and who is exempt.

Pure data and validation, shared by the hub service (which serves the admin's policy) and
the server extension (which applies it, and falls back to its own traits when the service
cannot be reached).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import ConfigError

ACTIONS = ("kernel", "server")
_NUMBERS = ("idle_timeout", "warning_lead", "max_extension")
_PER_PROFILE_KEYS = {"action", *_NUMBERS}
CONFIG_KEYS = {
    *_PER_PROFILE_KEYS,
    "profiles",
    "exempt_users",
    "exempt_groups",
    "exempt_profiles",
}


class PolicyError(ConfigError):
    """Malformed idle policy; ``key`` names the offending setting (``profiles.gpu-1.action``).
    The service prefixes it with ``idle_policy.``."""


@dataclass(frozen=True)
class IdlePolicy:
    # "kernel": shut down the idle kernel (frees its GPU memory); "server": stop the whole
    # server through the service once every kernel is past its deadline (frees the slice).
    action: str = "kernel"
    idle_timeout: float = 3600.0  # seconds of GPU idleness before the cull; 0: never
    warning_lead: float = 300.0  # the warning comes this long before the cull
    max_extension: float = 14400.0  # keep-alive may add at most this much to one idle run
    exempt: bool = False
    exempt_reason: str = ""

    @property
    def enabled(self) -> bool:
        return not self.exempt and self.idle_timeout > 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any], key: str = "policy") -> IdlePolicy:
        """Validate a policy as the service sends it."""
        if not isinstance(data, Mapping):
            raise PolicyError(key, "must be an object")
        unknown = set(data) - {*_PER_PROFILE_KEYS, "exempt", "exempt_reason"}
        if unknown:
            raise PolicyError(f"{key}.{sorted(unknown)[0]}", "unknown key")
        fields = _check_fields(data, key)
        exempt = data.get("exempt", False)
        if not isinstance(exempt, bool):
            raise PolicyError(f"{key}.exempt", "must be true or false")
        reason = data.get("exempt_reason", "")
        if not isinstance(reason, str):
            raise PolicyError(f"{key}.exempt_reason", "must be a string")
        return replace(cls(), **fields, exempt=exempt, exempt_reason=reason)


def _check_fields(data: Mapping[str, Any], key: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "action" in data:
        if data["action"] not in ACTIONS:
            raise PolicyError(f"{key}.action", f"must be one of {list(ACTIONS)}")
        out["action"] = data["action"]
    for name in _NUMBERS:
        if name in data:
            value = data[name]
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise PolicyError(f"{key}.{name}", "must be a number of seconds >= 0")
            out[name] = float(value)
    return out


def _names(data: Mapping[str, Any], name: str, key: str) -> frozenset[str]:
    value = data.get(name, [])
    if not isinstance(value, list | tuple | set | frozenset) or not all(
        isinstance(v, str) for v in value
    ):
        raise PolicyError(f"{key}.{name}", "must be a list of names")
    return frozenset(value)


@dataclass(frozen=True)
class PolicyConfig:
    """The admin's policy: defaults, per-profile overrides, exemptions."""

    defaults: dict[str, Any]
    profiles: dict[str, dict[str, Any]]
    exempt_users: frozenset[str] = frozenset()
    exempt_groups: frozenset[str] = frozenset()
    exempt_profiles: frozenset[str] = frozenset()

    @classmethod
    def parse(cls, data: Mapping[str, Any], key: str = "idle_policy") -> PolicyConfig:
        if not isinstance(data, Mapping):
            raise PolicyError(key, "must be a dict")
        unknown = set(data) - CONFIG_KEYS
        if unknown:
            raise PolicyError(
                f"{key}.{sorted(unknown)[0]}", f"unknown key; allowed: {sorted(CONFIG_KEYS)}"
            )
        defaults = _check_fields(data, key)
        profiles: dict[str, dict[str, Any]] = {}
        raw_profiles = data.get("profiles", {})
        if not isinstance(raw_profiles, Mapping):
            raise PolicyError(f"{key}.profiles", "must be a dict of profile name → overrides")
        for name, overrides in raw_profiles.items():
            pkey = f"{key}.profiles.{name}"
            if not isinstance(overrides, Mapping):
                raise PolicyError(pkey, "must be a dict")
            bad = set(overrides) - _PER_PROFILE_KEYS
            if bad:
                raise PolicyError(
                    f"{pkey}.{sorted(bad)[0]}",
                    f"unknown key; allowed: {sorted(_PER_PROFILE_KEYS)}",
                )
            profiles[str(name)] = _check_fields(overrides, pkey)
        exempt = {
            k: _names(data, k, key) for k in ("exempt_users", "exempt_groups", "exempt_profiles")
        }
        config = cls(defaults, profiles, **exempt)
        for name in [None, *profiles]:
            merged = {**defaults, **(profiles[name] if name else {})}
            lead, timeout = merged.get("warning_lead"), merged.get("idle_timeout")
            if lead is not None and timeout and lead >= timeout:
                where = f"{key}.profiles.{name}" if name else key
                raise PolicyError(
                    f"{where}.warning_lead",
                    f"must be shorter than idle_timeout ({lead:g} >= {timeout:g})",
                )
        return config

    def resolve(
        self,
        user: str,
        groups: Iterable[str],
        profile: str | None,
        profile_timeout: float | None = None,
    ) -> IdlePolicy:
        """The policy for one user's server. *profile_timeout* is the profile's own
        ``idle_timeout`` (from the profile list); a per-profile override here wins over it."""
        fields = dict(self.defaults)
        if profile_timeout is not None:
            fields["idle_timeout"] = float(profile_timeout)
        if profile is not None:
            fields.update(self.profiles.get(profile, {}))
        policy = replace(IdlePolicy(), **fields)
        if policy.idle_timeout and policy.warning_lead >= policy.idle_timeout:
            # A profile's own short timeout under the default lead: warn halfway instead.
            policy = replace(policy, warning_lead=policy.idle_timeout / 2)
        groups = set(groups)
        if user and user in self.exempt_users:
            return replace(policy, exempt=True, exempt_reason=f"user {user} is exempt")
        hit = sorted(groups & self.exempt_groups)
        if hit:
            return replace(policy, exempt=True, exempt_reason=f"group {hit[0]} is exempt")
        if profile is not None and profile in self.exempt_profiles:
            return replace(policy, exempt=True, exempt_reason=f"profile {profile} is exempt")
        return policy
