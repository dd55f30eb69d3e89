"""Idle time, accumulated over whole windows.

Time is cut into consecutive windows (default 30 s) from the first observation. A window
counts as idle when it had at least one observation, every utilization figure in it was
under the threshold (default 1 %) and the kernel executed nothing during it. Idle time is
the length of the unbroken run of idle windows up to now; one busy window resets it. A
window with no observation at all (the sampler stalled) neither adds nor resets: there is
no evidence either way.

Where utilization is unknown (MIG without GPM), only execution decides, and the state says
so (``gpu_evidence=False``), so the UI can tell the user the GPU could not be observed.

Pure: every call takes ``now``; nothing here reads a clock or sleeps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .samples import ActivityReport

DEFAULT_WINDOW = 30.0
DEFAULT_THRESHOLD = 1.0  # percent
SERVER_KEY = ""  # IdleTrackers key for the server's own (non-kernel) GPU activity


@dataclass(frozen=True)
class IdleState:
    idle_seconds: float
    idle_since: float | None  # start of the first window of the current idle run
    gpu_evidence: bool  # every window in the run had utilization figures
    holds_memory: bool  # GPU memory was held at the last observation

    @property
    def is_idle(self) -> bool:
        return self.idle_seconds > 0


class IdleTracker:
    def __init__(self, window: float = DEFAULT_WINDOW, threshold: float = DEFAULT_THRESHOLD):
        if window <= 0:
            raise ValueError(f"window must be positive, got {window!r}")
        self.window = window
        self.threshold = threshold
        self._window_start: float | None = None
        self._observed = 0
        self._busy = False
        self._util_unknown = False
        self._idle_seconds = 0.0
        self._idle_since: float | None = None
        self._evidence = True
        self._holds_memory = False

    @property
    def state(self) -> IdleState:
        return IdleState(
            self._idle_seconds,
            self._idle_since,
            self._evidence if self._idle_seconds else True,
            self._holds_memory,
        )

    def observe(
        self,
        now: float,
        util: float | None,
        executing: bool = False,
        last_execution: float | None = None,
        memory_bytes: int | None = None,
    ) -> IdleState:
        """Record one tick. *util* is the owner's utilization in percent (None: unknown);
        *executing* whether a cell is running now; *last_execution* when one last ran."""
        if self._window_start is None:
            self._window_start = now
        self._close_windows(now)
        ws = self._window_start
        self._observed += 1
        if util is None:
            self._util_unknown = True
        elif util >= self.threshold:
            self._busy = True
        if executing or (last_execution is not None and last_execution >= ws):
            self._busy = True
        self._holds_memory = bool(memory_bytes)
        return self.state

    def _close_windows(self, now: float) -> None:
        assert self._window_start is not None
        while now >= self._window_start + self.window:
            if self._observed and self._busy:
                self._idle_seconds = 0.0
                self._idle_since = None
                self._evidence = True
            elif self._observed:
                if self._idle_since is None:
                    self._idle_since = self._window_start
                    self._evidence = True
                self._idle_seconds += self.window
                self._evidence = self._evidence and not self._util_unknown
            self._window_start += self.window
            self._observed = 0
            self._busy = False
            self._util_unknown = False
            if now >= self._window_start + self.window:
                # The windows of a gap had no observation and change nothing: skip them
                # in one step rather than loop over days of empty windows.
                self._window_start += (now - self._window_start) // self.window * self.window


class IdleTrackers:
    """One :class:`IdleTracker` per kernel (and one for the server, key ``SERVER_KEY``),
    fed from :class:`ActivityReport` s; trackers of kernels that went away are dropped."""

    def __init__(self, window: float = DEFAULT_WINDOW, threshold: float = DEFAULT_THRESHOLD):
        self.window = window
        self.threshold = threshold
        self.trackers: dict[str, IdleTracker] = {}

    def update(
        self,
        report: ActivityReport,
        executing: Mapping[str, bool] | None = None,
        last_execution: Mapping[str, float] | None = None,
        now: float | None = None,
    ) -> dict[str, IdleState]:
        now = report.time if now is None else now
        executing = executing or {}
        last_execution = last_execution or {}
        owners = {SERVER_KEY: report.server, **report.kernels}
        for gone in set(self.trackers) - set(owners):
            del self.trackers[gone]
        states = {}
        for key, activity in owners.items():
            tracker = self.trackers.get(key)
            if tracker is None:
                tracker = self.trackers[key] = IdleTracker(self.window, self.threshold)
            states[key] = tracker.observe(
                now,
                activity.util,
                executing.get(key, False),
                last_execution.get(key),
                activity.memory_bytes,
            )
        return states
