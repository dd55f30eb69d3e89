"""A fake NVML driver with the subset of the ``pynvml`` API that gpuslice uses.

Tests drive its state: devices, MIG mode and MIG devices, per-process memory and
utilization, GPM support, and errors to inject per call. The exception classes and
constants *are* those of nvidia-ml-py (re-exported, not copied), so
``except pynvml.NVMLError_NotFound`` catches what the fake raises, and
``fake.NVMLError(fake.NVML_ERROR_NOT_FOUND)`` maps to the subclass exactly as pynvml does.

Two ways to use it:

* In-process: ``nvml = FakeNVML(state)`` and pass *nvml* wherever a pynvml module is taken;
  ``nvml.state`` (a dict) may be changed between calls.
* Across processes: write the state as JSON (:func:`write_state`, atomic) and start the
  other process with ``GPUSLICE_FAKE_NVML=/path/state.json``; gpuslice then uses
  ``FakeNVML.from_file(path)``, which re-reads the file whenever it changes, so a test can
  make a kernel's process busy or idle by rewriting the file.

State (JSON-compatible; every key optional)::

    {
      "driver": "ok" | "library_not_found" | "driver_not_loaded",
      "devices": [{
        "uuid": "GPU-…", "name": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920,
        "mig_mode": "disabled" | "enabled" | "unsupported",
        "memory_v2": true,            # false: driver without nvmlDeviceGetMemoryInfo_v2
        "compute_slices": 7,          # sliceCount of the full GPU-instance profile
        "max_mig_devices": 7,
        "mig_devices": [              # by MIG index; null or an error name is a hole
          {"uuid": "MIG-…", "gi_slices": 3, "ci_slices": 3, "memory_mib": 40192,
           "gi_id": 2, "ci_id": 0, "gpm_util": 35.0, "processes": [...]},
          null, "InvalidArgument"],
        "processes": [{"pid": 1234, "used_memory_mib": 512, "sm_util": 40, "mem_util": 3}],
        "process_utilization": true,  # false: nvmlDeviceGetProcessUtilization NotSupported
        "gpu_util": 0,                # nvmlDeviceGetUtilizationRates(...).gpu
        "gpm": false                  # GPM metrics supported (Hopper and later)
      }],
      "errors": {"nvmlDeviceGetMigMode": "NotSupported",     # every call
                 "nvmlDeviceGetUUID@1": "GpuIsLost",          # device 1 only
                 "nvmlDeviceGetUUID@0/2": "Unknown"}          # MIG device 2 of GPU 0
    }

A process whose ``sm_util`` is absent or null had no utilization samples (NVML omits it);
one with a number gets one fresh sample per ``nvmlDeviceGetProcessUtilization`` call, newer
than any earlier one, so the ``lastSeenTimeStamp`` protocol behaves as with the driver.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml as _real

_EXPORTED = {
    name: getattr(_real, name)
    for name in dir(_real)
    if name.startswith(("NVMLError", "NVML_", "nvmlMemory_v")) or name == "NVMLLibraryMismatchError"
}


@dataclass(frozen=True)
class _Device:
    index: int


@dataclass(frozen=True)
class _MigDevice:
    parent: int
    index: int


class _GpmSample:
    def __init__(self) -> None:
        self.util: float | None = None
        self.freed = False


class _GpmMetric:
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = 0
        self.value = 0.0


class c_nvmlGpmMetricsGet_t:
    """Python stand-in for pynvml's ctypes struct (which only holds ctypes pointers)."""

    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_GpmMetric() for _ in range(_real.NVML_GPM_METRIC_MAX)]


def write_state(path: str | os.PathLike[str], state: dict[str, Any]) -> None:
    """Write *state* atomically, so a reader in another process never sees half a file."""
    directory = os.path.dirname(os.fspath(path)) or "."
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".fake-nvml-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(state, f)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


