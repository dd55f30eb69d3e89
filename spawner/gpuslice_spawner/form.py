"""The spawn form: each profile with its live availability, and why not when it can't be had."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader


def _memory(p: dict[str, Any]) -> str:
    if p.get("gpu_memory_mib"):
        return f"{p['gpu_memory_mib'] / 1024:g} GiB GPU memory cap"
    return ""


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds // 60} min" if seconds >= 60 else f"{seconds} s"


def _idle(p: dict[str, Any]) -> str:
    """What idle reclaim will do to a server on this profile, as the service resolves it
    for this user (``idle`` in ``api/profiles``: the admin's policy and exemptions)."""
    idle = p.get("idle") or {"timeout": p.get("idle_timeout") or 0, "action": "server"}
    if idle.get("exempt"):
        # the service's reason: the user, one of their groups, or the profile is exempt
        why = idle.get("exempt_reason") or "you are exempt"
        return f"not reclaimed when idle ({why})"
    timeout = idle.get("timeout") or 0
    if not timeout:
        return "never reclaimed when idle"
    if idle.get("action") == "server":
        return f"reclaimed after {_duration(timeout)} idle (the server is stopped)"
    # action "kernel": the kernels go, the slice stays with the server
    return (
        f"idle kernels are shut down after {_duration(timeout)}; the slice is held until "
        "you stop the server"
    )


def quota_line(quota: list[dict[str, Any]] | None) -> str:
    """The quotas that limit the user, in a line (``Your quota: 1 of 2 slices in use;
    Group physics: …``), or "" when none does."""
    parts = [
        ("Your quota" if q.get("scope") == "user" else f"Group {q.get('name')}")
        + f": {q.get('text', '')}"
        for q in quota or []
    ]
    return "; ".join(parts)


TEMPLATE = "spawn_form.html"


def render_form(
    profiles: list[dict[str, Any]],
    simulated: bool = False,
    quota: list[dict[str, Any]] | None = None,
    template: str = TEMPLATE,
    template_paths: Sequence[str] = (),
) -> str:
    """HTML for JupyterHub's spawn page, from the Jinja template ``template`` (looked up
    in ``template_paths`` first, then in the package); the first available profile is
    preselected."""
    visible = [p for p in profiles if p.get("allowed", True)]
    if not visible:
        return "<p>No GPU profile is open to you. Ask your JupyterHub admin for access.</p>"
    # a profile with free slices first: one taken from a batch job costs that job a restart
    first = next(
        (p["name"] for p in visible if p.get("available") and p.get("free")),
        next((p["name"] for p in visible if p.get("available")), None),
    )
    rows = []
    for p in visible:
        description = p.get("description") or ""
        # the default description (the profile's summary) already states a share's cap
        memory = "" if "memory cap" in description else _memory(p)
        available = bool(p.get("available"))
        status = f"{p.get('free', 0)} of {p.get('total', 0)} free"
        if p.get("from_batch"):  # (only ever with none free, and available)
            status += ", one from a batch job"
        rows.append(
            {
                "name": p["name"],
                "display_name": p.get("display_name") or p["name"],
                "available": available,
                "checked": p["name"] == first,
                "status": status,
                "details": [
                    d
                    for d in (
                        description,
                        memory,
                        _idle(p),
                        _reserved(p),
                        _from_batch(p),
                        # what the counts leave out, and why: drains, nodes the engine
                        # takes no new work on (the service's words)
                        p.get("out_of_service") or "",
                    )
                    if d
                ],
                "reason": "" if available else (p.get("reason") or ""),
            }
        )
    return (
        _environment(tuple(template_paths))
        .get_template(template)
        .render(
            profiles=rows,
            simulated=simulated,
            quota_text=quota_line(quota),
            nothing_free=not any(p.get("available") for p in visible),
        )
    )


def _from_batch(profile: dict[str, Any]) -> str:
    """When none is free but preemptible batch jobs hold some: what a spawn then waits for."""
    if not profile.get("from_batch"):
        return ""
    seconds = profile.get("from_batch_seconds")
    if not seconds:  # the cluster's engine preempts the job: the server starts meanwhile
        return "none is free: your server takes the slice of a preemptible batch job"
    return (
        "none is free: your server takes the slice of a preemptible batch job, which saves a "
        f"checkpoint and gives it up first (up to {_duration(seconds)})"
    )


def _reserved(profile: dict[str, Any]) -> str:
    """With split pools: how many of the free slices batch jobs are kept off."""
    reserved = profile.get("reserved_free")
    if not reserved:
        return ""
    return f"{reserved} of the free ones are in the pool reserved for interactive use"


@lru_cache(maxsize=8)
def _environment(paths: tuple[str, ...]) -> Environment:
    # An admin's folders first, so their spawn_form.html wins; autoescape: every profile
    # field and reason is escaped unless a template marks it safe.
    loader = ChoiceLoader(
        [FileSystemLoader(list(paths)), PackageLoader("gpuslice_spawner", "templates")]
    )
    return Environment(loader=loader, autoescape=True)
