"""One call that wires gpuslice into a jupyterhub_config.py.

    from gpuslice_hub.hubconfig import configure_jupyterhub
    configure_jupyterhub(c, config_file="/etc/jupyterhub/gpuslice_config.py",
                         admin_users={"alice"})

adds the managed service, its custom admin scope and roles, and selects the gpuslice
spawner pointed at the service.
"""

from __future__ import annotations

import secrets
import sys
from collections.abc import Iterable
from typing import Any

from .app import ADMIN_SCOPE

SERVICE_SCOPES = [
    # reconcile allocations against servers, and stop servers whose slice is reclaimed
    "list:users",
    "read:users",
    "read:users:name",
    "read:users:groups",
    "read:servers",
    "servers",
    "read:groups",
    # the spawner uses the service's own token; it must pass the service's access check
    "access:services!service={name}",
]


def configure_jupyterhub(
    c: Any,
    *,
    config_file: str,
    name: str = "gpuslice",
    url: str = "http://127.0.0.1:10101",
    admin_users: Iterable[str] = (),
    admin_groups: Iterable[str] = (),
    spawner: str | None = "gpuslice",
    python: str = sys.executable,
    environment: dict[str, str] | None = None,
    api_token: str | None = None,
) -> str:
    """Add the gpuslice service to the hub config ``c``; returns the service's API token."""
    token = api_token or secrets.token_hex(32)
    service = {
        "name": name,
        "url": url,
        "command": [python, "-m", "gpuslice_hub.app", "--config", config_file],
        "api_token": token,
        "oauth_no_confirm": True,
        # Admins' login tokens for the service's pages carry the admin scope.
        "oauth_client_allowed_scopes": [ADMIN_SCOPE],
        "environment": dict(environment or {}),
    }
    services = list(c.JupyterHub.services or []) if "services" in c.JupyterHub else []
    c.JupyterHub.services = [s for s in services if s.get("name") != name] + [service]

    custom = dict(c.JupyterHub.custom_scopes) if "custom_scopes" in c.JupyterHub else {}
    custom[ADMIN_SCOPE] = {
        "description": "Administer gpuslice: see every allocation and job, preempt, drain, "
        "change quotas."
    }
    c.JupyterHub.custom_scopes = custom

    roles = list(c.JupyterHub.load_roles) if "load_roles" in c.JupyterHub else []
    roles = [r for r in roles if r.get("name") not in {"user", f"{name}-service", f"{name}-admin"}]
    roles += [
        # Every user may call the service (for their own allocations and jobs).
        {"name": "user", "scopes": ["self", f"access:services!service={name}"]},
        {
            "name": f"{name}-service",
            "scopes": [s.format(name=name) for s in SERVICE_SCOPES],
            "services": [name],
        },
        {
            "name": f"{name}-admin",
            "scopes": [ADMIN_SCOPE, f"access:services!service={name}"],
            "users": sorted(admin_users),
            "groups": sorted(admin_groups),
        },
    ]
    c.JupyterHub.load_roles = roles

    if spawner:
        c.JupyterHub.spawner_class = spawner
        # GPUSliceMixin is the base of every gpuslice spawner, whichever launcher is chosen
        c.GPUSliceMixin.service_url = url.rstrip("/") + f"/services/{name}/"
        c.GPUSliceMixin.service_token = token
        c.GPUSliceMixin.service_name = name
    return token
