"""A stand-in for the Kubernetes API's Jobs, pods and nodes endpoints, on a local port.

No cluster can run here. This answers the calls the service makes (Jobs: create, list by
label, delete; pods: list in a namespace by label, list in all namespaces; nodes: list) with
objects in the API's shapes (``JobList``, ``Job``, ``PodList``, ``NodeList``, ``Status``)
and checks every manifest it is sent against the Kubernetes schemas, so the client's real
HTTP requests and its parsing of real-shaped answers are what the tests exercise. The test
plays the cluster's controllers: the scheduler binds a Job's pod to a node or leaves it
pending with the scheduler's message, a preemption marks the pod a disruption target and
the Job makes a new one, Kueue admits a suspended Job, a foreground deletion finishes.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

_CLOCK = itertools.count()


def now() -> str:
    # strictly increasing (the API's timestamps have seconds; objects made in one second
    # would otherwise tie)
    stamp = datetime.now(UTC) + timedelta(seconds=next(_CLOCK))
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def matches(labels: dict[str, str], selector: str) -> bool:
    """An equality-based label selector ("a=b,c=d"), as the API server applies it."""
    wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
    return all(labels.get(k) == v for k, v in wanted.items())


@dataclass
class FakeCluster:
    namespace: str = "gpuslice"
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> pod (any namespace)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    priorities: dict[str, int] = field(default_factory=dict)  # PriorityClass -> value
    # A full cluster: each new Job's pod waits, unschedulable with this message
    full: str = ""
    # The next requests that get an error answer: (method, path, status), each once
    errors: list[tuple[str, str, int]] = field(default_factory=list)
    # The next Job create is stored, then answered with this status (a 504 that happened)
    stored_then: int = 0
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
        for pod in self.pods_of(name):
            del self.pods[pod["metadata"]["name"]]

    # -- pods: the Job controller, the scheduler, preemption, Kueue ---------------------
    def pods_of(self, job: str) -> list[dict[str, Any]]:
        return [p for p in self.pods.values() if p["metadata"]["labels"].get("job-name") == job]

    def make_pod(self, job: str) -> dict[str, Any]:
        """The Job controller's next pod of ``job``, pending until the scheduler binds it."""
        manifest = self.jobs[job]
        template = manifest["spec"]["template"]
        name = f"{job}-{uuid.uuid4().hex[:5]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": manifest["metadata"]["namespace"],
                "uid": str(uuid.uuid4()),
                "creationTimestamp": now(),
                "labels": {
                    **template["metadata"]["labels"],
                    "job-name": job,
                    "batch.kubernetes.io/job-name": job,
                },
            },
            "spec": {**template["spec"], "priority": self.priority_of(template["spec"])},
            "status": {"phase": "Pending"},
        }
        self.pods[name] = pod
        return pod

    def priority_of(self, spec: dict[str, Any]) -> int:
        return self.priorities.get(spec.get("priorityClassName", ""), 0)

    def current_pod(self, job: str) -> dict[str, Any]:
        live = [
            p
            for p in self.pods_of(job)
            if p["status"]["phase"] in ("Pending", "Running")
            and "deletionTimestamp" not in p["metadata"]
        ]
        return live[-1] if live else self.make_pod(job)

    def unschedulable(self, job: str, message: str) -> None:
        pod = self.current_pod(job)
        pod["status"]["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": now(),
            }
        ]

    def bind(self, job: str, node: str) -> None:
        """The scheduler places the Job's pod on ``node``, and it runs."""
        pod = self.current_pod(job)
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running", "startTime": now()}
        self.jobs[job]["status"] = {"active": 1, "ready": 1, "startTime": now()}

    def disrupt(self, job: str) -> str:
        """The scheduler preempts (or a drain evicts) the Job's running pod: it is being
        deleted with the DisruptionTarget condition; the Job controller makes the next pod
        once this one is terminal (with a podFailurePolicy, pods are replaced only then).
        Returns the disrupted pod's name."""
        pod = self.current_pod(job)
        pod["metadata"]["deletionTimestamp"] = now()
        pod["status"].setdefault("conditions", []).append(
            {
                "type": "DisruptionTarget",
                "status": "True",
                "reason": "PreemptionByScheduler",
                "lastTransitionTime": now(),
            }
        )
        return pod["metadata"]["name"]

    def terminated(self, pod: str, code: int) -> None:
        """The kubelet reports the pod's container ended with ``code``; a disrupted pod of
        a Job that is not being deleted is replaced (the policy ignores the disruption)."""
        found = self.pods[pod]
        found["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        job = found["metadata"]["labels"].get("job-name")
        disrupted = any(
            c["type"] == "DisruptionTarget" for c in found["status"].get("conditions", [])
        )
        if disrupted and job in self.jobs and "deletionTimestamp" not in self.jobs[job]["metadata"]:
            self.make_pod(job)

    def pods_ended(self, job: str) -> None:
        """A Job deleted in the foreground: its pods are terminal, but the Job stays until
        the garbage collector removes their finalizers (``pod_gone``)."""
        for pod in self.pods_of(job):
            pod["status"]["phase"] = "Failed"

    def admit(self, job: str) -> None:
        """Kueue admits a suspended Job."""
        self.jobs[job]["spec"]["suspend"] = False

    def foreign_pod(
        self, namespace: str, name: str, node: str, limits: dict[str, str], phase: str = "Running"
    ) -> None:
        """A pod that did not come through gpuslice (another team's workload)."""
        self.pods[name] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4())},
            "spec": {
                "nodeName": node,
                "containers": [
                    {"name": "main", "image": "trainer", "resources": {"limits": limits}}
                ],
            },
            "status": {"phase": phase},
        }


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
        for error in self.cluster.errors:
            method, path, code = error
            if method == self.request.method and path == self.request.path:
                self.cluster.errors.remove(error)
                self.status_reply(code, "Injected", f"the test answers {code}")
                return

    def reply(self, status: int, obj: dict[str, Any]) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(obj))

    def list_reply(self, kind: str, api_version: str, items: list[dict[str, Any]]) -> None:
        """A list, in pages when the client asks for ``limit`` (``continue`` is where the
        next page starts, as opaque to the client as the API server's own token)."""
        limit = int(self.get_query_argument("limit", "0") or 0)
        start = int(self.get_query_argument("continue", "0") or 0)
        metadata: dict[str, Any] = {"resourceVersion": "5"}
        if limit:
            if start + limit < len(items):
                metadata["continue"] = str(start + limit)
            items = items[start : start + limit]
        self.reply(
            200, {"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}
        )

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
        if self.cluster.full and not manifest["spec"].get("suspend"):
            self.cluster.unschedulable(name, self.cluster.full)
        if self.cluster.stored_then:
            code, self.cluster.stored_then = self.cluster.stored_then, 0
            self.status_reply(code, "Timeout", "the request did not complete")
            return
        self.reply(201, manifest)

    def get(self, namespace: str) -> None:
        selector = self.get_query_argument("labelSelector", "")
        items = [
            job
            for job in self.cluster.jobs.values()
            if job["metadata"]["namespace"] == namespace
            and matches(job["metadata"].get("labels", {}), selector)
        ]
        self.list_reply("JobList", "batch/v1", items)


class PodsHandler(_Base):
    def delete(self, namespace: str | None = None) -> None:
        """deletecollection by label: the pods are gone at once (grace 0)."""
        selector = self.get_query_argument("labelSelector", "")
        gone = [
            name
            for name, pod in self.cluster.pods.items()
            if pod["metadata"]["namespace"] == namespace
            and matches(pod["metadata"].get("labels", {}), selector)
        ]
        for name in gone:
            del self.cluster.pods[name]
        self.list_reply("PodList", "v1", [])

    def get(self, namespace: str | None = None) -> None:
        selector = self.get_query_argument("labelSelector", "")
        fields = self.get_query_argument("fieldSelector", "")
        items = [
            pod
            for pod in self.cluster.pods.values()
            if namespace in (None, pod["metadata"]["namespace"])
            and matches(pod["metadata"].get("labels", {}), selector)
            and _fields_match(pod, fields)
        ]
        self.list_reply("PodList", "v1", items)


def _fields_match(pod: dict[str, Any], selector: str) -> bool:
    """The pod field selectors the API server supports that the service uses:
    ``spec.nodeName`` and ``status.phase``, with = and !=."""
    values = {
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "status.phase": pod["status"]["phase"],
    }
    for part in (p for p in selector.split(",") if p):
        negate = "!=" in part
        key, value = part.split("!=" if negate else "=", 1)
        if key not in values:
            raise ValueError(f"field selector {key} is not supported")
        if (values[key] == value) == negate:
            return False
    return True


class PriorityClassesHandler(_Base):
    def get(self) -> None:
        items = [
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": name},
                "value": value,
            }
            for name, value in self.cluster.priorities.items()
        ]
        self.list_reply("PriorityClassList", "scheduling.k8s.io/v1", items)


class NodesHandler(_Base):
    def get(self) -> None:
        self.list_reply("NodeList", "v1", self.cluster.nodes)


class JobHandler(_Base):
    def delete(self, namespace: str, name: str) -> None:
        job = self.cluster.jobs.get(name)
        if job is None:
            self.status_reply(404, "NotFound", f'jobs.batch "{name}" not found')
            return
        # foreground: the Job stays, marked, until its pod is gone (FakeCluster.pod_gone)
        job["metadata"]["deletionTimestamp"] = now()
        job["metadata"]["finalizers"] = ["foregroundDeletion"]
        for pod in self.cluster.pods_of(name):  # the garbage collector deletes them first
            pod["metadata"].setdefault("deletionTimestamp", now())
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
                (r"/api/v1/namespaces/([^/]+)/pods", PodsHandler),
                (r"/api/v1/pods", PodsHandler),
                (r"/api/v1/nodes", NodesHandler),
                (r"/apis/scheduling.k8s.io/v1/priorityclasses", PriorityClassesHandler),
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
