"""One sampling tick: read the source once, attribute each GPU process to its owner, and
sum up per kernel and for the server."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Protocol

from .attribution import FOREIGN, KERNEL, Attributor, Owner
from .samples import Activity, ActivityReport, Attribution, ProcessSample, SourceTick, least_precise


class ActivitySource(Protocol):
    def open(self) -> None: ...
    def sample(self) -> SourceTick: ...
    def close(self) -> None: ...


def aggregate(
    samples: list[ProcessSample], owners: Mapping[int, Owner], complete: bool
) -> Activity:
    """Sum one owner's processes: utilization per device (per-process figures add up,
    a per-instance figure is shared and taken once), the busiest device for the total."""
    if not samples:
        # No GPU process at all means no GPU use, but only if every device was read.
        return _NOTHING if complete else _UNKNOWN
    per_device: dict[str, list[ProcessSample]] = defaultdict(list)
    for s in samples:
        per_device[s.device].append(s)
    busiest = 0.0
    unknown = False
    for device_samples in per_device.values():
        known = [s.util for s in device_samples if s.util is not None]
        if len(known) < len(device_samples):
            # One device we cannot see into makes the total unknown: it may be the busy one.
            unknown = True
            break
        if device_samples[0].attribution is Attribution.PER_INSTANCE:
            busiest = max(busiest, max(known))
        else:
            busiest = max(busiest, min(100.0, sum(known)))
    memories = [s.memory_bytes for s in samples if s.memory_bytes is not None]
    local = sorted({p for s in samples if (p := owners[s.pid].local_pid) is not None})
    return Activity(
        util=None if unknown else busiest,
        memory_bytes=sum(memories) if memories else None,
        attribution=least_precise([s.attribution for s in samples], Attribution.PER_PROCESS),
        pids=tuple(local),
        devices=tuple(sorted(per_device)),
    )


_NOTHING = Activity(0.0, 0, Attribution.PER_PROCESS)
_UNKNOWN = Activity(None, None, Attribution.UNAVAILABLE)


class ActivitySampler:
    def __init__(self, source: ActivitySource, attributor: Attributor | None = None) -> None:
        self.source = source
        self.attributor = attributor or Attributor()

    def close(self) -> None:
        self.source.close()

    def tick(self, kernels: Mapping[str, int]) -> ActivityReport:
        """*kernels*: kernel id → the PID of the kernel process, as Jupyter knows it."""
        raw = self.source.sample()
        owners = self.attributor.resolve([s.pid for s in raw.processes], kernels)
        by_kernel: dict[str, list[ProcessSample]] = defaultdict(list)
        server: list[ProcessSample] = []
        foreign: set[int] = set()
        for s in raw.processes:
            owner = owners[s.pid]
            if owner.kind == KERNEL and owner.kernel_id is not None:
                by_kernel[owner.kernel_id].append(s)
            elif owner.kind == FOREIGN:
                foreign.add(s.pid)
            else:
                server.append(s)
        complete = raw.complete
        return ActivityReport(
            time=raw.time,
            kernels={kid: aggregate(by_kernel.get(kid, []), owners, complete) for kid in kernels},
            server=aggregate(server, owners, complete),
            foreign_pids=tuple(sorted(foreign)),
            devices=raw.devices,
            simulated=raw.simulated,
        )
