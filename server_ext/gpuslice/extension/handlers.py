"""REST API of the server extension, under ``<base_url>/gpuslice/api/``."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from gpuslice.jsonbody import BodyError, parse_json_object

from .monitor import Monitor
from .reclaim import ExtensionRefused
from .service import ServiceError

AUTH_RESOURCE = "gpuslice"


class GPUSliceHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def monitor(self) -> Monitor:
        return self.settings["gpuslice_monitor"]  # type: ignore[no-any-return]

    def body(self, allowed: set[str]) -> dict[str, Any]:
        try:
            return parse_json_object(self.request.body, allowed)
        except BodyError as e:
            raise web.HTTPError(e.status, str(e)) from e


def positive_seconds(value: Any) -> float:
    """``value`` as a positive number of seconds, else 400 (an integer of hundreds of
    digits is valid JSON but no float: it is refused here, not left to fail later)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        with contextlib.suppress(OverflowError):
            seconds = float(value)
            if seconds > 0:
                return seconds
    raise web.HTTPError(400, "field 'seconds' must be a positive number of seconds")


class StatusHandler(GPUSliceHandler):
    # A JupyterLab tab polls this every few seconds: that is not the user doing anything,
    # and must not keep an idle server alive for the hub's idle culler.
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(self.monitor.status()))


class KeepAliveHandler(GPUSliceHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        data = self.body({"kernel_id", "seconds"})
        kernel_id = data.get("kernel_id")
        if kernel_id is not None and (
            not isinstance(kernel_id, str) or kernel_id not in self.monitor.km
        ):
            raise web.HTTPError(404, f"no kernel {kernel_id!r} in this server")
        seconds = data.get("seconds")
        if seconds is not None:
            seconds = positive_seconds(seconds)
        try:
            reply = await self.monitor.keepalive(kernel_id, seconds)
        except ExtensionRefused as e:
            raise web.HTTPError(400, str(e)) from None
        self.finish(json.dumps(reply))


class ReleaseHandler(GPUSliceHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        self.body(set())
        service = self.monitor.service
        if service is None or not service.configured or not service.allocation_id:
            raise web.HTTPError(
                409, "this server holds no gpuslice allocation (not started by gpuslice)"
            )
        try:
            reply = await service.reclaim("released by the user", voluntary=True)
        except ServiceError as e:
            raise web.HTTPError(502, f"the gpuslice service did not release the GPU: {e}") from e
        # Every tab of this server hears it (the one that asked knows already): theirs
        # would otherwise keep counting down to a cull that will not come.
        self.monitor.released()
        self.set_status(202)
        self.finish(json.dumps({"released": True, **reply}))


def default_handlers() -> list[tuple[str, type[web.RequestHandler]]]:
    return [
        ("status", StatusHandler),
        ("keepalive", KeepAliveHandler),
        ("release", ReleaseHandler),
    ]
