"""The ``nvml`` backend: real GPUs and MIG instances on this host, read through NVML.

The pynvml module is a parameter so tests pass :mod:`tests.fakes.fake_pynvml`.
"""

from __future__ import annotations

import logging
import os
import socket
from types import ModuleType
from typing import Any

import psutil

from ..model import GPU, Host, Inventory, MigInstance, MigMode
from .errors import GPUDiscoveryError
from .profiles import DEFAULT_COMPUTE_SLICES, compute_milli, profile_memory_gb, profile_name

log = logging.getLogger(__name__)


NO_DRIVER_HINT = (
    "If this machine has no NVIDIA GPU, choose the 'simulated' backend explicitly "
    "(GPUs declared in config, clearly labelled as simulated), or 'static' to declare "
    "GPUs on hosts the hub cannot see."
)


class NoDriverError(GPUDiscoveryError):
    """NVML's library or the kernel driver is missing: there is no GPU to discover here."""


class _NeverRaised(Exception):
    pass


def nvml_error(nvml: Any, name: str) -> type[BaseException]:
    """``NVMLError_<name>`` from *nvml*; an exception nothing raises if this pynvml
    predates that error code, so ``except`` clauses stay valid on old versions."""
    cls = getattr(nvml, f"NVMLError_{name}", None)
    return cls if isinstance(cls, type) else _NeverRaised


def default_nvml_module() -> ModuleType | Any:
    """The ``pynvml`` module. Tests put a fake in its place in the processes they start
    (tests/fakes); a fake says so (``FAKE``), and its readings are marked simulated."""
    import pynvml

    if getattr(pynvml, "FAKE", False):
        log.warning("pynvml is a FAKE driver here: GPU readings are simulated, not real GPUs")
    return pynvml


def as_str(value: Any) -> str:
    # pynvml returns bytes from some versions and str from others.
    return value.decode() if isinstance(value, bytes) else str(value)


def init_nvml(nvml: Any) -> None:
    """``nvmlInit`` with a clear error when there is no driver."""
    no_driver = (nvml_error(nvml, "LibraryNotFound"), nvml_error(nvml, "DriverNotLoaded"))
    try:
        nvml.nvmlInit()
    except no_driver as e:
        raise NoDriverError(f"No NVIDIA driver was found (NVML: {e}). {NO_DRIVER_HINT}") from e
    except nvml.NVMLError as e:
        raise GPUDiscoveryError(f"NVML failed to initialise: {e}") from e


def shutdown_nvml(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except nvml.NVMLError as e:  # nothing useful to do; the process keeps going
        log.debug("nvmlShutdown failed: %s", e)


def nvml_available(nvml: Any = None) -> bool:
    """True when NVML loads and a driver answers (GPU count may still be 0)."""
    if nvml is None:
        try:
            nvml = default_nvml_module()
        except ImportError:
            return False
    try:
        nvml.nvmlInit()
    except nvml.NVMLError:
        return False
    shutdown_nvml(nvml)
    return True


def memory_total_mib(nvml: Any, handle: Any) -> int:
    """Total memory, preferring the versioned v2 call; drivers before R510 lack it."""
    fallback = (
        nvml_error(nvml, "FunctionNotFound"),
        nvml_error(nvml, "NotSupported"),
        nvml_error(nvml, "ArgumentVersionMismatch"),
        TypeError,  # a pynvml too old to take ``version``
    )
    version = getattr(nvml, "nvmlMemory_v2", None)
    info = None
    if version is not None:
        try:
            info = nvml.nvmlDeviceGetMemoryInfo(handle, version=version)
        except fallback:
            info = None
    if info is None:
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
    return int(info.total) // (1024 * 1024)


def mig_mode(nvml: Any, handle: Any) -> MigMode:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except (nvml_error(nvml, "NotSupported"), nvml_error(nvml, "FunctionNotFound")):
        return MigMode.UNSUPPORTED
    return MigMode.ENABLED if current == nvml.NVML_DEVICE_MIG_ENABLE else MigMode.DISABLED


def total_compute_slices(nvml: Any, handle: Any) -> int:
    """How many compute slices the full GPU has (7 on A100/H100, 4 on A30)."""
    for const in (
        "NVML_GPU_INSTANCE_PROFILE_8_SLICE",
        "NVML_GPU_INSTANCE_PROFILE_7_SLICE",
        "NVML_GPU_INSTANCE_PROFILE_6_SLICE",
        "NVML_GPU_INSTANCE_PROFILE_4_SLICE",
    ):
        profile = getattr(nvml, const, None)
        if profile is None:
            continue
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except nvml.NVMLError:
            continue
        if getattr(info, "sliceCount", 0):
            return int(info.sliceCount)
    return DEFAULT_COMPUTE_SLICES


def mig_handles(nvml: Any, handle: Any) -> list[tuple[int, Any]]:
    """``(index, handle)`` of the MIG devices that exist; NVML reports holes in the index
    range as NotFound or InvalidArgument depending on the driver, which are skipped."""
    holes = (nvml_error(nvml, "NotFound"), nvml_error(nvml, "InvalidArgument"))
    found = []
    for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            found.append((j, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)))
        except holes:
            continue
    return found


