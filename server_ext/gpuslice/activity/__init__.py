"""Per-kernel GPU activity: sample NVML (or the simulated source), attribute processes to
kernels through their process trees, and accumulate idle time over whole windows."""

from __future__ import annotations

import os
from typing import Any

from .attribution import Attributor, Owner
from .idle import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    SERVER_KEY,
    IdleState,
    IdleTracker,
    IdleTrackers,
)
from .nvml_source import NvmlActivitySource
from .procfs import ProcReader
from .sampler import ActivitySampler, ActivitySource, aggregate
from .samples import (
    Activity,
    ActivityReport,
    Attribution,
    DeviceReading,
    ProcessSample,
    SourceTick,
)
from .simulated_source import SimulatedActivitySource

DEFAULT_SAMPLE_INTERVAL = 5.0

__all__ = [
    "DEFAULT_SAMPLE_INTERVAL",
    "DEFAULT_THRESHOLD",
    "DEFAULT_WINDOW",
    "SERVER_KEY",
    "Activity",
    "ActivityReport",
    "ActivitySampler",
    "ActivitySource",
    "Attribution",
    "Attributor",
    "DeviceReading",
    "IdleState",
    "IdleTracker",
    "IdleTrackers",
    "NvmlActivitySource",
    "Owner",
    "ProcReader",
    "ProcessSample",
    "SimulatedActivitySource",
    "SourceTick",
    "aggregate",
    "make_source",
    "visible_devices",
]


def visible_devices(env: Any = None) -> list[str] | None:
    """The devices ``CUDA_VISIBLE_DEVICES`` names (uuids or indexes), None if unset."""
    value = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [t.strip() for t in value.split(",") if t.strip()]


def make_source(kind: str, **kwargs: Any) -> ActivitySource:
    """``"nvml"`` or ``"simulated"``."""
    if kind == "nvml":
        kwargs.setdefault("devices", visible_devices())
        return NvmlActivitySource(**kwargs)
    if kind == "simulated":
        return SimulatedActivitySource(**kwargs)
    raise ValueError(f"unknown activity source {kind!r}; choose 'nvml' or 'simulated'")
