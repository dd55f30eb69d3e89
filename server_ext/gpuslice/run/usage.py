"""GPU use of a batch job's kernel, written into ``state.json`` for the scheduler to pick up.

The same machinery as the server extension: NVML (or, for a simulated slice, the CPU use
of the process tree standing in for GPU use), processes attributed to the kernel through
their ancestry. While the kernel runs, it is sampled every few seconds, and every
``write_interval`` seconds the mean utilization since the previous write, the peak memory
and the time go into the state as ``utilization``, ``memory_mib`` and ``utilization_at``.

Measuring is a bystander: a GPU that cannot be read gives ``null`` figures and one line in
the job log, never a failed job.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..activity import DEFAULT_SAMPLE_INTERVAL, ActivitySampler, Attributor, make_source
from ..activity.usage import UsageWindow
from ..isotime import iso
from .jobdir import JobDir

DEFAULT_USAGE_INTERVAL = 30.0
USAGE_INTERVAL_ENV = "GPUSLICE_USAGE_INTERVAL"
KERNEL = "kernel"


def default_usage_interval() -> float:
    try:
        return float(os.environ.get(USAGE_INTERVAL_ENV) or DEFAULT_USAGE_INTERVAL)
    except ValueError:
        return DEFAULT_USAGE_INTERVAL


def source_kind(env: Any = None) -> str:
    """``simulated`` when the scheduler placed the job on a simulated slice, else ``nvml``
    (the scheduler sets ``GPUSLICE_SIMULATED=1`` in the job's environment)."""
    env = os.environ if env is None else env
    return "simulated" if env.get("GPUSLICE_SIMULATED") == "1" else "nvml"


class JobUsage:
    def __init__(self, jd: JobDir, write_interval: float, sample_interval: float = 0.0) -> None:
        self.jd = jd
        self.write_interval = write_interval
        # At least one sample per write, and no slower than the server extension samples.
        self.sample_interval = sample_interval or min(DEFAULT_SAMPLE_INTERVAL, write_interval)
        self.window = UsageWindow()
        self.kind = source_kind()
        self._sampler: ActivitySampler | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._task: asyncio.Task[None] | None = None
        self._error: str | None = None
        self._kernel_pid = 0

    @property
    def enabled(self) -> bool:
        return self.write_interval > 0

    def start(self, kernel_pid: int | None) -> None:
        if not self.enabled or not kernel_pid or self._task is not None:
            return
        self._kernel_pid = kernel_pid
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpuslice-usage")
        self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        """Stop sampling; what was measured since the last write is written now."""
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        if self.window.ticks:
            self._write(asyncio.get_running_loop().time())
        if self._executor is not None:
            # A sample in progress finishes (milliseconds) before NVML is shut down under it.
            self._executor.shutdown(wait=True)
        if self._sampler is not None:
            with contextlib.suppress(Exception):
                self._sampler.close()

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self.sample_interval)
            util, memory = await loop.run_in_executor(self._executor, self._sample)
            now = loop.time()
            self.window.add(now, util, memory)
            if self.window.elapsed(now) >= self.write_interval:
                self._write(now)

    def _sample(self) -> tuple[float | None, int | None]:
        """The kernel's utilization and memory now; (None, None) when the GPU cannot be
        read, said once in the job log (and again once it can be read, if ever)."""
        try:
            if self._sampler is None:
                source = make_source(self.kind)
                # Only the kernel's tree is the job's: the same user's notebook server on
                # the same GPU must not count for the batch job.
                self._sampler = ActivitySampler(source, Attributor(count_same_user=False))
            act = self._sampler.tick({KERNEL: self._kernel_pid}).kernels[KERNEL]
        except Exception as e:
            if self._error is None:
                self.jd.log(f"GPU utilization could not be read ({self.kind}): {e}")
            self._error = str(e)
            return None, None
        if self._error is not None:
            self.jd.log("GPU utilization can be read again")
            self._error = None
        return act.util, act.memory_bytes

    def _write(self, now: float) -> None:
        usage = self.window.take(now)
        self.jd.write_state(
            utilization=usage.utilization,
            memory_mib=usage.memory_mib,
            utilization_at=iso(time.time()),
        )
