"""Batch-job routes of the single-user server, under ``<base_url>/gpuslice/api/``.

The server acts for its logged-in user: it resolves the notebook path inside the user's
notebook root (never outside it), sends the notebook to the gpuslice service with the
server's own hub token (so the service sees the user, and only the user), and creates the
job folder ``gpu-jobs/<name>-<id>/`` next to the user's notebooks with a copy of the
submitted notebook. When a job finishes, its output notebook, HTML and log are copied into
that folder and a ``https://events.gpuslice.dev/jobs/v1`` event tells JupyterLab.

Code the user runs may plant symbolic links anywhere under the notebook root (``gpu-jobs``
itself, a job folder, a file in one). So every file this module reads or writes under the
root is opened beneath it one component at a time, never following a link
(:func:`gpuslice.run.jobdir.open_beneath`, :func:`ensure_dir_beneath`); what is in the way
is refused (4xx) or left alone, never followed.

The ExtensionApp registers :func:`handlers`; this module does not import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlencode

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.extension.handler import ExtensionHandlerMixin
from tornado import web

from gpuslice.errors import GPUSliceError
from gpuslice.jsonbody import BodyError, parse_json_object
from gpuslice.jsonclient import JSONClient, JSONError
from gpuslice.run.jobdir import open_beneath
from gpuslice.vocab import JOB_SUBMIT_FIELDS, SERVER_FILLED_FIELDS, TERMINAL_JOB_STATES

log = logging.getLogger(__name__)

JOBS_FOLDER = "gpu-jobs"
# The service's job ids are 64-bit signed integers; a longer one names no job.
MAX_JOB_ID = 2**63 - 1
# The service's default max_notebook_bytes, used until the service has said its own (in the
# ``jobs`` of its ``api/profiles`` answer): a larger notebook is refused before it is sent.
MAX_NOTEBOOK_BYTES = 16 * 1024 * 1024
# The marker file is a few dozen bytes; read no more than this of it.
MAX_MARKER_BYTES = 4096
TERMINAL = TERMINAL_JOB_STATES
# The most of a job's log the service hands out (its ``tail`` limit): the whole log, but for
# one that printed more than that over many attempts (the runner keeps 1 MiB an attempt).
WHOLE_LOG_BYTES = 10_000_000
# What the lab sends: the service's fields less those this proxy fills in itself
SUBMIT_FIELDS = JOB_SUBMIT_FIELDS - SERVER_FILLED_FIELDS
# What a resubmission keeps of the job it repeats (the service's own record of it).
RESUBMIT_FIELDS = tuple(sorted(SUBMIT_FIELDS - {"path"}))
# The JSON types the fields of a submission may have (``None`` is left to the service).
SUBMIT_TYPES: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "profile": (str,),
    "priority": (str,),
    "slices": (int,),
    "checkpoint_interval": (int, float),
    "max_runtime": (int, float),
    "parameters": (dict,),
    "time_window": (str,),
    "burstable": (bool,),
}
_TYPE_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a number",
    dict: "an object",
    bool: "true or false",
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


class ProxyError(GPUSliceError, web.HTTPError):
    """The service's answer, passed on to the browser with its status and message."""


class Service:
    """The gpuslice service, called with this server's hub token."""

    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.http = JSONClient(url, token, timeout)

    @classmethod
    def from_env(cls) -> Service:
        return cls(
            os.environ.get("GPUSLICE_SERVICE_URL", ""), os.environ.get("JUPYTERHUB_API_TOKEN", "")
        )

    async def call(self, method: str, path: str, body: Any = None, raw: bool = False) -> Any:
        """The service's answer; a refusal or an outage is passed on as its status and
        message (504 when it did not answer in time, 503 when it cannot be reached)."""
        if not self.http.configured:
            raise web.HTTPError(
                503, "this server has no gpuslice service (GPUSLICE_SERVICE_URL is not set)"
            )
        try:
            return await self.http.request(method, path, body, raw=raw)
        except JSONError as e:
            raise ProxyError(e.status, e.message) from None


