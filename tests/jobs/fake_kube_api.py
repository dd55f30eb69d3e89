"""A stand-in for the Kubernetes API's Jobs, pods and nodes endpoints, on a local port.

No cluster can run here. This answers the calls the service makes (Jobs: create, list by
label, delete; pods: list in a namespace by label, list in all namespaces; nodes: list) with
objects in the API's shapes (``JobList``, ``Job``, ``PodList``, ``NodeList``, ``Status``)
and checks every manifest it is sent against the Kubernetes schemas, so the client's real
HTTP requests and its parsing of real-shaped answers are what the tests exercise. The test
plays the cluster's controllers: the scheduler binds a Job's pod to a node or leaves it
pending with the scheduler's message, a preemption marks the pod a disruption target and
the Job makes a new one, Kueue admits a suspended Job, a foreground deletion finishes.

Jobs and pods can be watched too: each change gets the next resourceVersion and an event
(the methods above and the handlers record their own; ``observe()`` records changes made
to the dicts by hand), and a watch streams the events after its version.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from tornado import web
from tornado.httpserver import HTTPServer
from tornado.iostream import StreamClosedError
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
    # The watch: every change to a Job or pod gets the next resourceVersion and an event in
    # this log (what the API server keeps in etcd's history). The server's handlers record
    # their own changes; a change the test makes by hand is recorded by ``observe()``.
    version: int = 0
    events: list[tuple[int, str, str, dict[str, Any]]] = field(default_factory=list)
    oldest: int = 0  # versions up to this are compacted away: a watch from them gets 410
    cuts: int = 0  # bumped to end every open watch (the connection cut)
    held: bool = False  # while True, open watches send nothing (a watch lagging)
    drops: int = 0  # bumped to break every open watch's connection mid-stream
    # Answers to the next watch requests (a status each, e.g. 403), lists unaffected
    watch_errors: list[int] = field(default_factory=list)
    watches: int = 0  # open watch streams
    # (kind, name) -> what it was when last recorded, and its version then
    _seen: dict[tuple[str, str], tuple[str, int]] = field(default_factory=dict)
    _lock: Any = field(default_factory=threading.RLock)
    # called before the server stops (the clients' watches: closed first, not left retrying)
    closers: list[Any] = field(default_factory=list)

    # -- the watch's history ---------------------------------------------------------------
    def _store(self, kind: str) -> dict[str, dict[str, Any]]:
        return self.jobs if kind == "jobs" else self.pods

    def record(self, kind: str, name: str) -> None:
        """Give a changed (or new, or gone) object its next version and its event."""
        with self._lock:
            obj = self._store(kind).get(name)
            key = (kind, name)
            seen = self._seen.get(key)
            if obj is None:
                if seen is None:
                    return
                del self._seen[key]
                self.version += 1
                gone = {"metadata": {"name": name, "resourceVersion": str(self.version)}}
                self.events.append((self.version, kind, "DELETED", gone))
                return
            meta = obj["metadata"]
            meta.pop("resourceVersion", None)
            fingerprint = json.dumps(obj, sort_keys=True)
            if seen is not None and seen[0] == fingerprint:
                meta["resourceVersion"] = str(seen[1])
                return
            self.version += 1
            self._seen[key] = (fingerprint, self.version)
            meta["resourceVersion"] = str(self.version)
            event = "MODIFIED" if seen is not None else "ADDED"
            self.events.append((self.version, kind, event, json.loads(json.dumps(obj))))

    def observe(self) -> int:
        """Record every change made by hand since the last look; the current version."""
        with self._lock:
            for kind in ("jobs", "pods"):
                store = self._store(kind)
                for name in list(store):
                    self.record(kind, name)
                for k, name in [key for key in self._seen if key[0] == kind]:
                    if name not in store:
                        self.record(k, name)
            return self.version

    def expire(self) -> None:
        """Compact the history (etcd's compaction): watches from before now get 410."""
        with self._lock:
            self.oldest = self.version
            self.events.clear()

    def cut(self) -> None:
        """End every open watch stream (the server's own end of a watch)."""
        self.cuts += 1

    def drop(self) -> None:
        """Break every open watch's connection mid-stream (a proxy or a network failing)."""
        self.drops += 1

    # -- the test plays the cluster ------------------------------------------------------
    def run(self, name: str) -> None:
        self.jobs[name]["status"] = {"active": 1, "ready": 1, "startTime": now()}
        self.record("jobs", name)

    def finish(self, name: str, condition: str) -> None:
        """``Complete`` or ``Failed``, as the Job controller reports them."""
        reason = {"Complete": None, "Failed": "PodFailurePolicy"}[condition]
        entry = {"type": condition, "status": "True", "lastTransitionTime": now()}
        if reason:
            entry["reason"] = reason
        counts = {"succeeded": 1} if condition == "Complete" else {"failed": 1}
        self.jobs[name]["status"] = {"conditions": [entry], **counts}
        self.record("jobs", name)

    def pod_gone(self, name: str) -> None:
        """A foreground deletion completes once the pod is gone."""
        del self.jobs[name]
        self.record("jobs", name)
        for pod in self.pods_of(name):
            del self.pods[pod["metadata"]["name"]]
            self.record("pods", pod["metadata"]["name"])

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
        self.record("pods", name)
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
        self.record("pods", pod["metadata"]["name"])

    def bind(self, job: str, node: str) -> None:
        """The scheduler places the Job's pod on ``node``, and it runs."""
        pod = self.current_pod(job)
        pod["spec"]["nodeName"] = node
        pod["status"] = {"phase": "Running", "startTime": now()}
        self.jobs[job]["status"] = {"active": 1, "ready": 1, "startTime": now()}
        self.record("pods", pod["metadata"]["name"])
        self.record("jobs", job)

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
        self.record("pods", pod["metadata"]["name"])
        return pod["metadata"]["name"]

    def terminated(self, pod: str, code: int) -> None:
        """The kubelet reports the pod's container ended with ``code``; a disrupted pod of
        a Job that is not being deleted is replaced (the policy ignores the disruption)."""
        found = self.pods[pod]
        found["status"]["phase"] = "Succeeded" if code == 0 else "Failed"
        self.record("pods", pod)
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
            self.record("pods", pod["metadata"]["name"])

    def admit(self, job: str) -> None:
        """Kueue admits a suspended Job."""
        self.jobs[job]["spec"]["suspend"] = False
        self.record("jobs", job)

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
        self.record("pods", name)


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
        metadata: dict[str, Any] = {"resourceVersion": str(self.cluster.version)}
        if limit:
            if start + limit < len(items):
                metadata["continue"] = str(start + limit)
            items = items[start : start + limit]
        self.reply(
            200, {"kind": kind, "apiVersion": api_version, "metadata": metadata, "items": items}
        )

    def watching(self) -> bool:
        return self.get_query_argument("watch", "") in ("true", "1", "True")

    async def watch(self, kind: str, wanted: Any) -> None:
        """The events after ``resourceVersion`` of the objects ``wanted`` selects, one JSON
        object a line, until ``timeoutSeconds`` or a ``cut()``; an ERROR event with a 410
        Status when that version was compacted away."""
        cluster = self.cluster
        since = int(self.get_query_argument("resourceVersion", "0") or 0)
        until = asyncio.get_running_loop().time() + float(
            self.get_query_argument("timeoutSeconds", "60")
        )
        if cluster.watch_errors:
            code = cluster.watch_errors.pop(0)
            self.status_reply(code, "Injected", f"the test answers the watch {code}")
            return
        self.set_header("Content-Type", "application/json")
        if since < cluster.oldest:
            gone = {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "message": f"too old resource version: {since} ({cluster.oldest})",
                    "reason": "Expired",
                    "code": 410,
                },
            }
            self.finish(json.dumps(gone) + "\n")
            return
        cuts, drops = cluster.cuts, cluster.drops
        cluster.watches += 1
        try:
            await self.flush()
            while not self.closed and cluster.cuts == cuts:
                if cluster.drops != drops:
                    self.request.connection.close()  # mid-stream: no end of the response
                    return
                if asyncio.get_running_loop().time() >= until:
                    break
                if cluster.held:
                    await asyncio.sleep(0.005)
                    continue
                with cluster._lock:
                    at = bisect.bisect_right(cluster.events, since, key=lambda e: e[0])
                    new = cluster.events[at:]
                for version, k, event, obj in new:
                    since = version
                    if k == kind and (event == "DELETED" or wanted(obj)):
                        self.write(json.dumps({"type": event, "object": obj}) + "\n")
                if new:
                    await self.flush()
                await asyncio.sleep(0.005)
        except StreamClosedError:
            return
        finally:
            cluster.watches -= 1
        if not self.closed:
            self.finish()

    closed = False

    def on_connection_close(self) -> None:
        self.closed = True

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
        self.cluster.record("jobs", name)
        for pod in self.cluster.pods_of(name):
            self.cluster.record("pods", pod["metadata"]["name"])
        if self.cluster.stored_then:
            code, self.cluster.stored_then = self.cluster.stored_then, 0
            self.status_reply(code, "Timeout", "the request did not complete")
            return
        self.reply(201, manifest)

    async def get(self, namespace: str) -> None:
        selector = self.get_query_argument("labelSelector", "")

        def wanted(job: dict[str, Any]) -> bool:
            meta = job["metadata"]
            return meta["namespace"] == namespace and matches(meta.get("labels", {}), selector)

        if self.watching():
            await self.watch("jobs", wanted)
            return
        self.list_reply("JobList", "batch/v1", [j for j in self.cluster.jobs.values() if wanted(j)])


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
            self.cluster.record("pods", name)
        self.list_reply("PodList", "v1", [])

    async def get(self, namespace: str | None = None) -> None:
        selector = self.get_query_argument("labelSelector", "")
        fields = self.get_query_argument("fieldSelector", "")

        def wanted(pod: dict[str, Any]) -> bool:
            return (
                namespace in (None, pod["metadata"]["namespace"])
                and matches(pod["metadata"].get("labels", {}), selector)
                and _fields_match(pod, fields)
            )

        if self.watching():
            await self.watch("pods", wanted)
            return
        self.list_reply("PodList", "v1", [p for p in self.cluster.pods.values() if wanted(p)])


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
            self.cluster.record("pods", pod["metadata"]["name"])
        self.cluster.record("jobs", name)
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
        for close in cluster.closers:
            close()
        loop.call_soon_threadsafe(holder["server"].stop)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    return cluster, stop


