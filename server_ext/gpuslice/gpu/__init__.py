"""GPU discovery: what GPUs (and MIG instances) exist, from one of several backends.

=============  ==============================================================
``nvml``       real GPUs on this host, read through NVML (``nvidia-ml-py``)
``static``     real GPUs on hosts the hub cannot query, declared in config
``simulated``  GPUs that do not exist, declared in config, labelled simulated
``auto``       ``nvml`` if a driver is present, else an error (never simulated)
=============  ==============================================================
"""

from __future__ import annotations

from typing import Any

from ..model import Inventory
from .declared import declared_inventory
from .errors import ConfigError, GPUDiscoveryError
from .nvml_discovery import NO_DRIVER_HINT, NoDriverError, discover_nvml, nvml_available
from .profiles import compute_milli, parse_mig_profile, profile_memory_gb, profile_name

BACKENDS = ("nvml", "static", "simulated", "auto")

__all__ = [
    "BACKENDS",
    "ConfigError",
    "GPUDiscoveryError",
    "NoDriverError",
    "compute_milli",
    "discover",
    "nvml_available",
    "parse_mig_profile",
    "profile_memory_gb",
    "profile_name",
]


def discover(
    backend: str,
    hosts_config: list | None = None,
    hostname: str | None = None,
    *,
    nvml: Any = None,
) -> Inventory:
    """Discover GPUs with *backend*.

    *hosts_config* is the declared host list for ``static``/``simulated``; the NVML
    backends refuse a non-empty one rather than ignore it. *hostname* names the local host
    for ``nvml``/``auto`` (default: ``socket.gethostname()``). *nvml* replaces the pynvml
    module (tests pass ``tests.fakes.fake_pynvml.FakeNVML``).
    """
    if backend in ("static", "simulated"):
        return declared_inventory(backend, hosts_config)
    if backend not in ("nvml", "auto"):
        raise GPUDiscoveryError(
            f"unknown GPU discovery backend {backend!r}; choose one of {', '.join(BACKENDS)}"
        )
    if hosts_config:
        raise ConfigError(
            "hosts",
            f"the {backend} backend reads GPUs from the driver and takes no hosts list; "
            "use the 'static' backend to declare hosts",
        )
    if backend == "nvml":
        return discover_nvml(nvml, hostname)
    try:
        return discover_nvml(nvml, hostname)
    except NoDriverError as e:
        raise NoDriverError(
            f"backend 'auto' found no NVIDIA driver on this host ({e.__cause__}); "
            f"it never falls back to simulated GPUs silently. {NO_DRIVER_HINT}"
        ) from e
