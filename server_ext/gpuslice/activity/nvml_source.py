"""Activity source reading NVML: per-process memory and utilization, per GPU or MIG instance.

One tick costs, per full GPU, one ``nvmlDeviceGetComputeRunningProcesses`` and one
``nvmlDeviceGetProcessUtilization``; per MIG instance one process list, plus one GPM
sample when the GPU supports GPM (Hopper and later). MIG instances have no per-process
utilization in NVML, so there the figures are the instance's (GPM) or unavailable.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..gpu.nvml_discovery import (
    as_str,
    default_nvml_module,
    init_nvml,
    mig_handles,
    nvml_error,
    shutdown_nvml,
)
from .samples import Attribution, DeviceReading, ProcessSample, SourceTick

log = logging.getLogger(__name__)


@dataclass
class _Instance:
    uuid: str
    handle: Any
    gi_id: int | None
    gpm_prev: Any = None  # the previous GPM sample, to diff against


@dataclass
class _Gpu:
    uuid: str
    index: int
    handle: Any
    mig: list[_Instance] | None  # None: not in MIG mode
    gpm: bool = False
    last_seen_ts: int = 0  # lastSeenTimeStamp for nvmlDeviceGetProcessUtilization
    util_supported: bool = True


def _wanted(tokens: set[str] | None, *names: str) -> bool:
    return tokens is None or any(n in tokens for n in names)


def _legacy_mig_name(gpu_uuid: str, gi_id: int | None) -> str:
    # Drivers before R470 name MIG devices "MIG-<GPU uuid>/<gi>/<ci>" in CUDA_VISIBLE_DEVICES.
    return f"MIG-{gpu_uuid}/{gi_id}/0"


class NvmlActivitySource:
    """Reads activity from NVML; keeps NVML initialised between ticks (``close()`` ends it).

    *devices* limits sampling to the server's own devices: GPU or MIG uuids, or NVML
    indexes as strings (what ``CUDA_VISIBLE_DEVICES`` holds); ``None`` samples them all.
    """

    def __init__(
        self,
        nvml: Any = None,
        devices: Iterable[str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.nvml = nvml if nvml is not None else default_nvml_module()
        self.wanted = None if devices is None else {d.strip() for d in devices if d.strip()}
        self.clock = clock
        self.simulated = bool(getattr(self.nvml, "FAKE", False))
        self._gpus: list[_Gpu] | None = None
        self._open = False
        self._running_fn: Callable[[Any], list[Any]] | None = None
        self._warned: set[str] = set()
        # Visible-device names that matched no device: reported as unreadable every tick,
        # because "no process seen" on a device we never looked at would read as idle.
        self._unmatched: list[str] = []

    # ---- lifecycle -----------------------------------------------------------------------

    def open(self) -> None:
        if not self._open:
            init_nvml(self.nvml)
            self._open = True

    def close(self) -> None:
        self.close_devices()
        if self._open:
            shutdown_nvml(self.nvml)
            self._open = False

    def __enter__(self) -> NvmlActivitySource:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _free(self, inst: _Instance) -> None:
        if inst.gpm_prev is not None:
            with contextlib.suppress(self.nvml.NVMLError):
                self.nvml.nvmlGpmSampleFree(inst.gpm_prev)
            inst.gpm_prev = None

    # ---- enumeration ---------------------------------------------------------------------

    def _enumerate(self) -> list[_Gpu]:
        nvml = self.nvml
        gpus = []
        seen: set[str] = set()
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = as_str(nvml.nvmlDeviceGetUUID(handle))
            try:
                current, _ = nvml.nvmlDeviceGetMigMode(handle)
                mig_on = current == nvml.NVML_DEVICE_MIG_ENABLE
            except (nvml_error(nvml, "NotSupported"), nvml_error(nvml, "FunctionNotFound")):
                mig_on = False
            if not mig_on:
                if _wanted(self.wanted, uuid, str(i)):
                    seen.update((uuid, str(i)))
                    gpus.append(_Gpu(uuid, i, handle, None))
                continue
            instances = []
            for _j, mh in mig_handles(nvml, handle):
                muuid = as_str(nvml.nvmlDeviceGetUUID(mh))
                try:
                    gi_id: int | None = int(nvml.nvmlDeviceGetGpuInstanceId(mh))
                except nvml.NVMLError:
                    gi_id = None
                legacy = _legacy_mig_name(uuid, gi_id)
                names = (muuid, uuid, str(i), legacy)
                if not _wanted(self.wanted, *names):
                    continue
                seen.update(names)
                instances.append(_Instance(muuid, mh, gi_id))
            if instances:
                gpus.append(_Gpu(uuid, i, handle, instances, gpm=self._gpm_supported(handle)))
        self._unmatched = sorted(self.wanted - seen) if self.wanted is not None else []
        if self._unmatched:
            self._warn_once("unmatched", f"visible devices {self._unmatched} match no NVML device")
        return gpus

    def _gpm_supported(self, handle: Any) -> bool:
        try:
            return bool(self.nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
        except (self.nvml.NVMLError, AttributeError):
            return False

    # ---- one tick ------------------------------------------------------------------------

    def sample(self) -> SourceTick:
        self.open()
        now = self.clock()
        if self._gpus is None:
            self._gpus = self._enumerate()
        procs: list[ProcessSample] = []
        readings: list[DeviceReading] = []
        stale = False
        for gpu in self._gpus:
            try:
                if gpu.mig is None:
                    readings.append(self._sample_gpu(gpu, procs))
                else:
                    readings.extend(self._sample_mig(gpu, procs))
            except self.nvml.NVMLError as e:
                # A MIG layout change or a GPU fault invalidates the handles; enumerate
                # again next tick rather than keep failing on stale ones.
                stale = True
                self._warn_once(gpu.uuid, f"NVML failed on GPU {gpu.uuid}: {e!r}")
                readings.append(DeviceReading(gpu.uuid, Attribution.UNAVAILABLE, error=repr(e)))
        for name in self._unmatched:
            readings.append(
                DeviceReading(name, Attribution.UNAVAILABLE, error="no such NVML device")
            )
        if stale:
            self.close_devices()
        return SourceTick(now, tuple(procs), tuple(readings), simulated=self.simulated)

    def close_devices(self) -> None:
        for g in self._gpus or ():
            for inst in g.mig or ():
                self._free(inst)
        self._gpus = None

    def _warn_once(self, key: str, msg: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg)

    def _running(self, handle: Any) -> list[Any]:
        """Compute processes, falling back to ``_v2`` where the driver predates ``_v3``."""
        nvml = self.nvml
        if self._running_fn is not None:
            return self._running_fn(handle)
        missing = (
            nvml_error(nvml, "FunctionNotFound"),
            getattr(nvml, "NVMLLibraryMismatchError", nvml_error(nvml, "FunctionNotFound")),
        )
        try:
            result = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            self._running_fn = nvml.nvmlDeviceGetComputeRunningProcesses
        except missing:
            result = nvml.nvmlDeviceGetComputeRunningProcesses_v2(handle)
            self._running_fn = nvml.nvmlDeviceGetComputeRunningProcesses_v2
        return list(result)

    @staticmethod
    def _memory(p: Any) -> int | None:
        used = getattr(p, "usedGpuMemory", None)
        return None if used is None else int(used)

    def _sample_gpu(self, gpu: _Gpu, out: list[ProcessSample]) -> DeviceReading:
        nvml = self.nvml
        running = self._running(gpu.handle)
        util_by_pid: dict[int, float] = {}
        attribution = Attribution.PER_PROCESS
        device_util: float | None = None
        if gpu.util_supported:
            try:
                samples = nvml.nvmlDeviceGetProcessUtilization(gpu.handle, gpu.last_seen_ts)
            except nvml_error(nvml, "NotFound"):
                samples = []  # no process ran a kernel since last time: idle, not an error
            except nvml_error(nvml, "NotSupported"):
                gpu.util_supported = False
                samples = []
            for s in samples:
                pid = int(s.pid)
                # Several samples per PID come back when the tick is longer than the
                # driver's sampling period; any activity in the tick counts.
                util_by_pid[pid] = max(util_by_pid.get(pid, 0.0), float(s.smUtil))
                gpu.last_seen_ts = max(gpu.last_seen_ts, int(s.timeStamp))
        if not gpu.util_supported:
            device_util = self._device_util(gpu)
            attribution = (
                Attribution.PER_INSTANCE if device_util is not None else Attribution.UNAVAILABLE
            )
        seen = set()
        for p in running:
            pid = int(p.pid)
            seen.add(pid)
            if attribution is Attribution.PER_PROCESS:
                util: float | None = util_by_pid.get(pid, 0.0)
            else:
                util = device_util
            out.append(ProcessSample(pid, gpu.uuid, self._memory(p), util, attribution))
        # A process can have utilization samples but be gone from the running list (it
        # just exited); its activity in this tick still counts.
        for pid, u in util_by_pid.items():
            if pid not in seen:
                out.append(ProcessSample(pid, gpu.uuid, None, u, attribution))
        if attribution is Attribution.PER_PROCESS:
            device_util = min(100.0, sum(util_by_pid.values()))
        return DeviceReading(gpu.uuid, attribution, device_util)

    def _device_util(self, gpu: _Gpu) -> float | None:
        try:
            return float(self.nvml.nvmlDeviceGetUtilizationRates(gpu.handle).gpu)
        except (self.nvml.NVMLError, AttributeError):
            return None

    def _sample_mig(self, gpu: _Gpu, out: list[ProcessSample]) -> list[DeviceReading]:
        readings = []
        for inst in gpu.mig or ():
            util = None
            if gpu.gpm:
                try:
                    util = self._gpm_util(gpu, inst)
                except self.nvml.NVMLError as e:
                    # GPM advertised but refused for MIG (driver/firmware without MIG
                    # GPM): say "unavailable" from now on rather than fail every tick.
                    self._warn_once(f"gpm:{gpu.uuid}", f"GPM unusable on {gpu.uuid}: {e!r}")
                    gpu.gpm = False
                    for other in gpu.mig or ():
                        self._free(other)
            attribution = Attribution.PER_INSTANCE if gpu.gpm else Attribution.UNAVAILABLE
            for p in self._running(inst.handle):
                out.append(ProcessSample(int(p.pid), inst.uuid, self._memory(p), util, attribution))
            readings.append(DeviceReading(inst.uuid, attribution, util, parent_uuid=gpu.uuid))
        return readings

    def _gpm_util(self, gpu: _Gpu, inst: _Instance) -> float | None:
        """Instance activity between the previous tick's GPM sample and this one's;
        ``None`` on the first tick, which has nothing to diff against."""
        nvml = self.nvml
        if inst.gi_id is None:
            return None
        sample = nvml.nvmlGpmSampleAlloc()
        try:
            nvml.nvmlGpmMigSampleGet(gpu.handle, inst.gi_id, sample)
        except nvml.NVMLError:
            nvml.nvmlGpmSampleFree(sample)
            raise
        prev, inst.gpm_prev = inst.gpm_prev, sample
        if prev is None:
            return None
        try:
            return gpm_graphics_util(nvml, prev, sample)
        finally:
            nvml.nvmlGpmSampleFree(prev)


def gpm_graphics_util(nvml: Any, before: Any, after: Any) -> float | None:
    """GPM's "percentage of time any compute/graphics app was active" between two samples:
    the instance-level counterpart of utilization.gpu, which is what idleness is about.
    None when NVML has no figure for it."""
    mg = nvml.c_nvmlGpmMetricsGet_t()
    mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 1
    mg.sample1 = before
    mg.sample2 = after
    mg.metrics[0].metricId = nvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    nvml.nvmlGpmMetricsGet(mg)
    if mg.metrics[0].nvmlReturn != 0:
        return None
    return float(mg.metrics[0].value)