def resolve_notebook(root: str, path: Any) -> Path:
    """The notebook at ``path`` (relative to the user's root), refusing anything outside it."""
    if not isinstance(path, str) or not path.strip() or "\0" in path:
        raise web.HTTPError(400, "field 'path' (the notebook's path) is required")
    rel = PurePosixPath(path.lstrip("/"))
    if ".." in rel.parts:
        raise web.HTTPError(403, f"{path!r} is outside your notebook folder")
    root_real = Path(root).resolve()
    try:
        full = (root_real / rel).resolve()
        if full != root_real and root_real not in full.parents:
            raise web.HTTPError(403, f"{path!r} is outside your notebook folder")
        if full.suffix != ".ipynb":
            raise web.HTTPError(400, f"{path!r} is not a notebook (.ipynb)")
        if not full.is_file():
            raise web.HTTPError(404, f"no notebook at {path!r}")
    except OSError as e:
        # the path the user gave cannot even be looked up (a name over 255 bytes, a path
        # over 4096, ...): their mistake, said as one, never a 500
        shown = path if len(path) <= 200 else path[:200] + "..."
        raise web.HTTPError(
            400, f"{shown!r} cannot be a notebook's path: {e.strerror or e}"
        ) from None
    return full


def check_submit_types(body: dict[str, Any]) -> None:
    """Refuse a field of the wrong JSON type here (400), before the service sees it; the
    service checks the values (known profile, ranges, parameter names)."""
    for field, types in SUBMIT_TYPES.items():
        value = body.get(field)
        if value is None:
            continue
        # (JSON's true and false are Python ints too: only a bool field takes them)
        if isinstance(value, bool) != (types == (bool,)) or not isinstance(value, types):
            raise web.HTTPError(400, f"field {field!r} must be {_TYPE_NAMES[types[-1]]}")


def job_id_of(job_id: str) -> int:
    """The job id of a ``jobs/(\\d+)`` route: ASCII digits naming a 64-bit id, else 404
    (answered here: the service has no such job, and ``int()`` of thousands of digits
    fails)."""
    digits = job_id.lstrip("0") or "0"
    if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(MAX_JOB_ID)):
        raise web.HTTPError(404, f"no job {job_id[:40]!r}")
    number = int(digits)
    if number > MAX_JOB_ID:
        raise web.HTTPError(404, f"no job {job_id!r}")
    return number


def job_folder_rel(job: dict[str, Any]) -> str:
    """``gpu-jobs/<name>-<id>``, the job's folder relative to the notebook root (502 when the
    service says anything else)."""
    rel = job.get("output_path", "")
    parts = PurePosixPath(rel).parts if isinstance(rel, str) else ()
    if len(parts) != 2 or parts[0] != JOBS_FOLDER or not _FOLDER.match(parts[1]):
        raise web.HTTPError(502, f"the service gave an unexpected output path {rel!r}")
    return f"{JOBS_FOLDER}/{parts[1]}"


def _parts_beneath(rel: str) -> tuple[str, ...]:
    parts = PurePosixPath(rel).parts
    if not parts or any(p in ("..", ".", "/") for p in parts):
        raise OSError(errno.EINVAL, "not a path inside the notebook folder", rel)
    return parts


def ensure_dir_beneath(root: str | Path, rel: str) -> None:
    """Make the folder ``root/rel`` (and each folder on the way) unless it is there, never
    following a link: a link, or anything but a folder, at any step raises OSError."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in _parts_beneath(rel):
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o777, dir_fd=fd)
            sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = sub
    finally:
        os.close(fd)


def check_dir_beneath(root: str | Path, rel: str) -> None:
    """Like :func:`ensure_dir_beneath`, but makes nothing: a missing folder is fine."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in _parts_beneath(rel):
            try:
                sub = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except FileNotFoundError:
                return
            os.close(fd)
            fd = sub
    finally:
        os.close(fd)