def _optional_id(nvml: Any, fn_name: str, handle: Any) -> int | None:
    try:
        return int(getattr(nvml, fn_name)(handle))
    except (nvml.NVMLError, AttributeError):
        return None


def read_mig_instances(nvml: Any, handle: Any, gpu_mib: int) -> tuple[MigInstance, ...]:
    total = total_compute_slices(nvml, handle)
    instances = []
    for _j, mh in mig_handles(nvml, handle):
        attrs = nvml.nvmlDeviceGetAttributes(mh)
        gi_slices = int(attrs.gpuInstanceSliceCount)
        ci_slices = int(attrs.computeInstanceSliceCount) or gi_slices
        mem_mib = int(attrs.memorySizeMB)
        instances.append(
            MigInstance(
                uuid=as_str(nvml.nvmlDeviceGetUUID(mh)),
                profile=profile_name(gi_slices, profile_memory_gb(mem_mib, gpu_mib), ci_slices),
                memory_mib=mem_mib,
                milli=compute_milli(ci_slices, total),
                gi_id=_optional_id(nvml, "nvmlDeviceGetGpuInstanceId", mh),
                ci_id=_optional_id(nvml, "nvmlDeviceGetComputeInstanceId", mh),
            )
        )
    return tuple(instances)


def read_gpu(nvml: Any, index: int, host: str) -> GPU:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    memory = memory_total_mib(nvml, handle)
    mode = mig_mode(nvml, handle)
    return GPU(
        uuid=as_str(nvml.nvmlDeviceGetUUID(handle)),
        host=host,
        index=index,
        model=as_str(nvml.nvmlDeviceGetName(handle)),
        memory_mib=memory,
        mig_mode=mode,
        mig_instances=read_mig_instances(nvml, handle, memory) if mode is MigMode.ENABLED else (),
    )


def local_cpu_milli() -> int:
    # The CPUs this process may run on (a cpuset in a container), not the machine's.
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = psutil.cpu_count() or 1
    return n * 1000


def local_memory_mib() -> int:
    return int(psutil.virtual_memory().total) // (1024 * 1024)


def discover_nvml(nvml: Any = None, hostname: str | None = None) -> Inventory:
    if nvml is None:
        try:
            nvml = default_nvml_module()
        except ImportError as e:
            raise NoDriverError(
                f"nvidia-ml-py (pynvml) is not installed ({e}). {NO_DRIVER_HINT}"
            ) from e
    host = hostname or socket.gethostname()
    init_nvml(nvml)
    try:
        gpus = []
        lost = nvml_error(nvml, "GpuIsLost")
        for i in range(int(nvml.nvmlDeviceGetCount())):
            try:
                gpus.append(read_gpu(nvml, i, host))
            except lost:
                # Offering a fallen-off-the-bus GPU would hand users a dead device.
                log.error("GPU %d on %s is lost (needs a reset); leaving it out", i, host)
    except nvml.NVMLError as e:
        raise GPUDiscoveryError(f"NVML failed while reading GPUs on {host}: {e!r}") from e
    finally:
        shutdown_nvml(nvml)
    return Inventory(
        backend="nvml",
        hosts=(Host(host, local_cpu_milli(), local_memory_mib(), tuple(gpus)),),
        simulated=bool(getattr(nvml, "FAKE", False)),
    )
