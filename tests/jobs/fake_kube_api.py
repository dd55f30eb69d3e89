"""A stand-in for the Kubernetes API's batch/v1 Jobs endpoints, on a local port.

No cluster can run here. This answers the calls the Kubernetes job backend makes (create,
list by label, delete) with objects in the API's shapes (``JobList``, ``Job``, ``Status``)
and checks every manifest it is sent against the Kubernetes schemas, so the client's real
HTTP requests and its parsing of real-shaped answers are what the tests exercise. The test
plays the cluster: it sets a Job's status (running, complete, failed) and finishes a
foreground deletion (the pod is gone).
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class FakeCluster:
    namespace: str = "gpuslice"
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""
    validate: Any = None  # manifest -> None, raising when the schema refuses it

    # -- the test plays the cluster ------------------------------------------------------
    def run(self, name: str) -> None:
        self.jobs[name]["status"] = {"active": 1, "ready": 1, "startTime": now()}

    def finish(self, name: str, condition: str) -> None:
        """``Complete`` or ``Failed``, as the Job controller reports them."""
        reason = {"Complete": None, "Failed": "PodFailurePolicy"}[condition]
        entry = {"type": condition, "status": "True", "lastTransitionTime": now()}
        if reason:
            entry["reason"] = reason
        counts = {"succeeded": 1} if condition == "Complete" else {"failed": 1}
        self.jobs[name]["status"] = {"conditions": [entry], **counts}

    def pod_gone(self, name: str) -> None:
        """A foreground deletion completes once the pod is gone."""
        del self.jobs[name]


class _Base(web.RequestHandler):
    @property
    def cluster(self) -> FakeCluster:
        return self.settings["cluster"]

    def prepare(self) -> None:
        body = json.loads(self.request.body) if self.request.body else None
        self.cluster.requests.append(
            {
                "method": self.request.method,
                "path": self.request.path,
                "query": {k: v[-1].decode() for k, v in self.request.query_arguments.items()},
                "body": body,
            }
        )
        self.body = body

    def reply(self, status: int, obj: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def status_reply(self, code: int, reason: str, message: str) -> None:
        self.reply(
            code,
            {
                "kind": "Status",
                "apiVersion": "v1",
                "metadata": {},
                "status": "Failure",
                "message": message,
                "reason": reason,
                "code": code,
            },
        )


class JobsHandler(_Base):
    def post(self, namespace: str) -> None:
        manifest = dict(self.body or {})
        try:
            self.cluster.validate(manifest)
        except Exception as e:  # what the API server says to a manifest it refuses
            self.status_reply(422, "Invalid", f"Job is invalid: {e}")
            return
        name = manifest["metadata"]["name"]
        if name in self.cluster.jobs:
            self.status_reply(409, "AlreadyExists", f'jobs.batch "{name}" already exists')
            return
        manifest["metadata"] = {
            **manifest["metadata"],
            "namespace": namespace,
            "uid": str(uuid.uuid4()),
            "resourceVersion": "1",
            "creationTimestamp": now(),
        }
        manifest["status"] = {}
        self.cluster.jobs[name] = manifest
        self.reply(201, manifest)

    def get(self, namespace: str) -> None:
        selector = self.get_query_argument("labelSelector", "")
        wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
        items = [
            job
            for job in self.cluster.jobs.values()
            if job["metadata"]["namespace"] == namespace
            and all(job["metadata"].get("labels", {}).get(k) == v for k, v in wanted.items())
        ]
        self.reply(
            200,
            {
                "kind": "JobList",
                "apiVersion": "batch/v1",
                "metadata": {"resourceVersion": "2"},
                "items": items,
            },
        )


class JobHandler(_Base):
    def delete(self, namespace: str, name: str) -> None:
        job = self.cluster.jobs.get(name)
        if job is None:
            self.status_reply(404, "NotFound", f'jobs.batch "{name}" not found')
            return
        # foreground: the Job stays, marked, until its pod is gone (FakeCluster.pod_gone)
        job["metadata"]["deletionTimestamp"] = now()
        job["metadata"]["finalizers"] = ["foregroundDeletion"]
        self.reply(200, job)


def start_fake_api(cluster: FakeCluster) -> tuple[FakeCluster, Any]:
    """Serve ``cluster`` on a free loopback port in a thread; returns it and a stop()."""
    sockets = bind_sockets(0, "127.0.0.1")
    port = sockets[0].getsockname()[1]
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def serve() -> None:
        asyncio.set_event_loop(loop)
        app = web.Application(
            [
                (r"/apis/batch/v1/namespaces/([^/]+)/jobs", JobsHandler),
                (r"/apis/batch/v1/namespaces/([^/]+)/jobs/([^/]+)", JobHandler),
            ],
            cluster=cluster,
        )
        server = HTTPServer(app)
        server.add_sockets(sockets)
        holder["server"] = server
        loop.call_soon(ready.set)
        loop.run_forever()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    ready.wait(10)
    cluster.url = f"http://127.0.0.1:{port}"

    def stop() -> None:
        loop.call_soon_threadsafe(holder["server"].stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return cluster, stop