def _check_single(fd: int, rel: str) -> None:
    """A file reached without a symbolic link may still be a hard link to one elsewhere."""
    if os.fstat(fd).st_nlink > 1:
        os.close(fd)
        raise OSError(errno.EMLINK, "has more than one name (a hard link)", rel)


def read_beneath(root: str | Path, rel: str, max_bytes: int = -1, single: bool = True) -> bytes:
    """The regular file ``root/rel``, reached without following a link (and with no other
    name, unless ``single`` is false)."""
    fd = open_beneath(Path(root), rel, os.O_RDONLY | os.O_NONBLOCK)
    if single:
        _check_single(fd, rel)
    with os.fdopen(fd, "rb") as f:
        return f.read(max_bytes)


def write_beneath(root: str | Path, rel: str, data: bytes) -> None:
    """Create or replace the contents of the regular file ``root/rel`` (its folder must
    exist), never following a link: a link or anything but a plain file raises OSError."""
    fd = open_beneath(Path(root), rel, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK, 0o666)
    _check_single(fd, rel)
    with os.fdopen(fd, "wb") as f:
        f.truncate(0)
        f.write(data)


# What a link, or something else that is not a plain folder or file, in the way gives.
_LINK_ERRNOS = (None, errno.ELOOP, errno.ENOTDIR, errno.EMLINK, errno.EINVAL, errno.ENXIO)


def refusal(e: OSError, rel: str, what: str, then: str = "") -> web.HTTPError:
    """The answer when ``rel`` cannot be read or written: 409 for what the user put in the
    way (a link, a file where a folder belongs, no permission), 500 for the rest."""
    if e.errno in _LINK_ERRNOS:
        why = "it, or a folder on its way, is a link or not a plain file or folder"
        why += "; gpuslice does not follow links"
    else:
        why = e.strerror or str(e)
    status = 500
    if e.errno in _LINK_ERRNOS or e.errno in (errno.EACCES, errno.EPERM, errno.EISDIR):
        status = 409
    elif e.errno == errno.ENAMETOOLONG:  # (a path the user gave: theirs to shorten)
        status = 400
    return web.HTTPError(status, f"cannot {what} {rel!r}: {why}{then}")


