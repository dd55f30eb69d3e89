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
* ``poll_many``: the Jobs and their pods (by label), from a list and a watch kept current
  between passes (:mod:`gpuslice_hub.kubewatch`; or, until the watch is current and
  whenever it broke, two list calls), tell every job's state: waiting (the scheduler's or
  Kueue's reason), running on a node (the pod's ``nodeName``; the pass records the slice
  there in the ledger), requeued (a new pod: the cluster preempted or evicted the last one,
  the Job's ``podFailurePolicy`` ignored that and the new pod resumes from the checkpoint),
  or over (``Complete``/``Failed``, or gone: the runner's record in its folder says how it
  ended). While a Job created here is not in the watch's view yet, the pass lists (a list
  shows every create made before it; a watch shows it a moment later, or, stalled, late).
* ``signal_preempt``: delete the Job in the foreground with the pod's grace period: the
  kubelet's SIGTERM reaches the runner, which checkpoints and exits 75; the pass then
  submits it again (a new Job). Used when the cluster did not preempt it for a server.
* ``kill``: the same delete with no grace.

The service talks to the cluster with its own service account (in a pod) or a kubeconfig;
the calls are tested against a local HTTP server answering in the API's shapes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.vocab import EXIT_BY_STATUS
from gpuslice_spawner.launchers.kubernetes import KubernetesResources

from ...kubeapi import ApiSession, list_items
from ...kubewatch import Informer
from ...profiles import Profile
from ..accounts import Account
from .base import RunStatus, SubmitRefused, SubmitUnsure, profile_grant
from .kubernetes import (
    JOB_LABEL,
    KUEUE_QUEUE_LABEL,
    PRIORITY_CLASS_NAMES,
    PRIORITY_VALUES,
    job_manifest,
)
from .local import _state

