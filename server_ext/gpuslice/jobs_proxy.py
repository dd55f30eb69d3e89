"""Batch-job routes of the single-user server, under ``<base_url>/gpuslice/api/``.

The server acts for its logged-in user: it resolves the notebook path inside the user's
notebook root (never outside it), sends the notebook to the gpuslice service with the
server's own hub token (so the service sees the user, and only the user), and creates the
job folder ``gpu-jobs/<name>-<id>/`` next to the user's notebooks with a copy of the
submitted notebook. When a job finishes, its output notebook, HTML and log are copied into
that folder and a ``https://events.gpuslice.dev/jobs/v1`` event tells JupyterLab.

The ExtensionApp registers :func:`handlers`; this module does not import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlencode

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from gpuslice.jsonbody import BodyError, parse_json_object

JOBS_FOLDER = "gpu-jobs"
TERMINAL = {"completed", "failed", "cancelled", "timed-out"}
SUBMIT_FIELDS = {
    "path",
    "name",
    "profile",
    "slices",
    "priority",
    "checkpoint_interval",
    "max_runtime",
    "parameters",
}
_FOLDER = re.compile(r"^[A-Za-z0-9_.-]{1,60}-\d+$")
EVENT_SCHEMA_ID = "https://events.gpuslice.dev/jobs/v1"
EVENT_SCHEMA: dict[str, Any] = {
    "$id": EVENT_SCHEMA_ID,
    "version": "1",
    "title": "gpuslice batch jobs",
    "personal-data": True,
    "description": "A batch job of this user reached a final state; outputs are in its folder.",
    "type": "object",
    "required": ["job_id", "state", "output_path"],
    "properties": {
        "job_id": {"type": "integer", "description": "The job's id in the gpuslice service."},
        "name": {"type": "string", "description": "The job's name."},
        "state": {
            "enum": sorted(TERMINAL),
            "description": "completed, failed, cancelled or timed-out.",
        },
        "output_path": {"type": "string", "description": "Folder with the outputs."},
        "error": {"type": ["string", "null"], "description": "Why it failed, if it did."},
    },
}


class ProxyError(web.HTTPError):
    """The service's answer, passed on to the browser with its status and message."""


class Service:
    """The gpuslice service, called with this server's hub token."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/") + "/" if url else ""
        self.token = token
        self.timeout = timeout

    @classmethod
    def from_env(cls) -> Service:
        return cls(
            os.environ.get("GPUSLICE_SERVICE_URL", ""), os.environ.get("JUPYTERHUB_API_TOKEN", "")
        )

    async def call(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        if not (self.url and self.token):
            raise web.HTTPError(
                503, "this server has no gpuslice service (GPUSLICE_SERVICE_URL is not set)"
            )
        req = HTTPRequest(
            self.url + path,
            method=method,
            headers={"Authorization": f"token {self.token}", "Content-Type": "application/json"},
            body=None if body is None else json.dumps(body),
            request_timeout=self.timeout,
            follow_redirects=False,
            allow_nonstandard_methods=True,
        )
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:
            message = f"the gpuslice service answered {e.code}"
            if e.response is not None and e.response.body:
                with contextlib.suppress(ValueError, AttributeError):
                    message = json.loads(e.response.body).get("message", message)
            raise ProxyError(e.code, message) from None
        except OSError as e:
            raise ProxyError(503, f"the gpuslice service cannot be reached: {e}") from None
        if raw:
            return resp.body
        return json.loads(resp.body) if resp.body else None


def resolve_notebook(root: str, path: Any) -> Path:
    """The notebook at ``path`` (relative to the user's root), refusing anything outside it."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise web.HTTPError(400, "field 'path' (the notebook's path) is required")
    rel = PurePosixPath(path.lstrip("/"))
    if ".." in rel.parts:
        raise web.HTTPError(403, f"{path!r} is outside your notebook folder")
    root_real = Path(root).resolve()
    full = (root_real / rel).resolve()
    if full != root_real and root_real not in full.parents:
        raise web.HTTPError(403, f"{path!r} is outside your notebook folder")
    if full.suffix != ".ipynb":
        raise web.HTTPError(400, f"{path!r} is not a notebook (.ipynb)")
    if not full.is_file():
        raise web.HTTPError(404, f"no notebook at {path!r}")
    return full


def job_folder(root: str, job: dict[str, Any]) -> Path:
    rel = str(job.get("output_path", ""))
    parts = PurePosixPath(rel).parts
    if len(parts) != 2 or parts[0] != JOBS_FOLDER or not _FOLDER.match(parts[1]):
        raise web.HTTPError(502, f"the service gave an unexpected output path {rel!r}")
    return Path(root).resolve() / JOBS_FOLDER / parts[1]


async def sync_outputs(service: Service, root: str, job: dict[str, Any]) -> bool:
    """Copy a finished job's outputs into its folder once; True when copied now."""
    if job.get("state") not in TERMINAL:
        return False
    folder = job_folder(root, job)
    marker = folder / ".gpuslice-job.json"
    with contextlib.suppress(OSError, ValueError):
        if json.loads(marker.read_text()).get("state") == job["state"]:
            return False
    folder.mkdir(parents=True, exist_ok=True)
    for fmt, name in (("ipynb", "output.ipynb"), ("html", "output.html")):
        try:
            data = await service.call("GET", f"api/jobs/{job['id']}/output?format={fmt}", raw=True)
        except ProxyError as e:
            if e.status_code != 404:
                raise
            continue
        (folder / name).write_bytes(data)
    log = await service.call("GET", f"api/jobs/{job['id']}/log")
    (folder / "job.log").write_text(log.get("log", ""))
    marker.write_text(json.dumps({"id": job["id"], "state": job["state"]}))
    return True


