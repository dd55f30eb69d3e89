"""The sampling loop of one server: read GPU activity, apply the idle policy and memory
cap, and carry out what they decide (events, kernel shutdowns, reclaiming the slice)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ..activity import SERVER_KEY, Activity, ActivityReport, ActivitySampler, IdleTrackers
from ..activity.usage import total_memory, total_utilization
from ..idle_policy import IdlePolicy
from ..isotime import iso
from . import events
from .decisions import CULLED, EXTENDED, MEMORY_CULLED, RELEASED, Decision
from .memcap import MemoryCap
from .notifier import Notifier, notify
from .reclaim import Reclaimer
from .service import ServiceClient, ServiceError
from .usage_reporter import UsageReporter

MiB = 1024 * 1024
log = logging.getLogger("gpuslice.extension")


@dataclass
class SliceInfo:
    profile: str = ""
    display_name: str = ""  # as the spawn form showed it
    kind: str = ""
    gpu_milli: int = 0
    memory_mib: int = 0  # the slice's GPU memory: the share's cap, the MIG instance's, the GPU's
    memory_cap_mib: int = 0  # enforced per kernel by this extension (0: none, or MPS does)
    devices: tuple[str, ...] = ()
    simulated: bool = False
    user: str = ""


class Monitor:
    def __init__(
        self,
        *,
        sampler: ActivitySampler,
        trackers: IdleTrackers,
        policy: IdlePolicy,
        memcap: MemoryCap,
        kernel_manager: Any,
        event_logger: Any,
        web_settings: dict[str, Any],
        slice_info: SliceInfo,
        service: ServiceClient | None = None,
        policy_from_service: bool = True,
        notifier: Notifier | None = None,
        notify_without_tab_after: float = 120.0,
        keep_hub_activity: bool = True,
        usage_interval: float = 0.0,
        clock: Callable[[], float] = time.time,
        logger: logging.Logger | logging.LoggerAdapter[logging.Logger] | None = None,
    ) -> None:
        self.log = logger or log
        self.sampler = sampler
        self.trackers = trackers
        self.reclaimer = Reclaimer(policy)
        self.memcap = memcap
        self.km = kernel_manager
        self.event_logger = event_logger
        self.web_settings = web_settings
        self.slice = slice_info
        self.service = service
        self.policy_from_service = policy_from_service
        self.notifier = notifier
        self.notify_without_tab_after = notify_without_tab_after
        self.keep_hub_activity = keep_hub_activity
        self.clock = clock
        self.policy_source = "local"
        self.report: ActivityReport | None = None
        self.states: dict[str, Any] = {}
        self.source_error: str | None = None
        self.last_status_poll: float | None = None
        self.server_reclaimed = False
        # the person gave the slice back: nothing is left to warn of or cull
        self.user_released = False
        self.reclaim_retry = 300.0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="gpuslice-sampler")
        self._tasks: set[asyncio.Task[Any]] = set()
        self.usage = UsageReporter(service, usage_interval, self.log)

    @property
    def policy(self) -> IdlePolicy:
        return self.reclaimer.policy

    def set_policy(self, policy: IdlePolicy, source: str) -> None:
        self.reclaimer.policy = policy
        self.policy_source = source

    async def refresh_policy(self) -> None:
        """Take the admin's policy from the service; keep the current one if it is down."""
        if not self.policy_from_service or self.service is None or not self.service.configured:
            return
        try:
            policy = await self.service.idle_policy()
        except (ServiceError, ValueError) as e:
            self.log.warning("gpuslice: no idle policy from the service (%s); using local", e)
            return
        self.set_policy(policy, "service")

    def close(self) -> None:
        self.sampler.close()
        self._executor.shutdown(wait=False)

    # -- one tick ---------------------------------------------------------------------------

    def _kernel_pids(self) -> dict[str, int]:
        pids = {}
        for kid in list(self.km.list_kernel_ids()):
            try:
                pid = self.km.get_kernel(kid).provisioner.pid
            except (KeyError, AttributeError):
                continue  # starting, or a remote kernel with no local process
            if pid:
                pids[kid] = int(pid)
        return pids

    def _kernel(self, kid: str) -> Any:
        try:
            return self.km.get_kernel(kid)
        except KeyError:
            return None

    async def tick(self, now: float | None = None) -> list[Decision]:
        now = self.clock() if now is None else now
        kernels = self._kernel_pids()
        try:
            report = await asyncio.get_running_loop().run_in_executor(
                self._executor, self.sampler.tick, kernels
            )
        except Exception as e:
            # Never cull on a failed reading: no evidence of idleness is not idleness.
            if self.source_error != str(e):
                self.log.error("gpuslice: GPU activity could not be read: %s", e)
            self.source_error = str(e)
            return []
        self.source_error = None
        self.report = report
        executing: dict[str, bool] = {}
        last_execution: dict[str, float] = {}
        for kid in kernels:
            k = self._kernel(kid)
            executing[kid] = getattr(k, "execution_state", "") == "busy"
            last = getattr(k, "last_activity", None)
            if isinstance(last, datetime):
                last_execution[kid] = last.timestamp()
        self.states = self.trackers.update(report, executing, last_execution, now=now)
        try:
            self.usage.observe(now, report, self.states)
        except Exception:
            # Reporting is for the admin panel; idle decisions must go on without it.
            self.log.exception("gpuslice: could not account GPU usage")
        threshold = self.trackers.threshold
        active = {
            key: executing.get(key, False) or _busy(act, threshold)
            for key, act in {SERVER_KEY: report.server, **report.kernels}.items()
        }
        if self.keep_hub_activity and any(_busy(a, threshold) for a in _all(report)):
            # jupyter_server counts every ``*_last_activity`` setting, and JupyterHub's
            # single-user extension reports the latest to the hub, so jupyterhub-idle-culler
            # sees a server that trains silently as active. Idle, we leave it alone.
            self.web_settings["gpuslice_last_activity"] = datetime.now(UTC)
        if self.user_released:
            return []  # (usage was still counted above: the slice was held until now)
        decisions = self.reclaimer.observe(now, self.states, active)
        decisions += self.memcap.observe(
            now, {kid: a.memory_bytes for kid, a in report.kernels.items()}
        )
        for d in decisions:
            try:
                await self._carry_out(d, now)
            except Exception:
                # One kernel that cannot be shut down must not stop the others' decisions.
                self.log.exception("gpuslice: could not carry out %s for %s", d.action, d.kernel_id)
        return decisions

    # -- carrying out -----------------------------------------------------------------------

    async def _carry_out(self, d: Decision, now: float) -> None:
        events.emit(self.event_logger, d)
        self.log.info("gpuslice: %s %s: %s", d.action, d.kernel_id or "server", d.reason)
        if d.action == CULLED and d.kernel_id is None:
            await self._reclaim_server(d, now)
        elif d.action == CULLED or (d.action == MEMORY_CULLED and self.memcap.action == "shutdown"):
            await self._shutdown_kernel(d.kernel_id)
        elif d.action == MEMORY_CULLED:
            result = self.km.interrupt_kernel(d.kernel_id)
            if inspect.isawaitable(result):
                await result
        if not (d.action == CULLED and d.kernel_id is None):
            # A server cull is recorded by the service itself when it reclaims the slice.
            self._background(self._report(d))
        if self.notifier is not None and d.action != EXTENDED and not self.tab_open(now):
            self._background(self._notify(d))

    def released(self) -> None:
        """The person gave the slice back; the hub stops this server shortly."""
        self.server_reclaimed = self.user_released = True
        events.emit(self.event_logger, Decision(RELEASED, None, None, "released by the user"))
        self.log.info("gpuslice: released server: released by the user")

    async def _shutdown_kernel(self, kid: str | None) -> None:
        if kid is None or kid not in self.km:
            return
        # Shutting a kernel down counts as server activity in jupyter_server; a cull is
        # not the user's doing, so it must not keep the server alive for the hub's culler.
        before = self.km.last_kernel_activity
        await self.km.shutdown_kernel(kid)
        self.km.last_kernel_activity = before

    async def _reclaim_server(self, d: Decision, now: float) -> None:
        if self.service is None or not self.service.configured:
            self.log.error("gpuslice: cannot stop the idle server: no gpuslice service configured")
            self.reclaimer.cull_failed(None, now)
            return
        try:
            await self.service.reclaim(d.reason, d.idle_seconds)
        except ServiceError as e:
            self.log.error("gpuslice: the service did not reclaim the slice: %s", e)
            self.reclaimer.cull_failed(None, now)
            return
        self.server_reclaimed = True
        # The hub stops this process shortly; if it does not (the stop failed on the
        # hub's side), the cull is tried again rather than the slice held forever.
        self.reclaimer.cull_failed(None, now, retry_after=self.reclaim_retry)

    async def _report(self, d: Decision) -> None:
        if self.service is None or not self.service.configured:
            return
        detail: dict[str, Any] = {"profile": self.slice.profile}
        try:
            await self.service.report(d, detail)
        except ServiceError as e:
            self.log.warning("gpuslice: could not record %s with the service: %s", d.action, e)

    async def _notify(self, d: Decision) -> None:
        assert self.notifier is not None
        message = {
            **events.event_data(d),
            "user": self.slice.user,
            "profile": self.slice.profile,
            "server_url": self.web_settings.get("base_url", "/"),
        }
        try:
            await notify(self.notifier, message)
        except Exception:
            self.log.exception("gpuslice: the notifier failed")

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def drain(self) -> None:
        """Wait for reports and notifications in flight (tests, shutdown)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.usage.drain()

    def tab_open(self, now: float) -> bool:
        """A JupyterLab tab polls the status; none recently means nobody would see it."""
        return (
            self.last_status_poll is not None
            and now - self.last_status_poll < self.notify_without_tab_after
        )

    # -- the REST API's view ----------------------------------------------------------------

    async def keepalive(self, kernel_id: str | None, seconds: float | None) -> dict[str, Any]:
        now = self.clock()
        ids = [kernel_id] if kernel_id else [*self.km.list_kernel_ids(), SERVER_KEY]
        decisions = self.reclaimer.extend(ids, seconds, now)  # may raise ExtensionRefused
        for d in decisions:
            await self._carry_out(d, now)
        scopes = [self.reclaimer.scope_of(k) for k in ids]
        return {
            "kernels": [
                {"id": k, "deadline": iso(self.reclaimer.deadline(k))}
                for k in ids
                if k != SERVER_KEY
            ],
            "extension_left_seconds": self.reclaimer.extension_left(scopes),
        }

    def status(self) -> dict[str, Any]:
        self.last_status_poll = self.clock()
        policy = self.policy
        report = self.report
        kernels = []
        for kid in self.km.list_kernel_ids():
            k = self._kernel(kid)
            act = report.kernels.get(kid) if report else None
            state = self.states.get(kid)
            kernels.append(
                {
                    "id": kid,
                    "name": getattr(k, "kernel_name", ""),
                    "execution_state": getattr(k, "execution_state", "unknown"),
                    **_activity_json(act),
                    "idle_seconds": state.idle_seconds if state else 0.0,
                    "deadline": iso(self.reclaimer.deadline(kid)),
                    "warning": self.reclaimer.warned(kid),
                    "exempt": policy.exempt,
                }
            )
        s = self.slice
        return {
            "slice": {
                "profile": s.profile,
                "display_name": s.display_name or s.profile,
                "kind": s.kind,
                "gpu_milli": s.gpu_milli,
                "memory_cap_mib": s.memory_cap_mib,
                "memory_mib": s.memory_mib,
                "devices": list(s.devices),
                "simulated": s.simulated or bool(report and report.simulated),
                "idle_timeout": policy.idle_timeout,
            },
            "server": {
                **_activity_json(report.server if report else None),
                "deadline": iso(self.reclaimer.server_deadline()),
            },
            "kernels": kernels,
            # the whole slice: every kernel and the server's own GPU processes
            "total": _total_json(report),
            "policy": {
                "action": policy.action,
                "idle_timeout": policy.idle_timeout,
                "warning_lead": policy.warning_lead,
                "max_extension": policy.max_extension,
                "source": self.policy_source,
            },
            "exempt": policy.exempt,
            "exempt_reason": policy.exempt_reason,
            "sampling": {
                "error": self.source_error,
                "time": iso(report.time) if report else None,
            },
        }


def _busy(a: Activity, threshold: float) -> bool:
    return a.util is not None and a.util >= threshold


def _all(report: ActivityReport) -> list[Activity]:
    return [report.server, *report.kernels.values()]


def _total_json(report: ActivityReport | None) -> dict[str, Any]:
    """The slice's use, combined as the usage reports combine it (``total_utilization``):
    per-process figures add up on a device (at most 100), a per-instance figure counts
    once, the busiest device is the slice's; unknown (None) when any part's figure is,
    never a 0 % made of the parts that could be read."""
    if report is None:
        return {"utilization": None, "memory_mib": None}
    parts = _all(report)
    util, memory = total_utilization(parts), total_memory(parts)
    return {
        "utilization": None if util is None else round(util, 1),
        "memory_mib": None if memory is None else round(memory / MiB, 1),
    }


def _activity_json(a: Activity | None) -> dict[str, Any]:
    if a is None:
        return {"utilization": None, "memory_mib": None, "attribution": "unavailable"}
    return {
        "utilization": a.util,
        "memory_mib": None if a.memory_bytes is None else round(a.memory_bytes / MiB, 1),
        "attribution": a.attribution.value,
    }
