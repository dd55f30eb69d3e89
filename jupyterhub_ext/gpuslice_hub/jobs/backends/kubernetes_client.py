"""Jobs as Kubernetes Jobs, scheduled by the cluster, through the Kubernetes API
(``kubernetes_asyncio``, the client KubeSpawner already brings).

The cluster's queue is the queue, as Slurm's is with the Slurm backend
(:mod:`gpuslice_hub.jobs.delegated`):

* ``submit``: a job becomes a Kubernetes Job when it is submitted
  (``gpuslice-job-<id>-<attempt>``, :func:`.kubernetes.job_manifest`): its profile's
  device-plugin resources times its slices (the spawner's translation, with no node), its
  class's PriorityClass and, with Kueue, its class's LocalQueue. The cluster's scheduler (and
  Kueue's quotas and fair sharing) decide when and where it runs. It runs as its owner
  (``securityContext``) and mounts the jobs volume where the service has it.
* ``poll_many``: two list calls per pass (the Jobs and their pods, by label) tell every
  job's state: waiting (the scheduler's or Kueue's reason), running on a node (the pod's
  ``nodeName``; the pass records the slice there in the ledger), requeued (a new pod: the
  cluster preempted or evicted the last one, the Job's ``podFailurePolicy`` ignored that
  and the new pod resumes from the checkpoint), or over (``Complete``/``Failed``, or gone:
  the runner's record in its folder says how it ended).
* ``signal_preempt``: delete the Job in the foreground with the pod's grace period: the
  kubelet's SIGTERM reaches the runner, which checkpoints and exits 75; the pass then
  submits it again (a new Job). Used when the cluster did not preempt it for a server.
* ``kill``: the same delete with no grace.

The service talks to the cluster with its own service account (in a pod) or a kubeconfig;
the calls are tested against a local HTTP server answering in the API's shapes.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.vocab import EXIT_BY_STATUS
from gpuslice_spawner.launchers.kubernetes import KubernetesResources

from ...kubeapi import call_api, run_sync
from ...profiles import Profile
from ..accounts import Account
from .base import RunStatus, SubmitRefused, SubmitUnsure, profile_grant
from .kubernetes import JOB_LABEL, PRIORITY_CLASS_NAMES, PRIORITY_VALUES, job_manifest
from .local import _runner_status

LABEL_SELECTOR = "=".join(JOB_LABEL)
# The label the Job controller puts on its pods (the older name first, the newer second)
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
# Answers to a create that trying again cannot mend (the API refused the manifest)
PERMANENT_STATUS = {400, 404, 422}
# PriorityClass name -> value (a Job's pod not created yet has no priority of its own)
CLASS_VALUES = {name: PRIORITY_VALUES[cls] for cls, name in PRIORITY_CLASS_NAMES.items()}


class KubernetesBackend:
    name = "kubernetes"
    # the cluster queues, places, preempts and requeues the jobs: the scheduler submits
    # them at once and records where the cluster runs them (RunStatus.node; delegated.py)
    schedules_itself = True
    engine = "Kubernetes"
    ref_key = "k8s_job"

    def __init__(
        self,
        configuration: Any,
        namespace: str,
        image: str,
        claim_name: str,
        resources: KubernetesResources | None = None,
        grace_seconds: int = 60,
        kueue_queues: Mapping[str, str] | None = None,
    ) -> None:
        self.configuration = configuration
        self.namespace = namespace
        self.image = image
        self.claim_name = claim_name
        self.resources = resources
        self.grace_seconds = grace_seconds
        self.kueue_queues = dict(kueue_queues or {})

    def _call(self, api: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return call_api(self.configuration, api, method, *args, **kwargs)

    def submit(
        self,
        job_id: int,
        job_dir: str,
        env: dict[str, str],
        profile: Profile,
        slices: int,
        priority: str,
        account: Account | None = None,
        attempt: str = "",
    ) -> dict[str, Any]:
        """Create the job's Kubernetes Job; returns the reference stored in the job row."""
        import aiohttp
        from kubernetes_asyncio.client.exceptions import ApiException

        account = account or Account.current()
        if account.uid == 0:
            # the pod says runAsNonRoot: the kubelet would refuse it and the Job would wait
            # forever; say so now (a service running as root with run_jobs_as_service_user)
            raise SubmitRefused("Kubernetes jobs never run as root (uid 0)", permanent=True)
        # the device plugin picks the device in the pod: there is no uuid to pass on
        env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        short = attempt[:8] or "0"
        name = f"gpuslice-job-{job_id}-{short}"
        try:
            manifest = job_manifest(
                job_id,
                account.name,
                priority,
                self.image,
                self.claim_name,
                [profile_grant(profile)] * slices,
                self.resources,
                grace_seconds=self.grace_seconds,
                # a crash fails the Job; gpuslice counts restarts and backs off itself
                max_restarts=0,
                namespace=self.namespace,
                env=env,
                run_as=(account.uid, account.gid, account.groups),
                name=name,
                job_dir=job_dir,
                queue=self.kueue_queues.get(priority, ""),
                attempt=short,
            )
        except ValueError as e:  # a profile the cluster's resources cannot name
            raise SubmitRefused(str(e), permanent=True) from None
        try:
            run_sync(self._call("BatchV1Api", "create_namespaced_job", self.namespace, manifest))
        except ApiException as e:
            if e.status != 409:  # 409: this very Job exists (a create that seemed to fail)
                message = f"{e.status} {e.reason}: {_api_message(e)}"
                raise SubmitRefused(message, e.status in PERMANENT_STATUS) from None
        except TimeoutError as e:  # (aiohttp's timeouts too)
            raise SubmitUnsure("creating the Kubernetes Job timed out") from e
        except (OSError, aiohttp.ClientError) as e:  # the API server unreachable
            raise SubmitRefused(f"the Kubernetes API cannot be reached: {e}", False) from e
        return {
            "k8s_job": name,
            "namespace": self.namespace,
            "job_dir": job_dir,
            "attempt_id": attempt,
            "user": account.name,
        }

    def find(self, job_id: int, account: Account) -> str:
        """An unfinished Job of ``job_id`` (by its label), or ""."""
        listed = run_sync(
            self._call(
                "BatchV1Api",
                "list_namespaced_job",
                self.namespace,
                label_selector=f"{LABEL_SELECTOR},gpuslice.dev/job-id={job_id}",
            )
        )
        names = [
            (item.metadata.creation_timestamp, item.metadata.name)
            for item in listed.items or []
            if not _finished(item) and not item.metadata.deletion_timestamp
        ]
        return max(names)[1] if names else ""

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return self.poll_many([ref])[0]

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        """Every run's status from two list calls: gpuslice's Jobs and their pods."""
        if not refs:
            return []

        async def both() -> tuple[Any, Any]:
            return await asyncio.gather(
                self._call(
                    "BatchV1Api",
                    "list_namespaced_job",
                    self.namespace,
                    label_selector=LABEL_SELECTOR,
                ),
                self._call(
                    "CoreV1Api",
                    "list_namespaced_pod",
                    self.namespace,
                    label_selector=LABEL_SELECTOR,
                ),
            )

        jobs_listed, pods_listed = run_sync(both())
        jobs = {item.metadata.name: item for item in jobs_listed.items or []}
        pods: defaultdict[str, list[Any]] = defaultdict(list)
        for pod in pods_listed.items or []:
            labels = pod.metadata.labels or {}
            owner = next((labels[k] for k in JOB_NAME_LABELS if k in labels), None)
            if owner:
                pods[owner].append(pod)
        return [
            self._status(ref, jobs.get(name), pods.get(name, []))
            for ref in refs
            for name in [str(ref.get("k8s_job"))]
        ]

    def _status(self, ref: dict[str, Any], job: Any, pods: list[Any]) -> RunStatus:
        # a failed or gone Job: the runner's own record says how it ended
        said = EXIT_BY_STATUS.get(_runner_status(str(ref.get("job_dir", ""))) or "")
        if job is None:
            return RunStatus(False, said, state="gone")
        conditions = {c.type: c for c in (job.status and job.status.conditions) or []}
        if _true(conditions.get("Complete")):
            return RunStatus(False, 0, state="Complete")
        failed = conditions.get("Failed")
        if failed is not None and _true(failed):
            # the runner's word; else a FailJob rule (exit 1: a cell failed); else it
            # crashed (killed, out of memory): unknown, so gpuslice restarts it
            by_rule = 1 if failed.reason == "PodFailurePolicy" else None
            code = said if said is not None else by_rule
            return RunStatus(False, code, state="Failed")
        deleting = bool(job.metadata.deletion_timestamp)
        live = [p for p in pods if (p.status and p.status.phase) not in ("Succeeded", "Failed")]
        # the Job's current pod: not being deleted (a preempted pod is torn down while the
        # Job's next one waits), the newest
        current = sorted(
            (p for p in live if not p.metadata.deletion_timestamp),
            key=lambda p: p.metadata.creation_timestamp,
        )
        # pods ending on their node (the Job being deleted ends all of its pods): not a new
        # run, and their slices are still in use
        ending = [
            p for p in live if p.spec.node_name and (deleting or p.metadata.deletion_timestamp)
        ]
        if current and current[-1].spec.node_name and not deleting:
            pod = current[-1]
            return RunStatus(True, node=pod.spec.node_name, run=pod.metadata.name, state="Running")
        if ending and (deleting or not current):
            # ending on its node: not a new run, and its slice is still in use
            pod = ending[-1]
            return RunStatus(True, node=pod.spec.node_name, run=pod.metadata.name, completing=True)
        if deleting:
            return RunStatus(True, completing=True, state="Deleting")
        # the pod's priority (its class's value), as the scheduler orders pending pods
        priority = CLASS_VALUES.get(str(job.spec.template.spec.priority_class_name))
        if current and current[-1].spec.priority is not None:
            priority = current[-1].spec.priority
        if job.spec.suspend:
            queue = (job.metadata.labels or {}).get("kueue.x-k8s.io/queue-name", "")
            return RunStatus(
                True,
                waiting=f"waiting for Kueue to admit it (queue {queue})",
                priority=priority,
                state="Suspended",
            )
        return RunStatus(True, waiting=_pending_reason(current), priority=priority, state="Pending")

    def _delete(self, ref: dict[str, Any], grace: int) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            run_sync(
                self._call(
                    "BatchV1Api",
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


def _true(condition: Any) -> bool:
    return condition is not None and condition.status == "True"


def _finished(job: Any) -> bool:
    conditions = (job.status and job.status.conditions) or []
    return any(c.type in ("Complete", "Failed") and c.status == "True" for c in conditions)


def _pending_reason(pods: list[Any]) -> str:
    """Why the Job's pod waits, as the scheduler says it ("0/200 nodes are available:
    200 Insufficient nvidia.com/mig-1g.10gb.")."""
    if not pods:
        return "pending in Kubernetes (its pod is not created yet)"
    for c in (pods[-1].status and pods[-1].status.conditions) or []:
        if c.type == "PodScheduled" and c.status == "False":
            return f"pending in Kubernetes ({c.reason or 'Unschedulable'}: {c.message or ''})"
    return "pending in Kubernetes"


def _api_message(e: Any) -> str:
    """The API's own message of an error answer (its ``Status`` body), or the reason."""
    import json

    try:
        return str(json.loads(e.body).get("message") or e.reason)
    except (TypeError, ValueError, AttributeError):
        return str(e.reason)
