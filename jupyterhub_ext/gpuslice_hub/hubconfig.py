"""One call that wires gpuslice into a jupyterhub_config.py.

    from gpuslice_hub.hubconfig import configure_jupyterhub
    configure_jupyterhub(c, config_file="/etc/jupyterhub/gpuslice_config.py",
                         admin_users={"alice"})

adds the managed service, its custom scopes and roles, selects the gpuslice spawner pointed
at the service, and stops users from switching idle reclaim off in their own config.

What it adds is *merged* into the hub's config, whatever the order of the lines: an existing
``user`` role keeps its scopes and gains the ones gpuslice needs, and a later
``c.JupyterHub.services = [...]``, ``load_roles = [...]`` or ``custom_scopes = {...}`` in the
same file still gets gpuslice's entries (the ``JupyterHub`` section merges them in on
assignment, see :class:`_MergingSection`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import secrets
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from traitlets.config import Config, PyFileConfigLoader

from .hubparent import HUB_PID_ENV
from .scopes import ADMIN_SCOPE, METRICS_SCOPE, SERVICE_SCOPES

MERGED = ("services", "load_roles", "custom_scopes", "template_paths")
# Words in the name of an environment variable that holds a secret.
SECRET_NAMES = ("PASSWORD", "PASSWD", "SECRET", "TOKEN", "CREDENTIAL", "PRIVATE_KEY", "API_KEY")
# A URL with a password in it (``postgresql://user:password@host/db``).
URL_WITH_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]+@")


def configure_jupyterhub(
    c: Any,
    *,
    config_file: str,
    name: str = "gpuslice",
    url: str | None = None,
    admin_users: Iterable[str] = (),
    admin_groups: Iterable[str] = (),
    metrics_services: Iterable[str] = (),
    spawner: str | None = "gpuslice",
    python: str = sys.executable,
    environment: dict[str, str] | None = None,
    api_token: str | None = None,
) -> str:
    """Add the gpuslice service to the hub config ``c``; returns the service's API token.

    ``metrics_services``: hub services (e.g. Prometheus' scraper) given the read-only
    ``custom:gpuslice:metrics`` scope, enough for ``/metrics`` and nothing else.

    ``environment``: variables for the service's process. JupyterHub stores a managed
    service's environment in its own database (``jupyterhub.sqlite``, often readable by
    every local user) in plain text, so no secret may go there: a variable whose name says
    it is one (``*PASSWORD*``, ``*SECRET*``, ``*TOKEN*``, ...) or whose value is a URL with
    a password is refused (``ValueError``). The ledger's password goes in a file only the
    service's account can read, named by ``c.GPUSliceService.db_password_file`` in the
    service's config file. What this function passes itself is no secret: the hub's pid,
    and ``api_token``, which the hub keeps hashed."""
    check_no_secrets(environment or {})
    token = api_token or secrets.token_hex(32)
    share_sections(c, config_file)
    # A free loopback port unless the admin names one: two hubs on one host (or a port
    # some other program holds) must not make the service crash-loop on a fixed default.
    url = url or f"http://127.0.0.1:{free_port()}"
    service = {
        "name": name,
        "url": url,
        "command": [python, "-m", "gpuslice_hub.app", "--config", config_file],
        "api_token": token,
        "oauth_no_confirm": True,
        # Admins' login tokens for the service's pages carry the admin scope.
        "oauth_client_allowed_scopes": [ADMIN_SCOPE],
        # This config is read by the hub process that will start the service: its pid tells
        # the service which hub to stop with (hubparent.py), however it is started
        "environment": {**(environment or {}), HUB_PID_ENV: str(os.getpid())},
    }
    access = f"access:services!service={name}"
    scopes = {
        ADMIN_SCOPE: {
            "description": "Administer gpuslice: see every allocation and job, preempt, drain, "
            "change quotas."
        },
        METRICS_SCOPE: {"description": "Read gpuslice's /metrics (and nothing else)."},
    }
    roles = [
        # Every user may call the service (for their own allocations and jobs).
        {"name": "user", "scopes": ["self", access]},
        {
            "name": f"{name}-service",
            "scopes": [s.format(name=name) for s in SERVICE_SCOPES],
            "services": [name],
        },
        {
            "name": f"{name}-admin",
            "scopes": [ADMIN_SCOPE, access],
            "users": sorted(admin_users),
            "groups": sorted(admin_groups),
        },
        {
            "name": f"{name}-metrics",
            "scopes": [METRICS_SCOPE, access],
            "services": sorted(metrics_services),
        },
    ]
    section = _MergingSection.install(c)
    section.add(services=[service], load_roles=roles, custom_scopes=scopes)

    # Idle reclaim runs in the user's server: a user's own ~/.jupyter config must not be able
    # to switch the extension (or its policy) off. The service also reclaims a slice whose
    # server stops reporting (GPUSliceService.reclaim_silent_after).
    c.Spawner.disable_user_config = True

    if spawner:
        # The hub's "Server not running" page says why when gpuslice had the server stopped
        # (an idle cull: the spawner keeps the reason). After a site's own template folders,
        # so that theirs win.
        section.add(template_paths=[hub_templates()])
        c.JupyterHub.spawner_class = spawner
        # GPUSliceMixin is the base of every gpuslice spawner, whichever launcher is chosen
        c.GPUSliceMixin.service_url = url.rstrip("/") + f"/services/{name}/"
        c.GPUSliceMixin.service_token = token
        c.GPUSliceMixin.service_name = name
    return token


def check_no_secrets(environment: dict[str, str]) -> None:
    """Refuse (``ValueError``, naming the variable) a service ``environment`` that would
    put a secret in the hub's database (see :func:`configure_jupyterhub`)."""
    for name, value in environment.items():
        if any(word in name.upper() for word in SECRET_NAMES) or URL_WITH_PASSWORD.search(
            str(value)
        ):
            raise ValueError(
                f"configure_jupyterhub: environment[{name!r}] looks like a secret, and the "
                "hub stores the service's environment in plain text in its database "
                "(jupyterhub.sqlite): put the ledger's password in a file only the "
                "service's account can read (chmod 600), named by "
                "c.GPUSliceService.db_password_file in the service's config file"
            )


