"""What one sampling tick produces, before and after attribution to kernels."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Attribution(str, Enum):
    """How far a utilization figure can be trusted to belong to one process."""

    # NVML measured this process's own SM utilization.
    PER_PROCESS = "per-process"
    # The figure is the whole MIG instance's (GPM) or the whole GPU's: every process on
    # it, this one included, shares it.
    PER_INSTANCE = "per-instance"
    # The hardware/driver offers no utilization here (MIG before Hopper, vGPU, errors).
    UNAVAILABLE = "unavailable"


# Worst first: an aggregate is only as precise as its least precise part.
_PRECISION = {Attribution.UNAVAILABLE: 0, Attribution.PER_INSTANCE: 1, Attribution.PER_PROCESS: 2}


def least_precise(values: list[Attribution], default: Attribution) -> Attribution:
    return min(values, key=_PRECISION.__getitem__) if values else default


@dataclass(frozen=True)
class ProcessSample:
    """One GPU process on one device, as the source saw it."""

    pid: int  # as the source reports it: NVML may give a host PID inside a container
    device: str  # uuid of the GPU or MIG instance
    memory_bytes: int | None  # None: the driver does not say (MIG without privileges, WDDM)
    util: float | None  # percent; the instance's figure when attribution is per-instance
    attribution: Attribution


@dataclass(frozen=True)
class DeviceReading:
    uuid: str
    attribution: Attribution
    util: float | None = None  # device/instance utilization when known
    parent_uuid: str | None = None  # the GPU of a MIG instance
    error: str | None = None  # why this device could not be read this tick


@dataclass(frozen=True)
class SourceTick:
    time: float
    processes: tuple[ProcessSample, ...]
    devices: tuple[DeviceReading, ...]
    simulated: bool = False

    @property
    def complete(self) -> bool:
        """Every device was read: a kernel with no GPU process really used no GPU."""
        return all(d.error is None for d in self.devices)


@dataclass(frozen=True)
class Activity:
    """GPU activity of one owner (a kernel, or the server outside its kernels)."""

    util: float | None  # percent; None when it cannot be known this tick
    memory_bytes: int | None
    attribution: Attribution
    pids: tuple[int, ...] = ()  # local PIDs of its GPU processes
    devices: tuple[str, ...] = ()

    @property
    def holds_memory(self) -> bool:
        return bool(self.memory_bytes)


@dataclass(frozen=True)
class ActivityReport:
    time: float
    kernels: dict[str, Activity]
    server: Activity
    foreign_pids: tuple[int, ...] = ()  # GPU processes of someone else (shared GPU)
    devices: tuple[DeviceReading, ...] = ()
    simulated: bool = False
    extra: dict[str, object] = field(default_factory=dict)
