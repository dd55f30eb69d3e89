"""GPUSliceSpawner: ask the gpuslice service for a slice, start the server on it, release it.

The slice logic lives in :class:`GPUSliceMixin`; the concrete spawners combine it with a
launcher (local processes, KubeSpawner, batchspawner's SlurmSpawner). Each launcher only
says how a granted slice becomes its own resources (:meth:`apply_grant`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from collections.abc import AsyncIterator
from html import escape
from typing import Any, ClassVar

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner, Spawner
from jupyterhub.utils import maybe_future
from tornado import web
from traitlets import Dict, Float, Instance, Integer, List, TraitError, Unicode, default, validate

from gpuslice.errors import GPUSliceError
from gpuslice_hub.client import ServiceClient, ServiceError
from gpuslice_hub.profiles import is_profile_name

from .env import slice_env
from .form import TEMPLATE, render_form

# the release reason of a server the hub stopped (the service replaces it with its own
# record when it asked for that stop)
STOPPED = "server stopped"

# The spawn option (and form field) naming the GPU slice, by its gpuslice profile. Not
# "profile": KubeSpawner's profile_list reads that one for its own choice (an image, an
# environment), which sits beside the slice in the same form.
SLICE_OPTION = "slice"
# What the slice was called before it had its own name; still read as the slice where no
# wrapped spawner reads it (see GPUSliceMixin.wrapped_uses_profile).
LEGACY_SLICE_OPTION = "profile"

# Where the wrapped spawner's own progress events go on the bar: after gpuslice's "Starting
# your server" (60), before its "Server started" (90).
WRAPPED_PROGRESS = (60, 89)


def _no_form_of_its_own(spawner: Any) -> str:
    """The wrapped spawner's form where it has none: nothing beside the slice choice."""
    return ""


class SliceRefused(GPUSliceError, web.HTTPError):
    """A spawn the service refused. As an HTTP error (4xx, or 503 while the service is
    down), JupyterHub shows the message on the spawn form or the progress page, answers the
    REST API with that status and message, and logs one line instead of a traceback."""

    def __init__(self, message: str, status: int = 409) -> None:
        super().__init__(status, "%s", message)
        self.message = message
        self.jupyterhub_message = message
        self.jupyterhub_html_message = None

    def __str__(self) -> str:
        return self.message


def refusal(e: ServiceError, log: Any) -> SliceRefused:
    """What a researcher reads when the service refuses or cannot be reached: the service's
    own words for a refusal; for an outage a plain sentence (the service's internal URL and
    the error go to the hub's log, for the admin)."""
    if 400 <= e.status < 500:
        return SliceRefused(e.message, e.status)
    log.error("gpuslice service error during a spawn: %s", e.message)
    return SliceRefused(
        "The GPU service is not answering right now, so no GPU slice could be reserved. "
        "Try again in a minute; if it persists, tell your JupyterHub admin.",
        503,
    )


def _shown(text: str) -> str:
    """A user's string in a message: quoted, and cut (it may be megabytes)."""
    return repr(text if len(text) <= 40 else text[:40] + "…")


