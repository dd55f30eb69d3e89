"""The ``gpuslice`` server extension (auto-enabled through jupyter_server_config.d)."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from jupyter_server.utils import url_path_join
from traitlets import (
    Bool,
    Dict,
    Enum,
    Float,
    Integer,
    List,
    TraitError,
    Unicode,
    Union,
    default,
    validate,
)
from traitlets import Callable as CallableTrait

from ..activity import (
    DEFAULT_SAMPLE_INTERVAL,
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    ActivitySampler,
    Attributor,
    IdleTrackers,
    ProcReader,
    make_source,
    visible_devices,
)
from ..idle_policy import ACTIONS, IdlePolicy, PolicyConfig, PolicyError
from . import events
from .handlers import default_handlers
from .memcap import MEMORY_ACTIONS, MemoryCap
from .monitor import Monitor, SliceInfo
from .notifier import load_notifier
from .service import ServiceClient

API_PREFIX = "gpuslice/api"
JOBS_PROXY = "gpuslice.jobs_proxy"


def _slice_memory_mib() -> int:
    """The slice's GPU memory, from the spawner's ``$GPUSLICE_SLICE`` assignments."""
    try:
        assignments = json.loads(os.environ.get("GPUSLICE_SLICE") or "[]")
        return sum(int(a.get("memory_mib") or 0) for a in assignments)
    except (ValueError, TypeError, AttributeError):
        return 0


def _env_int(name: str, fallback: int = 0) -> int:
    try:
        return int(os.environ.get(name, "") or fallback)
    except ValueError:
        return fallback


class GPUSliceExtension(ExtensionApp):
    name = "gpuslice"
    description = "GPU activity per kernel, idle reclaim with warnings and keep-alive."
    load_other_extensions = True

    # -- sampling ---------------------------------------------------------------------------

    sample_interval = Float(
        DEFAULT_SAMPLE_INTERVAL,
        help="Seconds between two readings of GPU activity (NVML, once per device); "
        "0 disables the sampling loop.",
    ).tag(config=True)

    idle_window = Float(
        DEFAULT_WINDOW,
        help="Idle time accumulates in whole windows of this many seconds in which "
        "utilization stayed under idle_threshold and the kernel executed nothing.",
    ).tag(config=True)

    idle_threshold = Float(
        DEFAULT_THRESHOLD, help="GPU utilization (percent) under which a kernel counts as idle."
    ).tag(config=True)

    activity_source = Enum(
        ["auto", "nvml", "simulated"],
        default_value="auto",
        help="Where GPU activity comes from: ``nvml`` (the driver), ``simulated`` (CPU use "
        "of each kernel's process tree stands in for GPU use; for machines with no GPU), or "
        "``auto``: simulated when the slice is simulated ($GPUSLICE_SIMULATED), else nvml.",
    ).tag(config=True)

    proc_root = Unicode(
        "/proc",
        help="The /proc to read process trees from; a host /proc mounted into a container "
        "(e.g. /host/proc) lets the PIDs NVML reports be translated through NSpid.",
    ).tag(config=True)

    simulated_memory_mib = Integer(
        0,
        help="Simulated source only: GPU memory (MiB) a process is shown to hold once it "
        "has been busy, as a CUDA context would.",
    ).tag(config=True)

    # -- the idle policy (local fallback) ---------------------------------------------------

    policy_from_service = Bool(
        True,
        help="Ask the gpuslice service for the admin's idle policy (GET api/idle-policy); the "
        "idle_* traits below apply when it cannot be reached or is not configured.",
    ).tag(config=True)

    policy_refresh_interval = Float(
        300.0, help="Seconds between two fetches of the idle policy from the service."
    ).tag(config=True)

    idle_action = Enum(
        list(ACTIONS),
        default_value="kernel",
        help="``kernel``: shut down a kernel idle past its deadline (frees its GPU memory); "
        "``server``: once every kernel is idle past its deadline, stop the server through "
        "the gpuslice service (frees the slice).",
    ).tag(config=True)

    idle_timeout = Float(
        help="Seconds a kernel may sit idle on the GPU before it is culled; 0: never. "
        "Default: the profile's timeout ($GPUSLICE_IDLE_TIMEOUT), else 3600.",
    ).tag(config=True)

    @default("idle_timeout")
    def _default_idle_timeout(self) -> float:
        return float(_env_int("GPUSLICE_IDLE_TIMEOUT", 3600))

    warning_lead = Float(
        300.0, help="Seconds between the idle warning and the cull (at least)."
    ).tag(config=True)

    max_extension = Float(
        14400.0, help="Keep-alive may add at most this many seconds to one idle period."
    ).tag(config=True)

    profile_policies = Dict(
        help="Per-profile overrides of action, idle_timeout, warning_lead and max_extension, "
        'e.g. ``{"gpu-1": {"idle_timeout": 1800, "action": "server"}}``.',
    ).tag(config=True)

    exempt_users = List(Unicode(), help="Users never culled.").tag(config=True)
    exempt_groups = List(
        Unicode(),
        help="Groups whose members are never culled (the service knows the groups; "
        "locally only $GPUSLICE_GROUPS, if set, is known).",
    ).tag(config=True)
    exempt_profiles = List(Unicode(), help="Profiles never culled.").tag(config=True)

    # -- memory caps ------------------------------------------------------------------------

    memory_cap_mib = Integer(
        help="GPU memory cap (MiB) per kernel on a time-sliced share without MPS; 0: none. "
        "Default: the share's cap ($GPUSLICE_MEMORY_CAP_MIB) when MPS does not enforce it.",
    ).tag(config=True)

    @default("memory_cap_mib")
    def _default_memory_cap(self) -> int:
        if os.environ.get("GPUSLICE_PROFILE_KIND") != "share":
            return 0
        if os.environ.get("CUDA_MPS_PIPE_DIRECTORY"):
            return 0  # MPS enforces the cap itself (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT)
        return _env_int("GPUSLICE_MEMORY_CAP_MIB")

    memory_action = Enum(
        list(MEMORY_ACTIONS),
        default_value="warn",
        help="What happens to a kernel over the memory cap after memory_grace seconds: "
        "``warn`` only, ``interrupt`` it, or ``shutdown`` it.",
    ).tag(config=True)

    memory_grace = Float(
        60.0, help="Seconds between the memory warning and the interrupt or shutdown."
    ).tag(config=True)

    # -- reporting --------------------------------------------------------------------------

    notifier = Union(
        [CallableTrait(), Unicode()],
        default_value="",
        help="Called with each warning and cull (a dict: action, kernel_id, deadline, "
        "reason, idle_seconds, user, profile, server_url) when the user has no JupyterLab "
        "tab open: a callable or ``'module:function'``, e.g. one that sends e-mail or "
        "posts to chat. May be async.",
    ).tag(config=True)

    notify_without_tab_after = Float(
        120.0,
        help="The user counts as having no tab open when nothing polled the status "
        "for this many seconds.",
    ).tag(config=True)

    keep_hub_activity = Bool(
        True,
        help="While the GPU is busy, keep the server's last activity fresh so that "
        "jupyterhub-idle-culler does not cull a server that trains silently.",
    ).tag(config=True)

    usage_report_interval = Float(
        60.0,
        help="Seconds between two reports of this server's GPU use to the gpuslice service "
        "(POST api/allocations/<id>/usage: mean utilization over the interval, peak memory, "
        "idle time), which the admin panel plots against the allocation; 0 turns them off. "
        "Only a server started with a gpuslice allocation reports; reports are sent in the "
        "background and never delay sampling or culls.",
    ).tag(config=True)

    service_url = Unicode(help="The gpuslice service (default: $GPUSLICE_SERVICE_URL).").tag(
        config=True
    )

    @default("service_url")
    def _default_service_url(self) -> str:
        return os.environ.get("GPUSLICE_SERVICE_URL", "")

    @validate("warning_lead", "usage_report_interval")
    def _check_not_negative(self, proposal: Any) -> float:
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name} must be >= 0")
        return float(proposal["value"])

    monitor: Monitor | None = None
    _loop_task: asyncio.Task[Any] | None = None

    # -- wiring -----------------------------------------------------------------------------

    def local_policy(self, user: str, profile: str) -> IdlePolicy:
        # The profile's own timeout ($GPUSLICE_IDLE_TIMEOUT, when idle_timeout is not set
        # here) is the profile's, as the service treats it: under the default warning lead
        # a short one is warned halfway (``resolve``), never refused.
        configured = "idle_timeout" in self.config.get(type(self).__name__, {})
        try:
            config = PolicyConfig.parse(
                {
                    "action": self.idle_action,
                    **({"idle_timeout": self.idle_timeout} if configured else {}),
                    "warning_lead": self.warning_lead,
                    "max_extension": self.max_extension,
                    "profiles": self.profile_policies,
                    "exempt_users": list(self.exempt_users),
                    "exempt_groups": list(self.exempt_groups),
                    "exempt_profiles": list(self.exempt_profiles),
                },
                key="GPUSliceExtension",
            )
        except PolicyError as e:
            raise ValueError(f"invalid gpuslice idle policy: {e}") from None
        groups = [g for g in os.environ.get("GPUSLICE_GROUPS", "").split(",") if g]
        return config.resolve(
            user, groups, profile or None, None if configured else self.idle_timeout
        )

    def _source_kind(self) -> str:
        if self.activity_source != "auto":
            return str(self.activity_source)
        return "simulated" if os.environ.get("GPUSLICE_SIMULATED") == "1" else "nvml"

    def initialize_settings(self) -> None:
        assert self.serverapp is not None
        user = os.environ.get("JUPYTERHUB_USER", "")
        profile = os.environ.get("GPUSLICE_PROFILE", "")
        kind = self._source_kind()
        kw: dict[str, Any] = {}
        if kind == "simulated":
            kw["memory_mib"] = self.simulated_memory_mib
        source = make_source(kind, **kw)
        attributor = Attributor(ProcReader(self.proc_root))
        # Unconfigured (no $GPUSLICE_SERVICE_URL: not started by gpuslice) it does nothing.
        service = ServiceClient(
            self.service_url,
            os.environ.get("JUPYTERHUB_API_TOKEN", ""),
            _env_int("GPUSLICE_ALLOCATION_ID") or None,
            user,
        )
        events.register(self.serverapp.event_logger)
        self.monitor = Monitor(
            sampler=ActivitySampler(source, attributor),
            trackers=IdleTrackers(self.idle_window, self.idle_threshold),
            policy=self.local_policy(user, profile),
            memcap=MemoryCap(self.memory_cap_mib, self.memory_action, self.memory_grace),
            kernel_manager=self.serverapp.kernel_manager,
            event_logger=self.serverapp.event_logger,
            web_settings=self.serverapp.web_app.settings,
            slice_info=SliceInfo(
                profile=profile,
                display_name=os.environ.get("GPUSLICE_PROFILE_DISPLAY_NAME", "") or profile,
                kind=os.environ.get("GPUSLICE_PROFILE_KIND", ""),
                memory_mib=_slice_memory_mib(),
                gpu_milli=_env_int("GPUSLICE_GPU_MILLI"),
                memory_cap_mib=self.memory_cap_mib,
                devices=tuple(visible_devices() or ()),
                simulated=os.environ.get("GPUSLICE_SIMULATED") == "1" or kind == "simulated",
                user=user,
            ),
            service=service,
            policy_from_service=self.policy_from_service,
            notifier=load_notifier(self.notifier),
            notify_without_tab_after=self.notify_without_tab_after,
            keep_hub_activity=self.keep_hub_activity,
            usage_interval=self.usage_report_interval,
            logger=self.log,
        )
        self.settings["gpuslice_monitor"] = self.monitor
        self.log.info(
            "gpuslice: sampling %s GPU activity every %gs (window %gs); idle policy %s",
            kind,
            self.sample_interval,
            self.idle_window,
            self.monitor.policy,
        )

    def initialize_handlers(self) -> None:
        for suffix, handler in default_handlers():
            self.handlers.append((url_path_join("/", API_PREFIX, suffix), handler))
        # The batch-jobs routes live in their own module, when it is installed.
        if importlib.util.find_spec(JOBS_PROXY) is None:
            return
        try:
            routes = importlib.import_module(JOBS_PROXY).handlers()
        except Exception:
            # Idle reclaim must keep working even when the jobs routes are broken.
            self.log.exception("gpuslice: batch-job routes (%s) not loaded", JOBS_PROXY)
            return
        for suffix, handler in routes:
            self.handlers.append((url_path_join("/", API_PREFIX, suffix), handler))

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        if self.monitor is not None and self.sample_interval > 0:
            self._loop_task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        assert self.monitor is not None
        loop = asyncio.get_running_loop()
        next_refresh = 0.0
        while True:
            if loop.time() >= next_refresh:
                await self.monitor.refresh_policy()
                next_refresh = loop.time() + self.policy_refresh_interval
            started = loop.time()
            try:
                await self.monitor.tick()
            except Exception:
                self.log.exception("gpuslice: sampling tick failed")
            await asyncio.sleep(max(0.0, self.sample_interval - (loop.time() - started)))

    async def stop_extension(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        if self.monitor is not None:
            await self.monitor.drain()
            self.monitor.close()
