"""Deadlines, warnings, keep-alive and culls for idle GPU sessions.

Pure: every call takes ``now``; nothing reads a clock. Fed once per sampling tick with each
kernel's :class:`~gpuslice.activity.IdleState` and whether it is active right now.

* A kernel's deadline is the start of its idle run plus the idle timeout plus whatever
  keep-alive added to this run.
* The warning goes out ``warning_lead`` seconds before the deadline. A cull never happens
  less than ``warning_lead`` after its warning: if the warning went out late (the server
  just started, a tick stalled), the deadline moves back to warning + lead.
* A kernel that is executing or using the GPU at this tick is never culled, and its
  idle run (with its warning and extensions) ends there. A deadline the user was given by
  keep-alive is a promise, though: a later idle run is never culled before it.
* With ``action="server"`` there is one deadline for the whole server: every kernel and
  the server's own GPU processes must be idle, and the run starts when the last of them
  went idle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..activity import SERVER_KEY, IdleState
from ..errors import GPUSliceError
from ..idle_policy import IdlePolicy
from .decisions import CULLED, EXTENDED, WARNING, Decision

SERVER_SCOPE = SERVER_KEY  # the key of the single watch in "server" mode


class ExtensionRefused(GPUSliceError, ValueError):
    def __init__(self, message: str, left: float) -> None:
        super().__init__(message)
        self.left = left


@dataclass
class _Watch:
    idle_since: float | None = None
    idle_seconds: float = 0.0
    extra: float = 0.0  # seconds keep-alive added to this idle run
    used: float = 0.0  # keep-alive seconds granted in this idle run
    warned_at: float | None = None
    warned_deadline: float | None = None
    culled: bool = False
    last_active: float | None = None
    retry_at: float | None = None
    # The deadline keep-alive last announced. It outlives the idle run: starting a kernel
    # (activity, so a new run) must not bring back a cull the user was told was put off.
    promised: float | None = None
    # When the promised deadline was warned about: a new idle run that keeps that deadline
    # is not warned about again (one warning per deadline).
    promise_warned_at: float | None = None

    def new_run(self, idle_since: float | None) -> None:
        self.idle_since = idle_since
        self.extra = self.used = 0.0
        self.warned_at = self.warned_deadline = self.retry_at = None
        self.culled = False


class Reclaimer:
    def __init__(self, policy: IdlePolicy) -> None:
        self.policy = policy
        self._watches: dict[str, _Watch] = {}

    # -- ticks ----------------------------------------------------------------------------

    def observe(
        self,
        now: float,
        states: Mapping[str, IdleState],
        active: Mapping[str, bool],
    ) -> list[Decision]:
        """*states* and *active* are keyed by kernel id, plus ``SERVER_KEY`` for the
        server's own GPU processes; a kernel missing from *states* has gone away."""
        if self.policy.action == "server":
            scopes = {SERVER_SCOPE: _combine(states, active)}
        else:
            scopes = {k: (s, active.get(k, False)) for k, s in states.items() if k != SERVER_KEY}
        for gone in set(self._watches) - set(scopes):
            del self._watches[gone]
        decisions: list[Decision] = []
        for key, (state, is_active) in scopes.items():
            watch = self._watches.setdefault(key, _Watch())
            decision = self._step(key, watch, state, is_active, now)
            if decision is not None:
                decisions.append(decision)
        return decisions

    def _step(
        self, key: str, w: _Watch, state: IdleState | None, is_active: bool, now: float
    ) -> Decision | None:
        if is_active:
            w.last_active = now
            w.new_run(None)
            return None
        since = state.idle_since if state is not None and state.is_idle else None
        if since is not None and w.last_active is not None and since <= w.last_active:
            # The tracker still counts a run that activity at this tick has ended; its
            # window has not closed yet.
            since = None
        if since != w.idle_since:
            w.new_run(since)
        if since is None or state is None:
            return None
        w.idle_seconds = state.idle_seconds
        if not self.policy.enabled or w.culled:
            return None
        if w.retry_at is not None and now < w.retry_at:
            return None
        deadline = self._deadline(w)
        assert deadline is not None
        kernel = None if key == SERVER_SCOPE and self.policy.action == "server" else key
        what = "the server" if kernel is None else "the kernel"
        if w.warned_at is None and w.promise_warned_at is not None and deadline == w.promised:
            # the same deadline as the warning already given: no second warning
            w.warned_at, w.warned_deadline = w.promise_warned_at, deadline
        if w.warned_at is None:
            if now < deadline - self.policy.warning_lead:
                return None
            w.warned_at = now
            w.warned_deadline = max(deadline, now + self.policy.warning_lead)
            if w.warned_deadline == w.promised:
                w.promise_warned_at = now
            return Decision(
                WARNING,
                kernel,
                w.warned_deadline,
                f"GPU idle for {state.idle_seconds:.0f} s; {what} will be "
                f"{'stopped' if kernel is None else 'shut down'} at the deadline unless it "
                "is used or kept alive",
                state.idle_seconds,
            )
        if now < deadline:
            return None
        w.culled = True
        return Decision(
            CULLED,
            kernel,
            deadline,
            f"GPU idle for {state.idle_seconds:.0f} s, past its {self.policy.idle_timeout:.0f} s "
            "timeout" + (f" and {w.used:.0f} s of keep-alives" if w.used else ""),
            state.idle_seconds,
        )

    def _deadline(self, w: _Watch) -> float | None:
        if w.idle_since is None or not self.policy.enabled:
            return None
        base = w.idle_since + self.policy.idle_timeout + w.extra
        if w.promised is not None:
            base = max(base, w.promised)
        if w.warned_at is not None:
            base = max(base, w.warned_at + self.policy.warning_lead)
        return base

    def cull_failed(self, key: str | None, now: float, retry_after: float = 60.0) -> None:
        """The cull could not be carried out (service unreachable): try again later."""
        w = self._watches.get(SERVER_SCOPE if key is None else key)
        if w is not None:
            w.culled = False
            w.retry_at = now + retry_after

    # -- queries --------------------------------------------------------------------------

    def scope_of(self, kernel_id: str) -> str:
        return SERVER_SCOPE if self.policy.action == "server" else kernel_id

    def deadline(self, kernel_id: str) -> float | None:
        w = self._watches.get(self.scope_of(kernel_id))
        return None if w is None else self._deadline(w)

    def warned(self, kernel_id: str) -> bool:
        w = self._watches.get(self.scope_of(kernel_id))
        return bool(w and w.warned_at is not None and not w.culled)

    def server_deadline(self) -> float | None:
        w = self._watches.get(SERVER_SCOPE)
        return None if w is None or self.policy.action != "server" else self._deadline(w)

    # -- keep-alive -----------------------------------------------------------------------

    def extension_left(self, keys: Iterable[str]) -> float:
        used = [self._watches[k].used for k in keys if k in self._watches]
        return max(0.0, self.policy.max_extension - max(used, default=0.0))

    def extend(
        self, kernel_ids: Iterable[str], seconds: float | None, now: float
    ) -> list[Decision]:
        """Move the deadlines of *kernel_ids* by *seconds* (default: one idle timeout, or
        what is left). Kernels with no idle run have nothing to move. All or nothing:
        beyond the admin's maximum raises :class:`ExtensionRefused`."""
        keys = sorted({self.scope_of(k) for k in kernel_ids})
        running = [
            k
            for k in keys
            if (w := self._watches.get(k)) and w.idle_since is not None and not w.culled
        ]
        left = self.extension_left(running)
        if seconds is None:
            seconds = min(self.policy.idle_timeout, left)
        if seconds <= 0 or seconds > left:
            # (short: the lab shows it in a toast of at most 140 characters)
            most = self.policy.max_extension
            raise ExtensionRefused(
                f"this idle period already has the maximum {most:g} s of keep-alives"
                if left <= 0
                else f"at most {left:g} s more of keep-alive (the maximum is {most:g} s)",
                left,
            )
        decisions = []
        for k in running:
            w = self._watches[k]
            current = self._deadline(w)
            assert current is not None and w.idle_since is not None
            new = max(current, now) + seconds
            w.extra = new - (w.idle_since + self.policy.idle_timeout)
            w.used += seconds
            w.promised = new
            w.warned_at = w.warned_deadline = w.promise_warned_at = None
            decisions.append(
                Decision(
                    EXTENDED,
                    None if k == SERVER_SCOPE and self.policy.action == "server" else k,
                    new,
                    f"kept alive by the user for {seconds:g} s",
                    w.idle_seconds,
                )
            )
        return decisions


def _combine(
    states: Mapping[str, IdleState], active: Mapping[str, bool]
) -> tuple[IdleState | None, bool]:
    """The server is idle when everything in it is; its run starts with the latest run."""
    if any(active.values()):
        return None, True
    if len(states) == 1:  # (the usual server: one kernel, whose state is the server's)
        (only,) = states.values()
        return (only, False) if only.is_idle else (None, False)
    if not states or not all(s.is_idle for s in states.values()):
        return None, False
    since = max(s.idle_since for s in states.values() if s.idle_since is not None)
    idle = min(s.idle_seconds for s in states.values())
    return IdleState(
        idle,
        since,
        all(s.gpu_evidence for s in states.values()),
        any(s.holds_memory for s in states.values()),
    ), False
