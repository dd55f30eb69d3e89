"""The ``simulated`` activity source: CPU use standing in for GPU use, for machines with
no GPU. A process's "GPU utilization" is its CPU utilization, so a busy loop in a kernel
looks busy and a kernel left alone looks idle. Readings are marked simulated.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import psutil

from .samples import Attribution, DeviceReading, ProcessSample, SourceTick


def _default_device() -> str:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    return visible or "GPU-sim"


# Seconds simulated utilization is measured over, at least (see the class docstring).
HORIZON = 2.0


class SimulatedActivitySource:
    """Samples every process under the server (*server_pid*), the server itself excluded.

    *memory_mib* is the fake GPU memory a process holds once it has been busy (above
    *touch_threshold* percent), until it exits, the way a CUDA context stays allocated
    after the work is done; 0 (the default) reports no memory at all.

    Utilization is measured over at least *horizon* seconds: the kernel counts CPU time
    in 10 ms steps, so over a 0.5 s tick one step of an idle kernel's housekeeping reads
    as 2 % — busy, and its idle run would start over. Over 2 s one step is 0.5 %.
    """

    def __init__(
        self,
        server_pid: int | None = None,
        device: str | None = None,
        memory_mib: int = 0,
        touch_threshold: float = 1.0,
        clock: Callable[[], float] = time.time,
        horizon: float = HORIZON,
    ) -> None:
        self.server_pid = os.getpid() if server_pid is None else server_pid
        self.device = device or _default_device()
        self.memory_bytes = memory_mib * 1024 * 1024
        self.touch_threshold = touch_threshold
        self.clock = clock
        self.horizon = horizon
        # pid → (create_time, [(cpu seconds, wall time), ...]) of recent ticks, oldest
        # first, back to the newest one at least ``horizon`` old
        self._seen: dict[int, tuple[float, list[tuple[float, float]]]] = {}
        self._touched: set[tuple[int, float]] = set()

    def open(self) -> None:
        pass

    def close(self) -> None:
        self._seen.clear()

    def sample(self) -> SourceTick:
        now = self.clock()
        wall = time.time()
        try:
            children = psutil.Process(self.server_pid).children(recursive=True)
        except psutil.Error:
            children = []
        samples = []
        seen: dict[int, tuple[float, list[tuple[float, float]]]] = {}
        for proc in children:
            try:
                with proc.oneshot():
                    created = proc.create_time()
                    t = proc.cpu_times()
            except psutil.Error:
                continue  # exited between listing and reading
            cpu = t.user + t.system
            prev = self._seen.get(proc.pid)
            history = prev[1] if prev is not None and prev[0] == created else []
            history = [h for h in history if h[1] < wall]
            # the newest earlier reading at least ``horizon`` old, and those after it
            while len(history) > 1 and history[1][1] <= wall - self.horizon:
                history.pop(0)
            if history and history[0][1] <= wall - self.horizon:
                util = (cpu - history[0][0]) / (wall - history[0][1]) * 100
            else:
                # First sight, or seen for less than the horizon: average over the
                # process's life so far, so one tick tells a fresh busy loop from a
                # fresh idle kernel.
                util = cpu / max(wall - created, 1e-3) * 100
            util = max(0.0, min(100.0, util))
            seen[proc.pid] = (created, [*history, (cpu, wall)])
            key = (proc.pid, created)
            if util >= self.touch_threshold:
                self._touched.add(key)
            memory = self.memory_bytes if key in self._touched else 0
            samples.append(
                ProcessSample(proc.pid, self.device, memory, util, Attribution.PER_PROCESS)
            )
        self._seen = seen
        self._touched &= {(pid, v[0]) for pid, v in seen.items()}
        device_util = min(100.0, sum(s.util or 0.0 for s in samples))
        return SourceTick(
            now,
            tuple(samples),
            (DeviceReading(self.device, Attribution.PER_PROCESS, device_util),),
            simulated=True,
        )