class SpawnProgress:
    """What a spawn has reported so far (JupyterHub's progress page reads it), and an
    event that is set at each new report."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def add(self, percent: int, message: str) -> None:
        self.add_event({"progress": percent, "message": message})

    def add_event(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self.changed.set()


class GPUSliceMixin(Spawner):
    """The slice logic shared by every gpuslice launcher (configure it as ``c.GPUSliceMixin``)."""

    # The launcher's engine counts each share at its full size (Kubernetes' device plugin
    # replicas, Slurm's shards): the service must not overcommit its slices.
    engine_counts_shares: ClassVar[bool] = False

    service_url = Unicode(
        "http://127.0.0.1:10101/services/gpuslice/",
        help="URL of the gpuslice service, prefix included (set by configure_jupyterhub).",
    ).tag(config=True)

    service_token = Unicode(
        help="API token of the gpuslice service, used to allocate on the user's behalf "
        "(set by configure_jupyterhub; default: $GPUSLICE_SERVICE_TOKEN).",
    ).tag(config=True)

    @default("service_token")
    def _default_service_token(self) -> str:
        return os.environ.get("GPUSLICE_SERVICE_TOKEN", "")

    server_service_url = Unicode(
        "",
        help="URL of the gpuslice service as the single-user servers reach it (their "
        "$GPUSLICE_SERVICE_URL, for idle reports and job submission), e.g. "
        "'https://hub.example.org/services/gpuslice/'. Empty: service_url, which is often a "
        "loopback address only the hub can reach (fine for local processes).",
    ).tag(config=True)

    service_timeout = Float(
        30.0, help="Seconds to wait for the gpuslice service before the spawn fails."
    ).tag(config=True)

    mps_pipe_directory = Unicode(
        "",
        help="CUDA_MPS_PIPE_DIRECTORY of the MPS daemon on the GPU hosts. When set, "
        "time-sliced shares also get MPS limits (active thread percentage, pinned memory).",
    ).tag(config=True)

    preempt_wait_timeout = Float(
        300.0,
        help="Seconds a spawn waits while the service preempts a batch job to free a slice. "
        "It is capped by start_timeout (less the time a server needs to start, "
        "server_start_margin); a job whose JobManager.preempt_grace is longer than the wait "
        "is not preempted for a spawn, and the refusal says so.",
    ).tag(config=True)

    server_start_margin = Float(
        60.0,
        help="Seconds of start_timeout kept for starting the server itself once a slice is "
        "granted; the rest may be spent waiting for a preempted batch job.",
    ).tag(config=True)

    @default("start_timeout")
    def _default_start_timeout(self) -> int:
        # JupyterHub's 60 s would end a spawn that waits for a job's grace period, and the
        # job would lose its work for nobody: by default, room for the whole wait.
        return int(self.preempt_wait_timeout + self.server_start_margin)

    def preempt_wait(self) -> float:
        """How long this spawn may wait for a batch job to give its slice up."""
        return max(
            0.0, min(self.preempt_wait_timeout, self.start_timeout - self.server_start_margin)
        )

    form_template = Unicode(
        TEMPLATE,
        help="The Jinja template of the spawn form (autoescaped). Copy the package's "
        "gpuslice_spawner/templates/spawn_form.html into a folder of form_template_paths "
        "to change it; its comment lists the variables.",
    ).tag(config=True)

    form_template_paths = List(
        Unicode(),
        help="Folders searched for form_template before the package's own templates.",
    ).tag(config=True)

    default_profile = Unicode(
        "",
        help="Profile used when a spawn names none (through the REST API, for a server "
        "with no previous options: JupyterHub reuses those of the server's last spawn when "
        "a request sends none); empty: the spawn is refused and the user is asked to pick one.",
    ).tag(config=True)

    service_name = Unicode(
        "gpuslice", help="The gpuslice service's name on the hub (for token scopes)."
    ).tag(config=True)

    @default("server_token_scopes")
    def _default_server_token_scopes(self) -> list[str]:
        # The server extension reports GPU activity and idle events to the service.
        return [
            "users:activity!user",
            "access:servers!server",
            f"access:services!service={self.service_name}",
        ]

    allocation_id = Integer(0, allow_none=True)

    # -- service ---------------------------------------------------------------------------

    @property
    def client(self) -> ServiceClient:
        return ServiceClient(self.service_url, self.service_token, self.service_timeout)

    def _groups(self) -> list[str]:
        return sorted(g.name for g in self.user.groups)  # type: ignore[attr-defined]

    # -- the form and the spawn options -----------------------------------------------------

    allowed_user_options = Dict(
        Unicode(),
        help="""Spawn options besides the slice that users may send, for the wrapped
        spawner: option name -> regular expression its value (a string) must match in full.
        For the fields of your own ``options_form`` (which the spawn form shows below the
        slice choice; parse them with ``c.Spawner.options_from_form = "simple"``) and
        batchspawner's script variables (a user option named like one, e.g. ``runtime``,
        replaces ``req_runtime`` in the job script), e.g. ``{"runtime": r"[1-8]:00:00"}``.
        Any other option is refused with a 400 before a slice is taken. KubeSpawner's
        ``profile_list`` options (``profile`` and its ``profile_options``) need no entry:
        KubeSpawner checks them itself.""",
    ).tag(config=True)

    @validate("allowed_user_options")
    def _valid_allowed_user_options(self, proposal: Any) -> dict[str, str]:
        value: dict[str, str] = proposal["value"]
        for name, pattern in value.items():
            if name in (SLICE_OPTION, LEGACY_SLICE_OPTION):
                raise TraitError(f"allowed_user_options: {name!r} is gpuslice's own option")
            try:
                re.compile(pattern)
            except re.error as e:
                raise TraitError(f"allowed_user_options[{name!r}]: {e}") from None
        return value

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.options_form:  # type: ignore[has-type]
            # The slice is chosen in a form even where the wrapped spawner has none (see
            # get_options_form); the hub, and its admin page, offer a server's spawn form
            # only when options_form is set.
            self.options_form = _no_form_of_its_own

    def wrapped_uses_profile(self) -> bool:
        """Whether the wrapped spawner reads the ``profile`` spawn option itself
        (KubeSpawner with a profile_list). Where it does not, ``profile`` still names the
        slice, as it did before the slice had an option of its own."""
        return False

    async def get_options_form(self) -> str:
        """The slice choice, then the wrapped spawner's own form (KubeSpawner's profile_list,
        an admin's ``options_form``): one form, one Start button."""
        slices = await self._slice_form()
        wrapped = await super().get_options_form()
        if not wrapped:
            return slices
        return f'{slices}\n<div class="gpuslice-wrapped-form">\n{wrapped}\n</div>'

    async def _slice_form(self) -> str:
        try:
            data = await self.client.profiles(
                self.user.name,  # type: ignore[attr-defined]
                overcommit=not self.engine_counts_shares,
                # what a spawn from this form waits for a batch job: no offer it would not
                # get (a job whose checkpoint takes longer is not preempted for it)
                wait_seconds=self.preempt_wait(),
            )
        except ServiceError as e:
            return f"<p class='text-danger'>{escape(refusal(e, self.log).message)}</p>"  # type: ignore[attr-defined]
        return render_form(
            data["profiles"],
            simulated=bool(data.get("simulated")),
            quota=data.get("quota"),
            template=self.form_template,
            template_paths=self.form_template_paths,
        )

    async def run_options_from_form(self, form_data: dict[str, Any]) -> dict[str, Any]:
        # The slice field is gpuslice's; the rest goes to the wrapped spawner's own parser
        # (KubeSpawner's profile_list fields, or the admin's options_from_form).
        chosen, rest = self._take_slice_field(form_data)
        options = await maybe_future(super().run_options_from_form(rest))
        return self._with_slice(options, chosen)

    async def options_from_query(self, query_data: dict[str, Any]) -> dict[str, Any]:
        # /hub/spawn?slice=share-250&profile=pytorch: as from the form
        chosen, rest = self._take_slice_field(query_data)
        options = await maybe_future(super().options_from_query(rest))
        return self._with_slice(options, chosen)

    def _take_slice_field(self, data: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        """The slice a form or query names (its first value), and the other fields."""
        rest = dict(data)
        field = SLICE_OPTION
        if field not in rest and not self.wrapped_uses_profile():
            field = LEGACY_SLICE_OPTION  # a spawn form template copied before "slice"
        values = rest.pop(field, None)
        if isinstance(values, list):
            values = values[0] if values else ""
        return (values if isinstance(values, str) else ""), rest

    @staticmethod
    def _with_slice(options: Any, chosen: str) -> dict[str, Any]:
        options = dict(options or {})
        if chosen:
            options[SLICE_OPTION] = chosen
        return options

    if "apply_user_options" in Spawner.class_trait_names():  # JupyterHub 5.3+

        @default("apply_user_options")
        def _default_apply_user_options(self) -> Any:
            # The hub's hook for user_options. start() checks and uses them (a bad option
            # is a 400 that names it, logged as one line; the hub logs a traceback for any
            # error raised in this hook), so the hook only says they are handled.
            return lambda spawner, options: None

    def _spawn_options(self) -> tuple[str, dict[str, Any]]:
        """The requested slice's profile, and the options left for the wrapped spawner.
        ``user_options`` are untrusted (they may come via the API)."""
        options = self.user_options or {}  # type: ignore[attr-defined]
        if not isinstance(options, dict):
            raise SliceRefused("Spawn options must be an object naming a 'slice'.", 400)
        rest = dict(options)
        profile = rest.pop(SLICE_OPTION, None)
        if not self.wrapped_uses_profile() and LEGACY_SLICE_OPTION in rest:
            legacy = rest.pop(LEGACY_SLICE_OPTION)
            if profile is None:
                profile = legacy
            elif legacy != profile:
                raise SliceRefused(
                    "Spawn options 'slice' and 'profile' name different GPU slices; send "
                    "'slice' alone.",
                    400,
                )
        if profile is None or profile == "":
            profile = self.default_profile  # not chosen (an empty form field): the default
        elif not isinstance(profile, str):
            # never replaced by the default: a forged option is refused, not reinterpreted
            raise SliceRefused(
                f"Spawn option 'slice' must be a profile name (a string), not "
                f"{type(profile).__name__}.",
                400,
            )
        if not profile:
            raise SliceRefused(
                "No GPU slice was chosen: pick one in the spawn form (through the REST API, "
                "name it as the spawn option 'slice').",
                400,
            )
        if not is_profile_name(profile):
            # (not sent on to the service, nor written whole to the log: it may be megabytes)
            raise SliceRefused(f"There is no GPU profile named {_shown(profile)}.", 400)
        return profile, rest

    async def check_wrapped_options(self, options: dict[str, Any]) -> None:
        """Refuse (400) the spawn options besides the slice that the wrapped spawner may not
        be given: here, any not in ``allowed_user_options`` or not matching its pattern.
        Launchers whose spawner has options of its own (KubeSpawner's profile_list) extend
        it. Runs before a slice is taken."""
        for name in sorted(options):
            pattern = self.allowed_user_options.get(name)
            if pattern is None:
                accepted = [SLICE_OPTION, *sorted(self.allowed_user_options)]
                if not self.wrapped_uses_profile():
                    accepted.insert(1, LEGACY_SLICE_OPTION)
                raise SliceRefused(
                    f"Unknown spawn option {_shown(name)}; accepted: "
                    + ", ".join(repr(a) for a in accepted)
                    + ".",
                    400,
                )
            value = options[name]
            if not isinstance(value, str) or not re.fullmatch(pattern, value):
                # (the value is not repeated: it is the user's, and may be anything)
                raise SliceRefused(
                    f"Spawn option {name!r} must be a string matching {pattern!r}.", 400
                )

    # -- progress --------------------------------------------------------------------------

    # what this spawn has reported (one per spawner, made on first use; not a setting)
    _spawn_log = Instance(SpawnProgress, args=())

    def _progress(self, percent: int, message: str) -> None:
        self._spawn_log.add(percent, message)
        self.log.info("gpuslice %s: %s", self._log_name, message)  # type: ignore[attr-defined]

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        log, sent = self._spawn_log, 0
        while True:
            log.changed.clear()  # before reading: a report from now on wakes the wait
            while sent < len(log.events):
                yield log.events[sent]
                sent += 1
            if self.pending != "spawn" and sent:
                return
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(log.changed.wait(), 1.0)

    def _wraps_progress(self) -> bool:
        """Whether the wrapped spawner reports progress of its own (KubeSpawner's pod
        events, batchspawner's queue state); JupyterHub's placeholder says nothing."""
        mro = type(self).__mro__
        for cls in mro[mro.index(GPUSliceMixin) + 1 :]:
            if "progress" in vars(cls):
                return cls is not Spawner
        return False

    async def _relay_progress(self) -> None:
        """Pass the wrapped spawner's progress events on while its start() runs, after
        gpuslice's own, with their progress moved into WRAPPED_PROGRESS. Every viewer of
        the progress page reads them from the same record as gpuslice's events."""
        low, high = WRAPPED_PROGRESS
        try:
            async with contextlib.aclosing(super().progress()) as events:  # type: ignore[misc]
                async for event in events:
                    if not isinstance(event, dict):
                        continue
                    event = dict(event)  # (the wrapped spawner's own object stays as it is)
                    percent = event.pop("progress", None)
                    if isinstance(percent, int | float) and not isinstance(percent, bool):
                        share = max(0.0, min(100.0, float(percent))) / 100
                        event["progress"] = min(high, low + round(share * (high - low)))
                    self._spawn_log.add_event(event)
        except asyncio.CancelledError:
            raise
        except Exception:
            # a progress report that fails must not fail the spawn it reports on
            self.log.warning(  # type: ignore[attr-defined]
                "the progress events of %s's spawner failed; its start goes on",
                self._log_name,  # type: ignore[attr-defined]
                exc_info=True,
            )

    # -- lifecycle -------------------------------------------------------------------------

    # How many starts of each (user, server) began in this hub: a sweep after a cancelled
    # spawn must not take a later start's slice. Per server, not per spawner object: the
    # hub may make a new one for the next start.
    _starts_of: ClassVar[dict[tuple[str, str], int]] = {}

    @property
    def _starts(self) -> int:
        return self._starts_of.get(self._server_key, 0)

    @property
    def _server_key(self) -> tuple[str, str]:
        return (self.user.name, self.name)  # type: ignore[attr-defined]

    _protection_checked: ClassVar[bool] = False

    def _check_protection(self) -> None:
        """Say once, loudly, when the config undid what keeps a user from switching idle
        reclaim off: ``configure_jupyterhub`` sets ``Spawner.disable_user_config``, and a
        later ``c.Spawner`` (or ``c.LocalProcessSpawner``, ...) line setting it False lets
        every user's ``~/.jupyter`` disable the extension (issue 45)."""
        if GPUSliceMixin._protection_checked:
            return
        GPUSliceMixin._protection_checked = True
        if not self.disable_user_config:
            self.log.warning(  # type: ignore[attr-defined]
                "gpuslice: disable_user_config is False for %s (configure_jupyterhub sets "
                "c.Spawner.disable_user_config = True; a later line of the hub's config set "
                "it back): every user's own ~/.jupyter config can switch idle reclaim off. "
                "Only the service's reclaim of silent servers (reclaim_silent_after) still "
                "frees their slices.",
                type(self).__name__,
            )

    async def start(self) -> Any:
        self._check_protection()
        self._starts_of[self._server_key] = self._starts + 1
        self._spawn_log.events.clear()
        self.last_stop = None
        profile, wrapped_options = self._spawn_options()
        await self.check_wrapped_options(wrapped_options)
        if self.allocation_id:
            # left over from a spawn that never stopped cleanly: give it back first
            await self._release("replaced by a new spawn")
        else:
            # one the service granted after its spawn was given up (this server is starting,
            # so nothing else can hold it): the owner's new spawn must not be refused for it
            await self._release_unrecorded("left by a spawn that did not finish")
        # (the researcher reads these: the slice as the spawn form named it, which only
        # the grant says; the log line names the profile too)
        self._progress(10, "Asking gpuslice for a GPU slice")
        grant = await self._allocate(profile)
        self.allocation_id = grant["id"]
        self.grant = grant
        where = ", ".join(a["mig_uuid"] or a["gpu_uuid"] for a in grant["assignments"])
        shown = grant.get("display_name") or profile
        self._progress(40, f"Got {shown} on {grant['host']} ({where})")
        self.log.info(  # type: ignore[attr-defined]
            "gpuslice %s: allocation %s of profile %s", self._log_name, grant["id"], profile
        )
        try:
            self.apply_grant(grant)
            self._progress(60, "Starting your server")
            # (called before the relay starts: KubeSpawner's start() sets the future its
            # progress() watches)
            starting = super().start()  # type: ignore[misc]
            relay = (
                asyncio.ensure_future(self._relay_progress()) if self._wraps_progress() else None
            )
            try:
                result = await starting
            finally:
                if relay is not None:
                    relay.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await relay
        except BaseException:
            await self._release("the server failed to start")
            raise
        self._progress(90, "Server started")
        return result

    async def _allocate(self, profile: str) -> dict[str, Any]:
        """Ask for a slice; while the service preempts a batch job for us, wait and retry."""
        loop = asyncio.get_running_loop()
        wait = self.preempt_wait()
        deadline = loop.time() + wait
        percent = 15
        while True:
            try:
                grant = await self.client.allocate(
                    profile=profile,
                    user=self.user.name,  # type: ignore[attr-defined]
                    groups=self._groups(),
                    server_name=self.name,  # type: ignore[attr-defined]
                    purpose="interactive",
                    wait_seconds=max(0.0, deadline - loop.time()),
                    **({"overcommit": False} if self.engine_counts_shares else {}),
                )
            except asyncio.CancelledError:
                # A stop, or the hub's start_timeout: the request is on its way and the
                # service may still grant it. Nobody would hold that slice: look again.
                self._background(self._sweep_after_cancel())
                raise
            except ServiceError as e:
                if not 400 <= e.status < 500:  # no answer: it may have been granted
                    self._background(self._sweep_after_cancel())
                refused = refusal(e, self.log)  # type: ignore[attr-defined]
                self._progress(100, f"Refused: {refused.message}")
                raise refused from None
            if "id" in grant:
                return grant
            # 202: a preemptible batch job is checkpointing to make room for this server
            message = grant.get("message") or "Waiting for a batch job to free a slice"
            if loop.time() > deadline:
                message = f"Gave up after {wait:g} s: {message}"
                self._progress(100, message)
                raise SliceRefused(message, 409)
            percent = min(percent + 2, 35)
            self._progress(percent, message)
            await asyncio.sleep(min(float(grant.get("retry_after") or 2), 10.0))

    def apply_grant(self, grant: dict[str, Any]) -> None:
        """Turn a granted slice into launcher resources; local processes need only env."""

    _stopping = False

    async def stop(self, now: bool = False) -> None:
        # Launchers poll from inside stop() to see the process go; that is not a crash.
        self._stopping = True
        recorded = bool(self.allocation_id)
        try:
            await super().stop(now=now)  # type: ignore[misc]
        finally:
            self._stopping = False
            if not recorded:
                # stopped while its spawn waited for the slice (the spawn is cancelled)
                await self._release_unrecorded("its server stopped before the slice was recorded")
            released = await self._release(STOPPED)
            # The service keeps why it asked the hub for this stop (an idle cull, a silent
            # server, the owner's release): the release answers with it, and the hub's
            # "not running" page tells the person who comes back (see stop_notice).
            released = released or {}
            why = released.get("release_reason")
            if why and why != STOPPED:
                self.last_stop = {"reason": why, "at": released.get("released_at")}

    # Why gpuslice last stopped this server, until its next start: {"reason", "at"}.
    last_stop: dict[str, Any] | None = None

    def stop_notice(self) -> str | None:
        """One sentence for the hub's "Server not running" page when gpuslice had the
        server stopped (templates/hub/not_running.html), else None."""
        if not self.last_stop or not self.last_stop.get("reason"):
            return None
        at = str(self.last_stop.get("at") or "")
        when = f" on {at[:10]} at {at[11:16]} UTC" if len(at) >= 16 else ""
        return (
            f"gpuslice stopped this server{when} and gave its GPU slice back to the pool "
            f"({self.last_stop['reason']}). Files you saved are kept; what was only in memory "
            "(variables, unsaved edits) is gone. Start it again to get a GPU slice."
        )

    async def poll(self) -> int | None:
        status = await super().poll()  # type: ignore[misc]
        if status is not None and self.allocation_id and not self._stopping:
            # The hub does not call stop() for a server that has already exited (it polls
            # first), so a dead server's slice is released here.
            await self._release(f"server exited (status {status})")
        return status  # type: ignore[no-any-return]

    async def _release(self, reason: str) -> dict[str, Any] | None:
        """Give the slice back; the service's record of it (None when nothing was held,
        or the release failed and is retried later)."""
        if not self.allocation_id:
            return None
        try:
            released = await self.client.release(self.allocation_id, reason)
        except ServiceError as e:
            # Keep the id: the next start or stop retries, and the service's reconciler
            # releases it anyway once the server is gone.
            self.log.warning(  # type: ignore[attr-defined]
                "could not release allocation %s: %s (the gpuslice service frees it itself "
                "when its reconciler next finds the server gone)",
                self.allocation_id,
                e,
            )
            return None
        self.allocation_id = 0
        self.grant = None
        return released

    async def _release_unrecorded(self, reason: str, starts: int | None = None) -> None:
        """Release what the ledger holds for this server without this spawner having its id:
        a spawn cancelled (a stop, the hub's start_timeout) or without an answer after the
        service granted it. Only while this server is neither running nor starting.

        ``starts``: :attr:`_starts` when the caller decided to look; nothing is released if a
        start has begun since (what was listed may then be that start's own slice)."""
        try:
            held = await self.client.server_allocations(
                self.user.name,  # type: ignore[attr-defined]
                self.name,  # type: ignore[attr-defined]
            )
            if starts is not None and starts != self._starts:
                return
            for alloc in held:
                await self.client.release(alloc["id"], reason)
        except ServiceError as e:
            self.log.warning(  # type: ignore[attr-defined]
                "could not release the slices an unfinished spawn of %s left: %s (the gpuslice "
                "service frees them itself when its reconciler next finds the server gone)",
                self._log_name,
                e,
            )

    async def _sweep_after_cancel(self) -> None:
        """After a cancelled spawn: release a slice the service granted too late, once it
        has had time to answer (soon, then after the client's own timeout)."""
        starts = self._starts
        for delay in (1.0, self.service_timeout):
            await asyncio.sleep(delay)
            if starts != self._starts:
                return  # started again; that start released what was left (see start())
            await self._release_unrecorded(
                "its spawn was given up before the slice was granted", starts
            )

    # background tasks (kept referenced until done)
    _tasks: ClassVar[set[asyncio.Task[None]]] = set()

    def _background(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    grant: dict[str, Any] | None = None

    def get_env(self) -> dict[str, str]:
        env = super().get_env()  # type: ignore[misc]
        if self.grant:
            env.update(
                slice_env(
                    self.grant,
                    self.server_service_url or self.service_url,
                    self.mps_pipe_directory,
                )
            )
        return env

    def get_state(self) -> dict[str, Any]:
        state = super().get_state()  # type: ignore[misc]
        if self.allocation_id:
            state["gpuslice_allocation_id"] = self.allocation_id
            state["gpuslice_grant"] = json.dumps(self.grant) if self.grant else None
        if self.last_stop:
            state["gpuslice_last_stop"] = self.last_stop
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)  # type: ignore[misc]
        self.allocation_id = int(state.get("gpuslice_allocation_id") or 0)
        raw = state.get("gpuslice_grant")
        self.grant = json.loads(raw) if raw else None
        last_stop = state.get("gpuslice_last_stop")
        self.last_stop = last_stop if isinstance(last_stop, dict) else None

    def clear_state(self) -> None:
        super().clear_state()  # type: ignore[misc]
        # The id is cleared only by a successful release (see _release), never here:
        # clearing it on a failed release would leak the slice.


class GPUSliceSpawner(GPUSliceMixin, LocalProcessSpawner):
    """Local processes, one system user per hub user (the embedded default launcher)."""


class GPUSliceSimpleSpawner(GPUSliceMixin, SimpleLocalProcessSpawner):
    """Local processes all run as the hub's user: for demos and tests on one machine."""
