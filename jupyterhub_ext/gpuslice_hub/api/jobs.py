"""Batch jobs: submit, list, show, cancel, log, outputs; preempt (admins)."""

from __future__ import annotations

import asyncio
from typing import Any

from gpuslice.vocab import JOB_SUBMIT_FIELDS

from ..jobs.manager import JobManager
from ..jobs.serialize import output_path
from ..jobs.states import ALLOWED, TERMINAL
from .base import BaseHandler, Identity, RequestError, api_authenticated, int_arg

STATES = {s for s in ALLOWED if s} | set(TERMINAL)


class JobsBase(BaseHandler):
    @property
    def jobs(self) -> JobManager:
        jobs = self.service.jobs
        if jobs is None:
            raise RequestError(503, "the job scheduler is not running")
        return jobs

    async def owned(self, ident: Identity, job_id: str) -> Any:
        # a database read (the JupyterLab panel asks after each job it shows): in a thread
        job = await asyncio.to_thread(self.jobs.row, self.db_id(job_id, "job"))
        if job is None:
            raise RequestError(404, f"no job {job_id}")
        if not ident.sees_all and job.user != ident.name:
            # the same answer as for a job that does not exist: ids are not a side channel
            raise RequestError(404, f"no job {job_id}")
        return job


class JobsHandler(JobsBase):
    def body_limit(self) -> tuple[int, str]:
        if self.request.method == "POST":  # a submission, which carries the notebook
            return self.service.max_notebook_bytes, "max_notebook_bytes"
        return super().body_limit()

    def too_large_hint(self) -> str:
        return (
            " for a job submission, the notebook included: clear its outputs, or keep large "
            "data next to it rather than in it"
        )

    @api_authenticated
    async def get(self) -> None:
        ident = self.identity()
        user = self.listed_user(ident, "jobs")
        raw = self.get_argument("state", "")
        states = {s for s in raw.split(",") if s} or None
        if states and not states <= STATES:
            raise RequestError(400, f"unknown state in {raw!r}; states: {sorted(STATES)}")
        limit = int_arg(self, "limit", 200, 1, 2000)
        order = self.get_argument("order", "newest")
        if order not in ("newest", "run"):
            raise RequestError(400, f"query argument order must be newest or run, got {order!r}")
        cursor = int_arg(self, "cursor", 0, 0, 2**62) if self.get_argument("cursor", "") else None

        def listed() -> dict[str, Any]:
            page, following, total = self.jobs.list_jobs(user, states, limit, order, cursor)
            # the grace a preemption gives (the admin's Preempt dialog says what it costs)
            grace = self.jobs.preempt_grace
            return {"jobs": page, "next": following, "total": total, "preempt_grace": grace}

        await self.write_computed(listed)

    @api_authenticated
    async def post(self) -> None:
        ident = self.identity()
        body = self.json_body(JOB_SUBMIT_FIELDS, self.service.max_notebook_bytes, "notebook")
        if ident.kind != "user" or body.get("user", ident.name) != ident.name:
            # The job runs as its owner's system account: only the owner may submit it.
            raise RequestError(403, "a job runs as its owner: only its owner can submit it")
        if "groups" in body:
            raise RequestError(403, "a job's groups are looked up on the hub, not stated")
        caller = await self.resolve_caller(ident, {}, "submit jobs")
        submitted = await asyncio.to_thread(self.jobs.submit, caller, body, ident.is_admin)
        self.write_json(submitted, 201)


class JobHandler(JobsBase):
    @api_authenticated
    async def get(self, job_id: str) -> None:
        job = await self.owned(self.identity(), job_id)
        jobs = self.jobs
        await self.write_computed(lambda: jobs.get(job.id))

    @api_authenticated
    async def delete(self, job_id: str) -> None:
        ident = self.identity()
        job = await self.owned(ident, job_id)
        if not ident.is_admin and job.user != ident.name:
            raise RequestError(403, "only the job's owner or an admin may cancel it")
        reason = self.optional_reason()
        self.write_json(await asyncio.to_thread(self.jobs.cancel, job.id, ident.name, reason[:255]))


class JobLogHandler(JobsBase):
    @api_authenticated
    async def get(self, job_id: str) -> None:
        job = await self.owned(self.identity(), job_id)
        tail = int_arg(self, "tail", 64_000, 1, 10_000_000)
        # a file in the job's folder (on a shared filesystem, perhaps slow): not on the loop
        await self.write_computed(lambda: {"id": job.id, "log": self.jobs.log_text(job, tail)})


class JobOutputHandler(JobsBase):
    """The output notebook (``?format=ipynb``, default) or its HTML rendering."""

    @api_authenticated
    async def get(self, job_id: str) -> None:
        job = await self.owned(self.identity(), job_id)
        fmt = self.get_argument("format", "ipynb")
        if fmt not in ("ipynb", "html"):
            raise RequestError(400, "query argument format must be 'ipynb' or 'html'")
        data = await asyncio.to_thread(self.jobs.output, job, fmt, self.service.max_notebook_bytes)
        if data is None and job.folder_removed_at is not None:
            raise RequestError(
                404,
                f"job {job.id}'s folder was removed on the service's side: its outputs are "
                f"in your notebook folder's {output_path(job)}, where JupyterLab copied them",
            )
        if data is None:
            raise RequestError(404, f"job {job.id} has no {fmt} output yet")
        self.set_header(
            "Content-Type", "application/x-ipynb+json" if fmt == "ipynb" else "text/html"
        )
        self.set_header("Cache-Control", "no-store")
        # The HTML is the owner's notebook rendered: never run it in the service's origin.
        self.set_header("Content-Security-Policy", "sandbox")
        self.finish(data)


class JobCollectedHandler(JobsBase):
    """``POST api/jobs/<id>/collected``: the owner's server has copied the ended job's
    outputs into their folder (``gpu-jobs/<name>-<id>/``), so the job's own folder may go
    after ``job_folder_retention_days``. The owner's word about their own job only: it can
    make their folder go sooner, never anyone else's."""

    @api_authenticated
    async def post(self, job_id: str) -> None:
        ident = self.identity()
        job = await self.owned(ident, job_id)
        if ident.kind != "user" or job.user != ident.name:
            raise RequestError(403, "only the job's owner (their server) copies its outputs")
        self.write_json(await asyncio.to_thread(self.jobs.outputs_collected, job.id))


class JobPreemptHandler(JobsBase):
    @api_authenticated
    async def post(self, job_id: str) -> None:
        ident = self.identity()
        if not ident.is_admin:
            raise RequestError(403, "preempting a job needs the gpuslice admin scope")
        job = await self.owned(ident, job_id)
        reason = self.optional_reason() or self.get_argument("reason", "")
        reason = reason or "preempted by an admin"
        preempted = await asyncio.to_thread(self.jobs.preempt, job.id, ident.name, reason[:255])
        self.write_json(preempted, 202)


def job_handlers(api: str) -> list[tuple[str, type]]:
    """Routes under the service's ``api/`` prefix (registered by the app)."""
    from jupyterhub.utils import url_path_join

    return [
        (url_path_join(api, "jobs"), JobsHandler),
        (url_path_join(api, r"jobs/(\d+)"), JobHandler),
        (url_path_join(api, r"jobs/(\d+)/log"), JobLogHandler),
        (url_path_join(api, r"jobs/(\d+)/output"), JobOutputHandler),
        (url_path_join(api, r"jobs/(\d+)/preempt"), JobPreemptHandler),
        (url_path_join(api, r"jobs/(\d+)/collected"), JobCollectedHandler),
    ]
