"""Who may submit which priority class (``JobManager.priority_access``).

A ``high`` job takes the reserved pools and preempts other users' preemptible jobs, so it is
not everyone's to ask for: the admins say who may submit each class. A class the setting
does not name is everyone's; the gpuslice admins (the admin scope) may submit every class.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import ConfigError, Refused
from .states import PRIORITY_CLASSES

SETTING = "JobManager.priority_access"
# Only the admins, unless the site names who else: high preempts other people's work.
DEFAULT: dict[str, dict[str, list[str]]] = {"high": {"users": [], "groups": []}}


@dataclass(frozen=True)
class ClassAccess:
    """Who besides the admins may submit one class."""

    users: frozenset[str]
    groups: frozenset[str]

    def admits(self, user: str, groups: Iterable[str]) -> bool:
        return user in self.users or not self.groups.isdisjoint(groups)


def parse_priority_access(raw: Mapping[str, Any]) -> dict[str, ClassAccess]:
    """The setting as rules (checked at start: a ConfigError names what is wrong)."""
    rules: dict[str, ClassAccess] = {}
    for cls, who in raw.items():
        if cls not in PRIORITY_CLASSES:
            raise ConfigError(
                SETTING, f"{cls!r} is no priority class ({', '.join(PRIORITY_CLASSES)})"
            )
        if not isinstance(who, Mapping) or set(who) - {"users", "groups"}:
            raise ConfigError(
                SETTING,
                f"{cls}: give {{'users': [...], 'groups': [...]}} (who may submit {cls} jobs "
                "besides the admins), not " + repr(who)[:80],
            )
        names = {}
        for key in ("users", "groups"):
            listed = who.get(key, [])
            if not isinstance(listed, list | tuple | set | frozenset) or not all(
                isinstance(n, str) and n for n in listed
            ):
                raise ConfigError(SETTING, f"{cls}: {key!r} must be a list of names")
            names[key] = frozenset(listed)
        rules[cls] = ClassAccess(names["users"], names["groups"])
    return rules


def allowed_classes(
    rules: Mapping[str, ClassAccess], user: str, groups: Iterable[str], admin: bool
) -> list[str]:
    """The classes ``user`` may submit, lowest first."""
    groups = tuple(groups)
    return [
        cls
        for cls in PRIORITY_CLASSES
        if admin or cls not in rules or rules[cls].admits(user, groups)
    ]


def check_class(
    rules: Mapping[str, ClassAccess], cls: str, user: str, groups: Iterable[str], admin: bool
) -> None:
    """Refused (``forbidden_priority``) when ``user`` may not submit ``cls`` jobs; the
    message names the setting and the classes they may use (never who else may)."""
    allowed = allowed_classes(rules, user, groups, admin)
    if cls in allowed:
        return
    rule = rules[cls]
    whom = "the gpuslice admins" + (
        " and the users and groups it names" if rule.users or rule.groups else ""
    )
    raise Refused(
        "forbidden_priority",
        f"{user} may not submit {cls} jobs: {SETTING} limits them to {whom}. You may "
        f"submit {', '.join(allowed) or 'no class'}; ask an admin if you need {cls}",
        allowed_priorities=allowed,
    )