class JobWatcher:
    """Polls the service while this user has unfinished jobs; copies outputs and tells
    JupyterLab (through the server's event bus) when one finishes."""

    def __init__(self, service: Service, root: str, event_logger: Any, interval: float) -> None:
        self.service = service
        self.root = root
        self.event_logger = event_logger
        self.interval = interval
        self.task: asyncio.Future | None = None
        if event_logger is not None and EVENT_SCHEMA_ID not in getattr(
            event_logger.schemas, "schema_ids", ()
        ):
            event_logger.register_event_schema(EVENT_SCHEMA)

    def ensure_running(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                jobs = (await self.service.call("GET", "api/jobs?limit=200"))["jobs"]
                for job in jobs:
                    if await sync_outputs(self.service, self.root, job):
                        self.emit(job)
                if not any(j["state"] not in TERMINAL for j in jobs):
                    return  # started again by the next submission or listing
            except (web.HTTPError, OSError, KeyError, ValueError):
                pass  # the service may be restarting: try again next round
            await asyncio.sleep(self.interval)

    def emit(self, job: dict[str, Any]) -> None:
        if self.event_logger is None:
            return
        self.event_logger.emit(
            schema_id=EVENT_SCHEMA_ID,
            data={
                "job_id": job["id"],
                "name": job.get("name", ""),
                "state": job["state"],
                "output_path": job["output_path"],
                "error": job.get("error"),
            },
        )


class JobsProxyHandler(ExtensionHandlerMixin, APIHandler):
    auth_resource = "gpuslice"

    @property
    def service(self) -> Service:
        if "gpuslice_jobs_service" not in self.settings:
            self.settings["gpuslice_jobs_service"] = Service.from_env()
        return self.settings["gpuslice_jobs_service"]  # type: ignore[no-any-return]

    @property
    def root(self) -> str:
        return str(self.contents_manager.root_dir)

    def watcher(self) -> JobWatcher:
        if "gpuslice_jobs_watcher" not in self.settings:
            logger = getattr(self.serverapp, "event_logger", None)
            interval = float(os.environ.get("GPUSLICE_JOB_POLL_INTERVAL", "5"))
            self.settings["gpuslice_jobs_watcher"] = JobWatcher(
                self.service, self.root, logger, interval
            )
        watcher: JobWatcher = self.settings["gpuslice_jobs_watcher"]
        watcher.ensure_running()
        return watcher

    def body(self) -> dict[str, Any]:
        try:
            return parse_json_object(self.request.body, SUBMIT_FIELDS)
        except BodyError as e:
            raise web.HTTPError(400, str(e)) from e

    async def submit(self, body: dict[str, Any], source: Path, rel: str) -> dict[str, Any]:
        try:
            notebook = json.loads(source.read_text())
        except (OSError, ValueError) as e:
            raise web.HTTPError(400, f"{rel!r} is not a readable notebook: {e}") from None
        job = await self.service.call(
            "POST", "api/jobs", {**body, "path": rel, "notebook": notebook}
        )
        folder = job_folder(self.root, job)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / source.name).write_text(json.dumps(notebook, indent=1))
        self.watcher()
        return job  # type: ignore[no-any-return]


class JobsHandler(JobsProxyHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        query = {k: self.get_argument(k) for k in ("state", "limit") if self.get_argument(k, "")}
        reply = await self.service.call("GET", "api/jobs?" + urlencode(query))
        if any(j["state"] not in TERMINAL for j in reply["jobs"]):
            self.watcher()
        self.finish(json.dumps(reply))

    @web.authenticated
    @authorized
    async def post(self) -> None:
        body = self.body()
        source = resolve_notebook(self.root, body.get("path"))
        rel = source.relative_to(Path(self.root).resolve()).as_posix()
        self.set_status(201)
        self.finish(json.dumps(await self.submit(body, source, rel)))


class JobHandler(JobsProxyHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        job = await self.service.call("GET", f"api/jobs/{job_id}")
        if await sync_outputs(self.service, self.root, job):
            self.watcher().emit(job)
        self.finish(json.dumps(job))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        self.finish(json.dumps(await self.service.call("DELETE", f"api/jobs/{job_id}")))


class JobLogHandler(JobsProxyHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        self.finish(json.dumps(await self.service.call("GET", f"api/jobs/{job_id}/log")))


class ResubmitHandler(JobsProxyHandler):
    """Run a job's notebook snapshot again, with the same settings."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        old = await self.service.call("GET", f"api/jobs/{job_id}")
        folder = job_folder(self.root, old)
        snapshot = folder / PurePosixPath(old.get("path") or "notebook.ipynb").name
        if not snapshot.is_file():
            raise web.HTTPError(404, f"the notebook snapshot of job {job_id} is gone")
        body = {
            k: old[k]
            for k in (
                "name",
                "profile",
                "slices",
                "priority",
                "checkpoint_interval",
                "max_runtime",
                "parameters",
            )
            if k in old
        }
        self.set_status(201)
        self.finish(json.dumps(await self.submit(body, snapshot, old.get("path") or "")))


class ProfilesHandler(JobsProxyHandler):
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(await self.service.call("GET", "api/profiles")))


def handlers() -> list[tuple[str, type]]:
    """Routes relative to ``gpuslice/api/`` for the ExtensionApp."""
    return [
        ("jobs", JobsHandler),
        (r"jobs/(\d+)", JobHandler),
        (r"jobs/(\d+)/log", JobLogHandler),
        (r"jobs/(\d+)/resubmit", ResubmitHandler),
        ("profiles", ProfilesHandler),
    ]