async def sync_outputs(service: Service, root: str, job: dict[str, Any]) -> bool:
    """Copy a finished job's outputs into its folder once; True when copied now.

    Nothing is written through a link: when the job folder (or ``gpu-jobs``) is a link or
    not a folder, nothing is copied; a file whose name is taken by a link is skipped."""
    if job.get("state") not in TERMINAL:
        return False
    root_real = Path(root).resolve()
    folder = job_folder_rel(job)
    marker = f"{folder}/.gpuslice-job.json"
    # (a marker that does not read as one, however deep its nesting, is no marker)
    with contextlib.suppress(OSError, ValueError, RecursionError):
        done = json.loads(read_beneath(root_real, marker, MAX_MARKER_BYTES))
        if isinstance(done, dict) and done.get("state") == job["state"]:
            return False
    try:
        ensure_dir_beneath(root_real, folder)
    except OSError as e:
        log.warning("gpuslice: not copying the outputs of job %s into %s: %s", job["id"], folder, e)
        return False

    def write(name: str, data: bytes) -> bool:
        try:
            write_beneath(root_real, f"{folder}/{name}", data)
            return True
        except OSError as e:
            log.warning("gpuslice: not writing %s/%s: %s", folder, name, e)
            return False

    copied = True
    for fmt, name in (("ipynb", "output.ipynb"), ("html", "output.html")):
        try:
            data = await service.call("GET", f"api/jobs/{job['id']}/output?format={fmt}", raw=True)
        except ProxyError as e:
            if e.status_code != 404:
                raise
            continue
        copied = write(name, data) and copied
    # the whole log (the runner keeps at most 1 MiB of printed output, and its own events),
    # where the panel shows only the service's default tail
    reply = await service.call("GET", f"api/jobs/{job['id']}/log?tail={WHOLE_LOG_BYTES}")
    copied = write("job.log", str(reply.get("log", "")).encode("utf-8", "replace")) and copied
    if copied:
        # Told only once all of it is here: the service then removes the job's own folder
        # after its job_folder_retention_days (one not told keeps it until its history
        # retention). A service that cannot hear it now hears it at the next try.
        try:
            await service.call("POST", f"api/jobs/{job['id']}/collected", {})
        except ProxyError as e:
            if e.status_code >= 500:
                raise
            log.info(
                "gpuslice: the service did not take job %s's outputs as copied: %s", job["id"], e
            )
    write(".gpuslice-job.json", json.dumps({"id": job["id"], "state": job["state"]}).encode())
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
            except Exception:
                # one job's folder must not end the watch for the others' outputs
                log.exception("gpuslice: copying job outputs failed; trying again")
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
    @property
    def _track_activity(self) -> bool:  # type: ignore[override]
        # A read is the lab's poll (every 30 s in a hidden tab while a job is unfinished):
        # not the user's activity. A submit, a cancel or a resubmit is.
        return self.request.method != "GET"

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

    def remember_limits(self, standing: Any) -> None:
        """Keep the notebook limit the service states in an ``api/profiles`` answer (the
        submit dialog asks for one each time it opens): the service's setting is the one
        place it is set."""
        jobs = standing.get("jobs") if isinstance(standing, dict) else None
        limit = jobs.get("max_notebook_bytes") if isinstance(jobs, dict) else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            self.settings["gpuslice_max_notebook_bytes"] = limit

    async def notebook_limit(self) -> int:
        """The largest notebook the service takes, as it last said (asked once if it never
        did; a service that does not say has the default)."""
        if "gpuslice_max_notebook_bytes" not in self.settings:
            self.remember_limits(await self.service.call("GET", "api/profiles"))
        return int(self.settings.setdefault("gpuslice_max_notebook_bytes", MAX_NOTEBOOK_BYTES))

    def body(self) -> dict[str, Any]:
        try:
            return parse_json_object(self.request.body, SUBMIT_FIELDS)
        except BodyError as e:
            raise web.HTTPError(e.status, str(e)) from e

    async def submit(self, body: dict[str, Any], source: str, rel: str) -> dict[str, Any]:
        """Submit the notebook at ``source`` (relative to the root, read without following a
        link) as ``rel``, and keep a copy of it in the new job's folder."""
        root = Path(self.root).resolve()
        limit = await self.notebook_limit()
        try:
            # a notebook the user picked may have other names; a snapshot in gpu-jobs may not
            single = PurePosixPath(source).parts[0] == JOBS_FOLDER
            raw = read_beneath(root, source, limit + 1, single=single)
            if len(raw) > limit:
                size = f"{limit >> 20} MiB" if limit % (1 << 20) == 0 else f"{limit} bytes"
                raise web.HTTPError(
                    413,
                    f"{source!r} is larger than {size}, the most the gpuslice service takes "
                    "(its max_notebook_bytes): clear its outputs, or keep large data next to "
                    "it rather than in it",
                )
            notebook = json.loads(raw)
        except FileNotFoundError:
            raise web.HTTPError(404, f"no notebook at {source!r}") from None
        except OSError as e:
            raise refusal(e, source, "read") from None
        except (ValueError, RecursionError) as e:
            raise web.HTTPError(400, f"{source!r} is not a readable notebook: {e}") from None
        try:
            check_dir_beneath(root, JOBS_FOLDER)
        except OSError as e:
            raise refusal(e, JOBS_FOLDER, "use") from None
        # It runs in the notebook's own folder, as the interactive kernel would: relative
        # paths to data next to it resolve, and what it writes lands there.
        workdir = str(root / PurePosixPath(rel).parent)
        job = await self.service.call(
            "POST", "api/jobs", {**body, "path": rel, "notebook": notebook, "workdir": workdir}
        )
        folder = job_folder_rel(job)
        snapshot = f"{folder}/{PurePosixPath(source).name}"
        try:
            ensure_dir_beneath(root, folder)
            write_beneath(root, snapshot, json.dumps(notebook, indent=1).encode())
        except OSError as e:
            # The job must not run with no folder to land in: take it back, say why.
            with contextlib.suppress(web.HTTPError):
                await self.service.call("DELETE", f"api/jobs/{int(job['id'])}")
            raise refusal(e, snapshot, "write", f" (job {job['id']} was cancelled)") from None
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
        check_submit_types(body)
        rel = source.relative_to(Path(self.root).resolve()).as_posix()
        job = await self.submit(body, rel, rel)
        self.set_status(201)
        self.finish(json.dumps(job))