# Settings the hub's spawner and the service must agree on, written once in the service's
# config file: the Slurm gres names and the Kubernetes resource names (servers and batch jobs
# ask the cluster for the same resources).
SHARED_SECTIONS = ("SlurmGresConfig", "KubernetesResourcesConfig")


def share_sections(c: Any, config_file: str) -> None:
    """Copy :data:`SHARED_SECTIONS` from the service's config file into the hub's ``c``.

    A value the hub's config also sets must be the same: servers and jobs asking Slurm for
    different gres would make the ledger and Slurm disagree about what is held."""
    path = Path(config_file)
    if not path.is_file():
        return  # the service refuses to start without it, with the path in its message
    try:
        loaded = PyFileConfigLoader(path.name, str(path.parent.resolve())).load_config()
    except Exception as e:
        # The file runs in the service's environment (e.g. a variable of the service's
        # `environment`), which the hub's may lack: the hub must still start.
        logging.getLogger("JupyterHub").warning(
            "gpuslice: %s could not be read in the hub (%s: %s), so its %s are not copied "
            "to the spawner: set the same values in jupyterhub_config.py",
            config_file,
            type(e).__name__,
            e,
            " and ".join(SHARED_SECTIONS),
        )
        return
    for section in SHARED_SECTIONS:
        if section not in loaded:
            continue
        shared = _SharedSection.install(c, section, config_file)
        for key, value in loaded[section].items():
            shared.share(key, value)


class _SharedSection(Config):
    """A section of :data:`SHARED_SECTIONS` in the hub's ``c``: a key the service's config
    file sets may be set in jupyterhub_config.py to the same value only, before or after
    :func:`configure_jupyterhub` (a later line would otherwise win there silently)."""

    _shared: dict[str, Any]
    _name: str
    _file: str

    @classmethod
    def install(cls, c: Any, name: str, config_file: str) -> _SharedSection:
        current = c[name]
        if isinstance(current, cls):
            return current
        section = cls()
        object.__setattr__(section, "_shared", {})
        object.__setattr__(section, "_name", name)
        object.__setattr__(section, "_file", config_file)
        for key, value in current.items():
            dict.__setitem__(section, key, value)
        c[name] = section
        return section

    def share(self, key: str, value: Any) -> None:
        self._shared[key] = value
        if key in self:
            self._check(key, self[key])
        super().__setitem__(key, value)

    def _check(self, key: str, value: Any) -> None:
        if key in self._shared and self._shared[key] != value:
            raise ValueError(
                f"c.{self._name}.{key} is {value!r} in the hub's config but "
                f"{self._shared[key]!r} in {self._file}: set it in {self._file} only"
            )

    def __setitem__(self, key: str, value: Any) -> None:
        if hasattr(self, "_shared"):
            self._check(key, value)
        super().__setitem__(key, value)

    def __setattr__(self, key: str, value: Any) -> None:
        if key in ("_shared", "_name", "_file"):
            object.__setattr__(self, key, value)
            return
        super().__setattr__(key, value)

    def __getattr__(self, key: str) -> Any:
        if key in ("_shared", "_name", "_file"):
            raise AttributeError(key)
        return super().__getattr__(key)


