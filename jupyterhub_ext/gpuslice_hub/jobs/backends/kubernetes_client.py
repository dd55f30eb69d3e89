"""Jobs as Kubernetes Jobs, through the Kubernetes API (``kubernetes_asyncio``, the client
KubeSpawner already brings).

* ``start``: one Job per attempt (``gpuslice-job-<id>-<attempt>``), built by
  :func:`.kubernetes.job_manifest` from the slices the ledger granted, with the same
  resources and node selector as a server's pod (the spawner's translator). It runs as its
  owner (``securityContext``) and mounts the jobs volume where the service has it.
* ``poll_many``: one list call per scheduler pass for every run (label selector).
  A Job with a ``Complete`` condition exited 0; a ``Failed`` one, or one that is gone,
  is told by the runner's own record in its folder (checkpointed: 75; a cell failed: 1).
  A Job being deleted (``Foreground``) is alive until its pod is gone: its slices stay held.
* ``signal_preempt``: delete the Job in the foreground with the pod's grace period: the
  kubelet's SIGTERM reaches the runner, which checkpoints and exits 75; the scheduler then
  requeues it (a new Job, possibly on another node). A disruption the cluster makes itself
  (preemption, eviction) is ignored by the Job's ``podFailurePolicy``: the Job makes a new
  pod on the same node, which resumes from the checkpoint.
* ``kill``: the same delete with no grace.

The service talks to the cluster with its own service account (in a pod) or a kubeconfig;
the calls are tested against a local HTTP server answering in the API's shapes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from gpuslice.vocab import EXIT_BY_STATUS
from gpuslice_spawner.launchers.kubernetes import KubernetesResources

from ..accounts import Account
from .base import RunStatus
from .kubernetes import job_manifest
from .local import _runner_status

T = TypeVar("T")
LABEL_SELECTOR = "app.kubernetes.io/name=gpuslice-job"


def _run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code (the scheduler's worker thread, or
    a thread of its own when called where an event loop runs)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def api_configuration(url: str = "") -> Any:
    """How to reach the API: ``url`` (e.g. behind ``kubectl proxy``), else the pod's
    service account, else the kubeconfig."""
    from kubernetes_asyncio import config
    from kubernetes_asyncio.client import Configuration

    configuration = Configuration()
    if url:
        configuration.host = url.rstrip("/")
    elif os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        _run(config.load_kube_config(client_configuration=configuration))
    return configuration


class KubernetesBackend:
    name = "kubernetes"
    # gpuslice's preemption ends the Job (the scheduler requeues it); the cluster's own
    # disruptions are retried by the Job itself on the same node, holding the same slices

    def __init__(
        self,
        configuration: Any,
        namespace: str,
        image: str,
        claim_name: str,
        resources: KubernetesResources | None = None,
        grace_seconds: int = 60,
    ) -> None:
        self.configuration = configuration
        self.namespace = namespace
        self.image = image
        self.claim_name = claim_name
        self.resources = resources
        self.grace_seconds = grace_seconds

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        from kubernetes_asyncio.client import ApiClient, BatchV1Api

        async with ApiClient(self.configuration) as api:
            return await getattr(BatchV1Api(api), method)(*args, **kwargs)

    def start(
        self,
        job_id: int,
        job_dir: str,
        env: dict[str, str],
        grants: Sequence[dict[str, Any]] = (),
        priority: str = "normal",
        previous: dict[str, Any] | None = None,
        account: Account | None = None,
    ) -> dict[str, Any]:
        account = account or Account.current()
        if account.uid == 0:
            # the pod says runAsNonRoot: the kubelet would refuse it and the Job would wait
            # forever; say so now (a service running as root with run_jobs_as_service_user)
            raise ValueError("Kubernetes jobs never run as root (uid 0)")
        # the device plugin picks the device in the pod: the ledger's uuids name none it sees
        env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        attempt = env.get("GPUSLICE_ATTEMPT_ID", "")[:8] or "0"
        name = f"gpuslice-job-{job_id}-{attempt}"
        manifest = job_manifest(
            job_id,
            account.name,
            priority,
            self.image,
            self.claim_name,
            grants,
            self.resources,
            grace_seconds=self.grace_seconds,
            # gpuslice counts restarts and requeues itself (JobManager.max_restarts)
            max_restarts=0,
            namespace=self.namespace,
            env=env,
            run_as=(account.uid, account.gid, account.groups),
            name=name,
            job_dir=job_dir,
        )
        _run(self._call("create_namespaced_job", self.namespace, manifest))
        return {"k8s_job": name, "namespace": self.namespace, "job_dir": job_dir}

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return self.poll_many([ref])[0]

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        if not refs:
            return []
        listed = _run(
            self._call("list_namespaced_job", self.namespace, label_selector=LABEL_SELECTOR)
        )
        jobs = {item.metadata.name: item for item in listed.items or []}
        return [self._status(ref, jobs.get(ref.get("k8s_job"))) for ref in refs]

    def _status(self, ref: dict[str, Any], job: Any) -> RunStatus:
        # a failed or gone Job: the runner's own record says how it ended
        ended = EXIT_BY_STATUS.get(_runner_status(str(ref.get("job_dir", ""))) or "")
        if job is None:
            return RunStatus(False, ended)
        conditions = {c.type: c.status for c in (job.status and job.status.conditions) or []}
        if conditions.get("Complete") == "True":
            return RunStatus(False, 0)
        if conditions.get("Failed") == "True":
            return RunStatus(False, 1 if ended is None else ended)
        return RunStatus(True)  # pending, running, or being deleted with its pod

    def _delete(self, ref: dict[str, Any], grace: int) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            _run(
                self._call(
                    "delete_namespaced_job",
                    ref["k8s_job"],
                    ref.get("namespace", self.namespace),
                    propagation_policy="Foreground",
                    grace_period_seconds=grace,
                )
            )
        except ApiException as e:
            if e.status != 404:  # already gone: nothing to stop
                raise

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        self._delete(ref, self.grace_seconds)

    def kill(self, ref: dict[str, Any]) -> None:
        self._delete(ref, 0)