def settle(backend: Any, cluster: FakeCluster, timeout: float = 10.0) -> None:
    """Wait until a watching backend holds what the cluster holds (its changes by hand
    recorded first): the watch's lag, waited for with a deadline instead of a sleep. A
    backend that lists each pass needs no wait."""
    if not backend.watch:
        return
    cluster.observe()
    backend._watched()  # started on the first pass that polls: start them now at the latest
    jobs, pods = backend._informers
    selector = jobs.selector["label_selector"]

    def held(store: dict[str, dict[str, Any]]) -> dict[str, str]:
        with cluster._lock:
            return {
                name: obj["metadata"]["resourceVersion"]
                for name, obj in store.items()
                if obj["metadata"].get("namespace") == cluster.namespace
                and matches(obj["metadata"].get("labels", {}), selector)
            }

    def versions(informer: Any) -> dict[str, str] | None:
        """name -> resourceVersion of what the informer holds (None: not current)."""
        view = informer.snapshot()
        if view is None:
            return None
        return {obj["metadata"]["name"]: obj["metadata"].get("resourceVersion") for obj in view}

    deadline = time.monotonic() + timeout
    while True:
        holds = (versions(jobs), versions(pods))
        if holds == (held(cluster.jobs), held(cluster.pods)):
            return
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the watch did not catch up in {timeout} s: holds {holds}, "
                f"the cluster {held(cluster.jobs)} {held(cluster.pods)}"
            )
        time.sleep(0.01)