class FakeNVML:
    """An object that quacks like the ``pynvml`` module, backed by a state dict."""

    FAKE = True

    def __init__(self, state: dict[str, Any] | None = None) -> None:
        for name, value in _EXPORTED.items():
            setattr(self, name, value)
        self.c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t
        self._state: dict[str, Any] = copy.deepcopy(state) if state else {}
        self._path: str | None = None
        self._file_key: tuple[int, int, int] | None = None
        self._lock = threading.Lock()
        self._last_ts = 0
        self.init_count = 0
        self.calls: Counter[str] = Counter()
        # the lastSeenTimeStamp each nvmlDeviceGetProcessUtilization call was given
        self.util_timestamps_asked: list[int] = []

    # ---- state -------------------------------------------------------------------------

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> FakeNVML:
        fake = cls()
        fake._path = os.fspath(path)
        fake._reload()
        return fake

    @property
    def state(self) -> dict[str, Any]:
        self._reload()
        return self._state

    @state.setter
    def state(self, value: dict[str, Any]) -> None:
        self._state = value

    def _reload(self) -> None:
        if self._path is None:
            return
        try:
            st = os.stat(self._path)
        except FileNotFoundError:
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == self._file_key:
            return
        with open(self._path) as f:
            self._state = json.load(f)
        self._file_key = key

    def _enter(self, fn: str, handle: Any = None, *, needs_init: bool = True) -> dict[str, Any]:
        self.calls[fn] += 1
        state = self.state
        errors = state.get("errors") or {}
        where = None
        if isinstance(handle, _Device):
            where = str(handle.index)
        elif isinstance(handle, _MigDevice):
            where = f"{handle.parent}/{handle.index}"
        err = errors.get(f"{fn}@{where}") if where is not None else None
        if err is None:
            err = errors.get(fn)
        if err is not None:
            raise self._error(err)
        if needs_init and self.init_count <= 0:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)
        return state

    @staticmethod
    def _error(err: str | int) -> BaseException:
        if err == "LibraryMismatch":
            return _real.NVMLLibraryMismatchError("fake: unversioned function not in driver")
        if isinstance(err, int):
            return _real.NVMLError(err)
        cls = getattr(_real, f"NVMLError_{err}", None)
        if cls is None:
            raise ValueError(f"fake_pynvml: no error class NVMLError_{err}")
        return cls()

    def _devices(self) -> list[dict[str, Any]]:
        return list(self.state.get("devices") or [])

    def _dev(self, handle: Any) -> dict[str, Any]:
        devices = self._devices()
        if isinstance(handle, _Device) and 0 <= handle.index < len(devices):
            return devices[handle.index]
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)

    def _mig(self, handle: Any) -> dict[str, Any]:
        if not isinstance(handle, _MigDevice):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        migs = self._dev(_Device(handle.parent)).get("mig_devices") or []
        entry = migs[handle.index] if handle.index < len(migs) else None
        if not isinstance(entry, dict):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return entry

    def _entry(self, handle: Any) -> dict[str, Any]:
        return self._mig(handle) if isinstance(handle, _MigDevice) else self._dev(handle)

    # ---- init ----------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        state = self._enter("nvmlInit", needs_init=False)
        driver = state.get("driver", "ok")
        if driver == "library_not_found":
            raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if driver == "driver_not_loaded":
            raise _real.NVMLError(_real.NVML_ERROR_DRIVER_NOT_LOADED)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self._enter("nvmlSystemGetDriverVersion").get("driver_version", "550.0-fake"))

    # ---- devices -------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._devices())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Device:
        self._enter("nvmlDeviceGetHandleByIndex", _Device(index))
        handle = _Device(index)
        self._dev(handle)
        return handle

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> _Device:
        self._enter("nvmlDeviceGetHandleByUUID")
        want = uuid.decode() if isinstance(uuid, bytes) else uuid
        for i, d in enumerate(self._devices()):
            if d.get("uuid") == want:
                return _Device(i)
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetIndex", handle)
        self._dev(handle)
        return int(handle.index)

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetUUID", handle)
        entry = self._entry(handle)
        if isinstance(handle, _MigDevice):
            return str(entry.get("uuid", f"MIG-fake-{handle.parent}-{handle.index}"))
        return str(entry.get("uuid", f"GPU-fake-{handle.index}"))

    def nvmlDeviceGetName(self, handle: Any) -> str:
        self._enter("nvmlDeviceGetName", handle)
        return str(self._dev(handle).get("name", "NVIDIA Fake GPU"))

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        if version:
            self._enter("nvmlDeviceGetMemoryInfo_v2", handle)
            if not self._dev_of(handle).get("memory_v2", True):
                raise _real.NVMLError(_real.NVML_ERROR_FUNCTION_NOT_FOUND)
        else:
            self._enter("nvmlDeviceGetMemoryInfo", handle)
        entry = self._entry(handle)
        total = int(entry.get("memory_mib", 0)) * 1024 * 1024
        used = sum(int(p.get("used_memory_mib") or 0) * 1024 * 1024 for p in self._procs_of(handle))
        return SimpleNamespace(total=total, used=used, free=max(0, total - used), reserved=0)

    def _dev_of(self, handle: Any) -> dict[str, Any]:
        if isinstance(handle, _MigDevice):
            return self._dev(_Device(handle.parent))
        return self._dev(handle)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetUtilizationRates", handle)
        dev = self._dev(handle)
        if self._mig_enabled(dev):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return SimpleNamespace(gpu=int(dev.get("gpu_util", 0)), memory=0)

    # ---- MIG -----------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        self._enter("nvmlDeviceGetMigMode", handle)
        mode = self._dev(handle).get("mig_mode", "disabled")
        if mode == "unsupported":
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        value = 1 if mode == "enabled" else 0
        return [value, value]

    def _mig_enabled(self, dev: dict[str, Any]) -> bool:
        return dev.get("mig_mode") == "enabled"

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetMaxMigDeviceCount", handle)
        dev = self._dev(handle)
        if dev.get("mig_mode") == "unsupported":
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        return int(dev.get("max_mig_devices", 7))

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> _MigDevice:
        self._enter("nvmlDeviceGetMigDeviceHandleByIndex", _MigDevice(handle.index, index))
        dev = self._dev(handle)
        if not self._mig_enabled(dev) or index >= int(dev.get("max_mig_devices", 7)):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        migs = dev.get("mig_devices") or []
        entry = migs[index] if index < len(migs) else None
        if isinstance(entry, str):
            raise self._error(entry)
        if entry is None:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return _MigDevice(handle.index, index)

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        self._enter("nvmlDeviceIsMigDeviceHandle", handle)
        return int(isinstance(handle, _MigDevice))

    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any) -> _Device:
        self._enter("nvmlDeviceGetDeviceHandleFromMigDeviceHandle", handle)
        self._mig(handle)
        return _Device(handle.parent)

    def nvmlDeviceGetAttributes(self, handle: Any) -> Any:
        self._enter("nvmlDeviceGetAttributes", handle)
        entry = self._entry(handle)
        if isinstance(handle, _MigDevice):
            gi = int(entry.get("gi_slices", 1))
            ci = int(entry.get("ci_slices", gi))
        else:
            gi = ci = int(entry.get("compute_slices", 7))
        return SimpleNamespace(
            gpuInstanceSliceCount=gi,
            computeInstanceSliceCount=ci,
            memorySizeMB=int(entry.get("memory_mib", 0)),
            multiprocessorCount=gi * 14,
        )

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetGpuInstanceId", handle)
        return int(self._mig(handle).get("gi_id", handle.index))

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetComputeInstanceId", handle)
        return int(self._mig(handle).get("ci_id", 0))

    def nvmlDeviceGetGpuInstanceProfileInfo(
        self, handle: Any, profile: int, version: int = 2
    ) -> Any:
        self._enter("nvmlDeviceGetGpuInstanceProfileInfo", handle)
        dev = self._dev(handle)
        if not self._mig_enabled(dev):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        total = int(dev.get("compute_slices", 7))
        slices = {
            _real.NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1,
            _real.NVML_GPU_INSTANCE_PROFILE_2_SLICE: 2,
            _real.NVML_GPU_INSTANCE_PROFILE_3_SLICE: 3,
            _real.NVML_GPU_INSTANCE_PROFILE_4_SLICE: 4,
            _real.NVML_GPU_INSTANCE_PROFILE_7_SLICE: 7,
            _real.NVML_GPU_INSTANCE_PROFILE_8_SLICE: 8,
            _real.NVML_GPU_INSTANCE_PROFILE_6_SLICE: 6,
        }.get(profile)
        if slices is None or slices > total or (total == 4 and slices == 3):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        mem = int(dev.get("memory_mib", 0)) * slices // total
        return SimpleNamespace(id=profile, sliceCount=slices, memorySizeMB=mem)

    # ---- processes -----------------------------------------------------------------------

    def _procs_of(self, handle: Any) -> list[dict[str, Any]]:
        if isinstance(handle, _MigDevice):
            return list(self._mig(handle).get("processes") or [])
        dev = self._dev(handle)
        procs = list(dev.get("processes") or [])
        for mig in dev.get("mig_devices") or []:
            if isinstance(mig, dict):
                procs += list(mig.get("processes") or [])
        return procs

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses", handle)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[Any]:
        return self._running("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def _running(self, fn: str, handle: Any) -> list[Any]:
        self._enter(fn, handle)
        out = []
        gi_of = {}
        if isinstance(handle, _MigDevice):
            mig = self._mig(handle)
            gi_of = {id(p): (mig.get("gi_id"), mig.get("ci_id", 0)) for p in self._procs_of(handle)}
        else:
            for mig in self._dev(handle).get("mig_devices") or []:
                if isinstance(mig, dict):
                    for p in mig.get("processes") or []:
                        gi_of[id(p)] = (mig.get("gi_id"), mig.get("ci_id", 0))
        for p in self._procs_of(handle):
            mem = p.get("used_memory_mib")
            gi, ci = gi_of.get(id(p), (0xFFFFFFFF, 0xFFFFFFFF))
            out.append(
                SimpleNamespace(
                    pid=int(p["pid"]),
                    usedGpuMemory=None if mem is None else int(mem) * 1024 * 1024,
                    gpuInstanceId=gi,
                    computeInstanceId=ci,
                )
            )
        return out

    def _timestamp(self) -> int:
        with self._lock:
            self._last_ts = max(self._last_ts + 1, time.time_ns() // 1000)
            return self._last_ts

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list[Any]:
        self._enter("nvmlDeviceGetProcessUtilization", handle)
        self.util_timestamps_asked.append(int(timeStamp))
        dev = self._dev_of(handle)
        if isinstance(handle, _MigDevice) or self._mig_enabled(dev):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        if not dev.get("process_utilization", True):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        ts = self._timestamp()
        samples = [
            SimpleNamespace(
                pid=int(p["pid"]),
                timeStamp=ts,
                smUtil=int(p["sm_util"]),
                memUtil=int(p.get("mem_util") or 0),
                encUtil=0,
                decUtil=0,
            )
            for p in self._procs_of(handle)
            if p.get("sm_util") is not None and ts > timeStamp
        ]
        if not samples:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)
        return samples

    # ---- GPM (per-instance metrics, Hopper and later) -------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        self._enter("nvmlGpmQueryDeviceSupport", handle)
        return SimpleNamespace(version=1, isSupportedDevice=int(bool(self._dev(handle).get("gpm"))))

    def nvmlGpmSampleAlloc(self) -> _GpmSample:
        self._enter("nvmlGpmSampleAlloc")
        return _GpmSample()

    def nvmlGpmSampleFree(self, sample: _GpmSample) -> None:
        self._enter("nvmlGpmSampleFree")
        sample.freed = True

    def nvmlGpmSampleGet(self, handle: Any, sample: _GpmSample) -> _GpmSample:
        self._enter("nvmlGpmSampleGet", handle)
        dev = self._dev(handle)
        if not dev.get("gpm"):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        sample.util = float(dev.get("gpm_util", 0.0))
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpuInstanceId: int, sample: _GpmSample) -> Any:
        self._enter("nvmlGpmMigSampleGet", handle)
        dev = self._dev(handle)
        if not dev.get("gpm"):
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        for mig in dev.get("mig_devices") or []:
            if isinstance(mig, dict) and mig.get("gi_id") == gpuInstanceId:
                sample.util = float(mig.get("gpm_util", 0.0))
                return sample
        raise _real.NVMLError(_real.NVML_ERROR_NOT_FOUND)

    def nvmlGpmMetricsGet(self, metricsGet: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        s1, s2 = metricsGet.sample1, metricsGet.sample2
        if not isinstance(s1, _GpmSample) or not isinstance(s2, _GpmSample) or s2.util is None:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        for m in metricsGet.metrics[: metricsGet.numMetrics]:
            m.nvmlReturn = 0
            m.value = s2.util
        return metricsGet


# The module itself also works as a pynvml stand-in (``nvml=fake_pynvml``), backed by one
# shared instance; ``reset(state)`` gives it a fresh state.
DEFAULT = FakeNVML()


def reset(state: dict[str, Any] | None = None) -> FakeNVML:
    global DEFAULT
    DEFAULT = FakeNVML(state)
    return DEFAULT


def __getattr__(name: str) -> Any:
    return getattr(DEFAULT, name)