class JobHandler(JobsProxyHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        job = await self.service.call("GET", f"api/jobs/{job_id_of(job_id)}")
        if await sync_outputs(self.service, self.root, job):
            self.watcher().emit(job)
        self.finish(json.dumps(job))

    @web.authenticated
    @authorized
    async def delete(self, job_id: str) -> None:
        job = await self.service.call("DELETE", f"api/jobs/{job_id_of(job_id)}")
        self.finish(json.dumps(job))


class JobLogHandler(JobsProxyHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        reply = await self.service.call("GET", f"api/jobs/{job_id_of(job_id)}/log")
        self.finish(json.dumps(reply))


class ResubmitHandler(JobsProxyHandler):
    """Run a job's notebook snapshot again, with the same settings."""

    @web.authenticated
    @authorized
    async def post(self, job_id: str) -> None:
        number = job_id_of(job_id)
        old = await self.service.call("GET", f"api/jobs/{number}")
        path = old.get("path") or "notebook.ipynb"
        if not isinstance(path, str):
            raise web.HTTPError(502, f"the service gave an unexpected notebook path {path!r}")
        snapshot = f"{job_folder_rel(old)}/{PurePosixPath(path).name}"
        root = Path(self.root).resolve()
        try:
            # only to tell a missing snapshot (404) from one in the way: submit reads it
            os.close(open_beneath(root, snapshot, os.O_RDONLY | os.O_NONBLOCK))
        except FileNotFoundError:
            raise web.HTTPError(404, f"the notebook snapshot of job {number} is gone") from None
        except OSError:
            pass  # submit refuses it (409), naming the path
        # the same settings: its time window and burstable too (what the job was given,
        # a window its class imposed included)
        body = {k: old[k] for k in RESUBMIT_FIELDS if k in old}
        if not body.get("burstable"):
            body.pop("burstable", None)
        if body.get("time_window") is not None:
            # A window the job's class has (now) is the class's to impose: the one the job
            # ran in may have been the class's then, since changed by the admins.
            standing = await self.service.call("GET", "api/profiles")
            self.remember_limits(standing)
            classes = ((standing or {}).get("jobs") or {}).get("class_windows") or {}
            if body.get("priority") in classes:
                body.pop("time_window")
        job = await self.submit(body, snapshot, old.get("path") or "")
        self.set_status(201)
        self.finish(json.dumps(job))


class ProfilesHandler(JobsProxyHandler):
    _track_activity = False

    @web.authenticated
    @authorized
    async def get(self) -> None:
        standing = await self.service.call("GET", "api/profiles")
        self.remember_limits(standing)
        self.finish(json.dumps(standing))


def handlers() -> list[tuple[str, type]]:
    """Routes relative to ``gpuslice/api/`` for the ExtensionApp."""
    return [
        ("jobs", JobsHandler),
        (r"jobs/(\d+)", JobHandler),
        (r"jobs/(\d+)/log", JobLogHandler),
        (r"jobs/(\d+)/resubmit", ResubmitHandler),
        ("profiles", ProfilesHandler),
    ]
