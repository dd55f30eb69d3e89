"""Settings in the service's config file that nothing reads are refused at start.

traitlets only logs a warning for a misspelled setting (``c.GPUSliceService.quota``) and says
nothing at all for a misspelled class (``c.GPUSliceServce.quotas``): the service would start
and run without it, quotas unenforced, with the one sign of it in a log nobody reads.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from traitlets.config import Config, Configurable

from .errors import ConfigError
from .scopes import ADMIN_SCOPE, METRICS_SCOPE

# Read by the hub from jupyterhub_config.py, never by the service: a section of these in the
# service's file is a setting in the wrong file.
HUB_SECTIONS = frozenset(
    {
        "JupyterHub",
        "Spawner",
        "LocalProcessSpawner",
        "SimpleLocalProcessSpawner",
        "Authenticator",
        "ConfigurableHTTPProxy",
        "Proxy",
        "GPUSliceMixin",
        "GPUSliceSpawner",
        "GPUSliceKubeSpawner",
        "GPUSliceSlurmSpawner",
        "KubeSpawner",
        "SlurmSpawner",
        "BatchSpawnerBase",
    }
)

# Settings that once existed and did nothing (or worse), each with what to do instead: a
# config that still sets one is told why, not only "no such setting".
REMOVED = {
    "GPUSliceService.admin_scope": (
        f"removed: changing it left nobody a gpuslice admin (the hub's roles grant "
        f"{ADMIN_SCOPE}, which configure_jupyterhub defines); grant {ADMIN_SCOPE} to whom "
        "you like through c.JupyterHub.load_roles instead"
    ),
    "GPUSliceService.metrics_scope": (
        f"removed: changing it left no token able to scrape /metrics (the hub's roles grant "
        f"{METRICS_SCOPE}); grant {METRICS_SCOPE} to Prometheus' service through "
        "c.JupyterHub.load_roles instead"
    ),
}


def readable_settings(classes: Iterable[type[Configurable]]) -> dict[str, set[str]]:
    """Section name -> the settings it may hold, for ``classes`` and the configurable
    classes they inherit from (``c.Application.log_level`` is read by the service too)."""
    readable: dict[str, set[str]] = {}
    for cls in classes:
        for klass in cls.mro():
            if isinstance(klass, type) and issubclass(klass, Configurable):
                names = klass.class_trait_names(config=True)
                readable.setdefault(klass.__name__, set()).update(names)
    return readable


def check_settings(config: Config, classes: Iterable[type[Configurable]], where: str) -> None:
    """Raise ``ConfigError`` for the first setting in ``config`` that no class of
    ``classes`` reads, naming it and the likely one meant. ``where``: the config file."""
    readable = readable_settings(classes)
    for section, settings in config.items():
        if not isinstance(settings, Config):
            continue  # (not a section: traitlets ignores it too)
        if section not in readable:
            if section in HUB_SECTIONS:
                raise ConfigError(
                    section,
                    f"is read by the hub, not by the gpuslice service: set c.{section} in "
                    f"jupyterhub_config.py, not in {where}",
                )
            known = sorted(s for s in readable if not _generic(s))
            raise ConfigError(
                section,
                f"no such settings section in {where}{_meant(section, readable)} "
                f"(the service reads {', '.join(known)})",
            )
        for key in settings:
            if f"{section}.{key}" in REMOVED:
                raise ConfigError(f"{section}.{key}", REMOVED[f"{section}.{key}"])
            if key not in readable[section]:
                meant = _meant(key, readable[section])
                raise ConfigError(f"{section}.{key}", f"no such setting{meant}")


def _generic(section: str) -> bool:
    # traitlets' own bases: valid, but no help to name among the service's sections
    return section in ("Configurable", "LoggingConfigurable", "SingletonConfigurable")


def _meant(name: str, candidates: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