LABEL_SELECTOR = "=".join(JOB_LABEL)
# The label the Job controller puts on its pods (the older name first, the newer second)
JOB_NAME_LABELS = ("job-name", "batch.kubernetes.io/job-name")
# Answers to a create that trying again cannot mend (the API refused the manifest); a
# missing namespace (404) or a quota (403) can be mended by an admin: retried with backoff
PERMANENT_STATUS = {400, 422}
# How long a Job created here is remembered as not yet in the watch's view (meanwhile the
# passes that poll it list): a stalled watch is noticed well before (kubewatch.py)
UNSEEN_SECONDS = 600.0
LOG = logging.getLogger("gpuslice.kubernetes")
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
        watch: bool = False,
    ) -> None:
        self.session = ApiSession(configuration)
        # the Jobs and pods kept current by a watch (the service's way), else listed each
        # pass (tests of the list path)
        self.watch = watch
        self._informers: tuple[Informer, Informer] | None = None
        # Jobs created (or found) here and not in the watch's view yet -> when: a pass
        # asking about one lists, so a Job the watch shows late never reads as gone
        self._unseen: dict[str, float] = {}
        self.namespace = namespace
        self.image = image
        self.claim_name = claim_name
        self.resources = resources
        self.grace_seconds = grace_seconds
        self.kueue_queues = dict(kueue_queues or {})

    @property
    def configuration(self) -> Any:
        return self.session.configuration

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
            self.session.call("BatchV1Api", "create_namespaced_job", self.namespace, manifest)
        except ApiException as e:
            message = f"{e.status} {e.reason}: {_api_message(e)}"
            if e.status >= 500:
                # a 504 ("the request did not complete") or a failing server may have stored
                # the Job: look for it before creating another
                raise SubmitUnsure(f"creating the Kubernetes Job: {message}") from None
            if e.status != 409:  # 409: this very Job exists (a create that seemed to fail)
                raise SubmitRefused(message, e.status in PERMANENT_STATUS) from None
        except TimeoutError as e:  # (aiohttp's timeouts too)
            raise SubmitUnsure("creating the Kubernetes Job timed out") from e
        except (OSError, aiohttp.ClientConnectorError) as e:  # never reached the API server
            raise SubmitRefused(f"the Kubernetes API cannot be reached: {e}", False) from e
        except aiohttp.ClientError as e:  # the connection broke after the request was sent
            raise SubmitUnsure(f"creating the Kubernetes Job: {e}") from e
        self._unseen[name] = time.monotonic()
        return {
            "k8s_job": name,
            "namespace": self.namespace,
            "job_dir": job_dir,
            "attempt_id": attempt,
            "user": account.name,
        }

    def missing_priority_classes(self) -> list[str]:
        """The PriorityClasses the Jobs name that the cluster lacks (checked at start)."""
        found = self.session.list("SchedulingV1Api", "list_priority_class")
        names = {str(_meta(item).get("name")) for item in found}
        return sorted(set(PRIORITY_CLASS_NAMES.values()) - names)

    def find(self, job_id: int, account: Account) -> str:
        """An unfinished Job of ``job_id`` (by its label), or ""."""
        selector = f"{LABEL_SELECTOR},gpuslice.dev/job-id={job_id}"
        listed = self.session.list(
            "BatchV1Api", "list_namespaced_job", namespace=self.namespace, label_selector=selector
        )
        names = [
            (_meta(item).get("creationTimestamp", ""), _meta(item)["name"])
            for item in listed
            if not _finished(item) and not _meta(item).get("deletionTimestamp")
        ]
        found = max(names)[1] if names else ""
        if found:
            self._unseen[found] = time.monotonic()  # (made by a create that seemed to fail)
        return found

    def poll(self, ref: dict[str, Any]) -> RunStatus:
        return self.poll_many([ref])[0]

    def poll_many(self, refs: Sequence[dict[str, Any]]) -> list[RunStatus]:
        """Every run's status from two list calls: gpuslice's Jobs and their pods."""
        if not refs:
            return []

        async def both(api_client: Any) -> tuple[Any, Any]:
            # the API's JSON, paged: thousands of Jobs and pods parse several times faster
            # than as the client's models
            selected = {"namespace": self.namespace, "label_selector": LABEL_SELECTOR}
            # both finish before the pass goes on, failed or not: a call left running
            # after its sibling failed would outlive the pass that asked for it
            found = await asyncio.gather(
                list_items(api_client, "BatchV1Api", "list_namespaced_job", **selected),
                list_items(api_client, "CoreV1Api", "list_namespaced_pod", **selected),
                return_exceptions=True,
            )
            for answer in found:
                if isinstance(answer, BaseException):
                    raise answer
            return found[0], found[1]

        names = {str(ref.get("k8s_job")) for ref in refs}
        watched = self._watched()
        if watched is not None:
            shown = {_meta(item)["name"] for item in watched[0]}
            if any(name in self._unseen and name not in shown for name in names):
                watched = None  # a Job created here the watch does not show yet: list
        job_items, pod_items = watched if watched is not None else self.session.run(both)
        jobs = {_meta(item)["name"]: item for item in job_items}
        now = time.monotonic()
        for created, at in list(self._unseen.items()):
            # shown by the watch; or listed as gone (a list shows every create before it)
            seen = created in jobs if watched is not None else False
            gone = watched is None and created in names and created not in jobs
            if seen or gone or now - at > UNSEEN_SECONDS:
                del self._unseen[created]
        pods: defaultdict[str, list[Any]] = defaultdict(list)
        for pod in pod_items:
            labels = _meta(pod).get("labels") or {}
            owner = next((labels[k] for k in JOB_NAME_LABELS if k in labels), None)
            if owner:
                pods[owner].append(pod)
        return [
            self._status(ref, jobs.get(name), pods.get(name, []))
            for ref in refs
            for name in [str(ref.get("k8s_job"))]
        ]

    def _status(
        self, ref: dict[str, Any], job: dict[str, Any] | None, pods: list[dict[str, Any]]
    ) -> RunStatus:

        def said() -> int | None:
            # a failed or gone Job: the runner's own record says how it ended (read only
            # then: a pass over thousands of waiting jobs opens no job folder), if it is
            # this submission's (an earlier one's "preempted" says nothing of this one)
            state = _state(str(ref.get("job_dir", "")))
            if ref.get("attempt_id") and state.get("attempt_id") != ref["attempt_id"]:
                return None
            return EXIT_BY_STATUS.get(str(state.get("status") or ""))

        if job is None:
            return RunStatus(False, said(), state="gone")
        conditions = {
            c.get("type"): c
            for c in (job.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"
        }
        if "Complete" in conditions:
            return RunStatus(False, 0, state="Complete")
        if "Failed" in conditions:
            # the runner's word; else a FailJob rule (exit 1: a cell failed); else it
            # crashed (killed, out of memory): unknown, so gpuslice restarts it
            by_rule = 1 if conditions["Failed"].get("reason") == "PodFailurePolicy" else None
            code = said()
            code = code if code is not None else by_rule
            return RunStatus(False, code, state="Failed")
        deleting = bool(_meta(job).get("deletionTimestamp"))
        live = [p for p in pods if _phase(p) not in ("Succeeded", "Failed")]
        # the Job's current pod: not being deleted (a preempted pod is torn down while the
        # Job's next one waits), the newest
        current = sorted(
            (p for p in live if not _meta(p).get("deletionTimestamp")),
            key=lambda p: (_meta(p).get("creationTimestamp", ""), _meta(p)["name"]),
        )
        # pods ending on their node (the Job being deleted ends all of its pods): not a new
        # run, and their slices are still in use
        ending = [p for p in live if _node(p) and (deleting or _meta(p).get("deletionTimestamp"))]
        if current and _node(current[-1]) and not deleting:
            pod = current[-1]
            return RunStatus(True, node=_node(pod), run=_meta(pod)["name"], state="Running")
        if ending and (deleting or not current):
            # ending on its node: not a new run, and its slice is still in use
            pod = ending[-1]
            return RunStatus(True, node=_node(pod), run=_meta(pod)["name"], completing=True)
        if deleting:
            # its pods ended but the Job is not gone yet: still the run the service recorded
            # (a requeue now would account for its end twice)
            return RunStatus(
                True, node=str(ref.get("node") or ""), run=ref.get("run"), completing=True
            )
        spec = job.get("spec") or {}
        # the pod's priority (its class's value), as the scheduler orders pending pods
        template = (spec.get("template") or {}).get("spec") or {}
        priority = CLASS_VALUES.get(str(template.get("priorityClassName")))
        if current and isinstance((current[-1].get("spec") or {}).get("priority"), int):
            priority = current[-1]["spec"]["priority"]
        if spec.get("suspend"):
            queue = (_meta(job).get("labels") or {}).get(KUEUE_QUEUE_LABEL, "")
            return RunStatus(
                True,
                waiting=f"waiting for Kueue to admit it (queue {queue})",
                priority=priority,
                state="Suspended",
            )
        return RunStatus(True, waiting=_pending_reason(current), priority=priority, state="Pending")

    def _watched(self) -> tuple[list[Any], list[Any]] | None:
        """The Jobs and pods from the watches, or None while they are not current (the
        first pass starts them)."""
        if not self.watch:
            return None
        if self._informers is None:
            selected = {"namespace": self.namespace, "label_selector": LABEL_SELECTOR}
            self._informers = (
                Informer(self.session, "BatchV1Api", "list_namespaced_job", LOG, **selected),
                Informer(self.session, "CoreV1Api", "list_namespaced_pod", LOG, **selected),
            )
        jobs, pods = self._informers
        jobs.start()
        pods.start()
        job_items, pod_items = jobs.snapshot(), pods.snapshot()
        if job_items is None or pod_items is None:
            return None
        return job_items, pod_items

    def close(self) -> None:
        """Stop the watches and close the connections (a later pass starts them again)."""
        self.session.close()
        self._informers = None

    def _delete(self, ref: dict[str, Any], grace: int) -> None:
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            self.session.call(
                "BatchV1Api",
                "delete_namespaced_job",
                ref["k8s_job"],
                ref.get("namespace", self.namespace),
                propagation_policy="Foreground",
                grace_period_seconds=grace,
            )
        except ApiException as e:
            if e.status != 404:  # already gone: nothing to stop
                raise

    def signal_preempt(self, ref: dict[str, Any]) -> None:
        self._delete(ref, self.grace_seconds)

    def kill(self, ref: dict[str, Any]) -> None:
        self._delete(ref, 0)
        # a Job's deletion ends its pods with their own grace period (preempt_grace): a
        # kill (cancel, timeout) ends them now, so the GPU is free when the slice is
        self.session.call(
            "CoreV1Api",
            "delete_collection_namespaced_pod",
            ref.get("namespace", self.namespace),
            label_selector=f"{JOB_NAME_LABELS[0]}={ref['k8s_job']}",
            grace_period_seconds=0,
        )


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    return obj.get("metadata") or {}


def _phase(pod: dict[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def _node(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def _finished(job: dict[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conditions
    )


def _pending_reason(pods: list[dict[str, Any]]) -> str:
    """Why the Job's pod waits, as the scheduler says it ("0/200 nodes are available:
    200 Insufficient nvidia.com/mig-1g.10gb.")."""
    if not pods:
        # (for long: the Job's events say why, e.g. a missing PriorityClass or a quota)
        return "pending in Kubernetes (its pod is not created yet)"
    for c in (pods[-1].get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            reason, message = c.get("reason") or "Unschedulable", c.get("message") or ""
            return f"pending in Kubernetes ({reason}: {message})"
    return "pending in Kubernetes"


def _api_message(e: Any) -> str:
    """The API's own message of an error answer (its ``Status`` body), or the reason."""
    import json

    try:
        return str(json.loads(e.body).get("message") or e.reason)
    except (TypeError, ValueError, AttributeError):
        return str(e.reason)
