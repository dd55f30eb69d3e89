"""Profiles: what an admin lets users ask for, parsed and validated from plain config."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuslice.gpu.profiles import parse_mig_profile

from .errors import ConfigError
from .placement import Request

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
NAME_MAX = 255  # the ledger's column


def is_profile_name(value: object) -> bool:
    """Whether ``value`` could name a profile (whether one is configured is another matter)."""
    return isinstance(value, str) and len(value) <= NAME_MAX and bool(_NAME.match(value))


KINDS = ("mig", "share", "gpu")

_ALLOWED_KEYS = {
    "name",
    "display_name",
    "description",
    "kind",
    "mig_profile",
    "gpu_milli",
    "gpu_memory_mib",
    "count",
    "models",
    "cpu_milli",
    "memory_mib",
    "idle_timeout",
    "groups",
    "quota_weight",
    "preempt_batch",
}


@dataclass(frozen=True)
class Profile:
    name: str
    display_name: str
    description: str
    kind: str  # "mig" | "share" | "gpu"
    mig_profile: str = ""
    gpu_milli: int = 0
    gpu_memory_mib: int = 0
    count: int = 1
    models: tuple[str, ...] = ()
    cpu_milli: int = 0
    memory_mib: int = 0
    idle_timeout: int = 3600  # seconds; 0 disables idle reclaim for this profile
    groups: tuple[str, ...] = ()  # empty: everyone may use it
    quota_weight: float = 1.0
    # May an interactive spawn of this profile preempt a preemptible batch job?
    preempt_batch: bool = True

    def allowed_for(self, groups: Iterable[str]) -> bool:
        return not self.groups or bool(set(self.groups) & set(groups))

    def request(self) -> Request:
        return Request(
            kind=self.kind,  # type: ignore[arg-type]
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            gpu_milli=self.gpu_milli if self.kind == "share" else 0,
            gpu_memory_mib=self.gpu_memory_mib if self.kind == "share" else 0,
            count=self.count if self.kind == "gpu" else 1,
            mig_profile=self.mig_profile,
            models=self.models,
        )

    def summary(self) -> str:
        if self.kind == "mig":
            return f"MIG instance {self.mig_profile}"
        if self.kind == "share":
            cap = f", {self.gpu_memory_mib / 1024:g} GiB memory cap" if self.gpu_memory_mib else ""
            return f"{self.gpu_milli / 10:g}% of a GPU{cap}"
        return f"{self.count} whole GPU" + ("s" if self.count > 1 else "")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "display_name": self.display_name,
            "description": self.description or self.summary(),
            "kind": self.kind,
            "mig_profile": self.mig_profile or None,
            "gpu_milli": self.request().total_gpu_milli or None,
            "gpu_memory_mib": self.gpu_memory_mib or None,
            "count": self.count,
            "models": list(self.models),
            "idle_timeout": self.idle_timeout,
            "groups": list(self.groups),
            "quota_weight": self.quota_weight,
        }


def _int(key: str, value: Any, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(key, f"must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
        raise ConfigError(key, f"must be {bound}, got {value}")
    return value


def _strings(key: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ConfigError(key, f"must be a list of strings, got {value!r}")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item:
            raise ConfigError(f"{key}[{i}]", f"must be a non-empty string, got {item!r}")
    return tuple(value)


def parse_profile(raw: Any, key: str) -> Profile:
    if not isinstance(raw, Mapping):
        raise ConfigError(key, f"must be a dict, got {type(raw).__name__}")
    unknown = set(raw) - _ALLOWED_KEYS
    if unknown:
        raise ConfigError(
            f"{key}.{sorted(unknown)[0]}", f"unknown key; known: {sorted(_ALLOWED_KEYS)}"
        )
    name = raw.get("name")
    if not is_profile_name(name):
        raise ConfigError(
            f"{key}.name",
            f"must be a lowercase name like 'mig-1g.18gb' (at most {NAME_MAX} characters), "
            f"got {name!r}",
        )
    kind = raw.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"{key}.kind", f"must be one of {list(KINDS)}, got {kind!r}")
    fields: dict[str, Any] = {"name": name, "kind": kind}
    if kind == "mig":
        mig = raw.get("mig_profile")
        try:
            # the grammar discovery reads NVML's profiles with: whatever it reports
            # (1g.10gb+me, 8g on a B200) an admin can offer
            parse_mig_profile(mig)
        except ValueError:
            raise ConfigError(
                f"{key}.mig_profile", f"must be a MIG profile like '1g.18gb', got {mig!r}"
            ) from None
        fields["mig_profile"] = mig
    elif "mig_profile" in raw:
        raise ConfigError(f"{key}.mig_profile", f"only applies to kind 'mig', not {kind!r}")
    if kind == "share":
        fields["gpu_milli"] = _int(f"{key}.gpu_milli", raw.get("gpu_milli"), 1, 999)
        fields["gpu_memory_mib"] = _int(f"{key}.gpu_memory_mib", raw.get("gpu_memory_mib", 0), 0)
    else:
        for k in ("gpu_milli", "gpu_memory_mib"):
            if k in raw:
                raise ConfigError(f"{key}.{k}", f"only applies to kind 'share', not {kind!r}")
    if kind == "gpu":
        fields["count"] = _int(f"{key}.count", raw.get("count", 1), 1, 16)
    elif "count" in raw:
        raise ConfigError(f"{key}.count", f"only applies to kind 'gpu', not {kind!r}")
    for k in ("cpu_milli", "memory_mib", "idle_timeout"):
        if k in raw:
            fields[k] = _int(f"{key}.{k}", raw[k], 0)
    for k in ("models", "groups"):
        if k in raw:
            fields[k] = _strings(f"{key}.{k}", raw[k])
    weight = raw.get("quota_weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight <= 0:
        raise ConfigError(f"{key}.quota_weight", f"must be a positive number, got {weight!r}")
    fields["quota_weight"] = float(weight)
    if "preempt_batch" in raw:
        if not isinstance(raw["preempt_batch"], bool):
            raise ConfigError(
                f"{key}.preempt_batch", f"must be true or false, got {raw['preempt_batch']!r}"
            )
        fields["preempt_batch"] = raw["preempt_batch"]
    for k in ("display_name", "description"):
        if k in raw and not isinstance(raw[k], str):
            raise ConfigError(f"{key}.{k}", f"must be a string, got {raw[k]!r}")
    fields["display_name"] = raw.get("display_name") or name
    fields["description"] = raw.get("description", "")
    return Profile(**fields)


def parse_profiles(raw: Any) -> dict[str, Profile]:
    """Parse ``GPUSliceService.profiles``; names must be unique."""
    if not isinstance(raw, (list, tuple)):
        raise ConfigError("profiles", f"must be a list of dicts, got {type(raw).__name__}")
    out: dict[str, Profile] = {}
    for i, item in enumerate(raw):
        profile = parse_profile(item, f"profiles[{i}]")
        if profile.name in out:
            raise ConfigError(f"profiles[{i}].name", f"duplicate profile name {profile.name!r}")
        out[profile.name] = profile
    return out
