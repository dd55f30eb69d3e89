"""The spawn form: each profile with its live availability, and why not when it can't be had."""

from __future__ import annotations

from html import escape
from typing import Any


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
        return "not reclaimed when idle (you are exempt)"
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


# Scoped to the form, on top of the hub page's Bootstrap: rows that cannot be chosen are
# greyed, so the one line that matters there -- why not -- stands out.
_STYLE = """<style>
.gpuslice-form .gpuslice-profile { cursor: pointer; }
.gpuslice-form .gpuslice-profile input { margin-right: .4em; }
.gpuslice-form .gpuslice-free { margin-left: .4em; }
.gpuslice-form .gpuslice-profile.disabled { cursor: not-allowed; background: #f6f6f6; }
.gpuslice-form .gpuslice-profile.disabled .gpuslice-free { background: #6c757d; }
.gpuslice-form .gpuslice-details { color: #555; margin-left: 1.6em; }
.gpuslice-form .gpuslice-why { font-size: .9em; margin: .2em 0 0 1.6em; }
</style>"""


def quota_line(quota: list[dict[str, Any]] | None) -> str:
    """The quotas that limit the user, in a line (``Your quota: 1 of 2 slices in use;
    Group physics: …``), or "" when none does."""
    parts = [
        ("Your quota" if q.get("scope") == "user" else f"Group {q.get('name')}")
        + f": {q.get('text', '')}"
        for q in quota or []
    ]
    return "; ".join(parts)


def render_form(
    profiles: list[dict[str, Any]],
    simulated: bool = False,
    quota: list[dict[str, Any]] | None = None,
) -> str:
    """HTML for JupyterHub's spawn page; the first available profile is preselected."""
    visible = [p for p in profiles if p.get("allowed", True)]
    if not visible:
        return "<p>No GPU profile is open to you. Ask your JupyterHub admin for access.</p>"
    first = next((p["name"] for p in visible if p.get("available")), None)
    rows = []
    for p in visible:
        name = escape(p["name"])
        available = bool(p.get("available"))
        description = p.get("description") or ""
        # the default description (the profile's summary) already states a share's cap
        memory = "" if "memory cap" in description else _memory(p)
        details = [escape(description), memory, _idle(p)]
        status = f"{p.get('free', 0)} of {p.get('total', 0)} free"
        why = ""
        if not available and p.get("reason"):
            why = f'<div class="gpuslice-why text-danger">Unavailable: {escape(p["reason"])}</div>'
        rows.append(
            f"""<label class="gpuslice-profile list-group-item{"" if available else " disabled"}"
  data-profile="{name}">
  <input type="radio" name="profile" value="{name}"{" checked" if p["name"] == first else ""}
   {"" if available else "disabled"}>
  <strong>{escape(p.get("display_name") or p["name"])}</strong>
  <span class="badge gpuslice-free {"bg-success" if available else "bg-secondary"}">{status}</span>
  <div class="gpuslice-details small">{" · ".join(d for d in details if d)}</div>{why}
</label>"""
        )
    others = [p for p in visible if p.get("available")]
    hint = ""
    if not others:
        hint = (
            '<p class="gpuslice-none text-danger">Nothing is free for you right now. '
            "Try again later, or submit your notebook as a batch job.</p>"
            # Start would only be refused: the hub's button (below this, in the same form)
            # is disabled once the page is parsed
            "<script>(() => { const form = document.currentScript.closest('form');"
            " const off = () => form?.querySelectorAll('[type=submit]')"
            ".forEach(b => { b.disabled = true; });"
            " document.addEventListener('DOMContentLoaded', off); })();</script>"
        )
    banner = ""
    if simulated:
        banner = (
            '<p class="gpuslice-simulated alert alert-warning">These GPUs are simulated '
            "(gpuslice demo mode): there is no real GPU behind them.</p>"
        )
    quota_text = quota_line(quota)
    if quota_text:
        banner += f'<p class="gpuslice-quota small">{escape(quota_text)}.</p>'
    return f"""<div class="gpuslice-form">{_STYLE}{banner}
<p>Choose a GPU slice for this server:</p>
<div class="list-group">{"".join(rows)}</div>{hint}</div>"""