def hub_templates() -> str:
    """The spawner's folder of JupyterHub page templates (found without importing it)."""
    spec = importlib.util.find_spec("gpuslice_spawner")
    assert spec is not None and spec.origin is not None, "gpuslice_spawner is not installed"
    return str(Path(spec.origin).parent / "templates" / "hub")


def merge_paths(current: list[str], ours: list[str]) -> list[str]:
    """``current`` with ``ours`` after it (a site's own templates come first)."""
    return [*current, *(p for p in ours if p not in current)]


def free_port() -> int:
    """A TCP port nobody listens on now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def merge_services(current: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[dict]:
    """``current`` with each of ``ours`` replacing the service of the same name."""
    names = {s["name"] for s in ours}
    return [s for s in current if s.get("name") not in names] + ours


def merge_roles(current: list[dict[str, Any]], ours: list[dict[str, Any]]) -> list[dict]:
    """``current`` with ``ours`` merged in: a role of the same name keeps its own scopes,
    users, groups and services and gains ours (nothing the admin gave it is lost)."""
    out = [dict(r) for r in current]
    by_name = {r.get("name"): r for r in out}
    for role in ours:
        mine = by_name.get(role["name"])
        if mine is None:
            out.append(dict(role))
            continue
        for key in ("scopes", "users", "groups", "services"):
            if key in role or key in mine:
                merged = list(mine.get(key) or [])
                merged += [v for v in role.get(key, []) if v not in merged]
                mine[key] = merged
    return out


def merge_scopes(current: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    return {**current, **ours}


_MERGERS: dict[str, Any] = {
    "services": merge_services,
    "load_roles": merge_roles,
    "custom_scopes": merge_scopes,
    "template_paths": merge_paths,
}


class _MergingSection(Config):
    """The ``c.JupyterHub`` config section, made to keep gpuslice's entries: assigning
    ``services``, ``load_roles``, ``custom_scopes`` or ``template_paths`` (before or after
    :func:`configure_jupyterhub`) merges them into the new value."""

    _gpuslice: dict[str, Any]

    @classmethod
    def install(cls, c: Any) -> _MergingSection:
        current = c.JupyterHub
        if isinstance(current, cls):
            return current
        section = cls()
        section._gpuslice = {
            "services": [],
            "load_roles": [],
            "custom_scopes": {},
            "template_paths": [],
        }
        for key, value in current.items():
            dict.__setitem__(section, key, value)
        c.JupyterHub = section
        return section

    def add(self, **entries: Any) -> None:
        for key, value in entries.items():
            self._gpuslice[key] = _MERGERS[key](self._gpuslice[key], value)
            current = dict.get(self, key)
            self[key] = _plain(current, key)

    def __setitem__(self, key: str, value: Any) -> None:
        if key in MERGED and hasattr(self, "_gpuslice"):
            value = _MERGERS[key](_plain(value, key), self._gpuslice[key])
        super().__setitem__(key, value)

    def update(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        """``c.JupyterHub.update({...})``, and ``c.merge(...)`` (which updates each section
        it merges into), merge gpuslice's entries in as an assignment does: ``dict.update``
        would replace them, dropping the service and its roles (issue 45)."""
        for key, value in dict(*args, **kwargs).items():
            self[key] = value

    def __setattr__(self, key: str, value: Any) -> None:
        if key == "_gpuslice":
            object.__setattr__(self, key, value)
            return
        super().__setattr__(key, value)

    def __getattr__(self, key: str) -> Any:
        if key == "_gpuslice":
            raise AttributeError(key)
        return super().__getattr__(key)


def _plain(value: Any, key: str) -> Any:
    """A config value as a plain list or dict (an unset one is a LazyConfigValue)."""
    if isinstance(value, list | dict):
        return value
    empty: Any = {} if key == "custom_scopes" else []
    if value is None:
        return empty
    get_value = getattr(value, "get_value", None)
    return get_value(empty) if get_value is not None else empty
