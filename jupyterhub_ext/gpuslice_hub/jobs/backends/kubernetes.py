"""Kubernetes Jobs of batch jobs (pure: the manifests; ``kubernetes_client`` submits them).

* resources: what the job's slices are, in the spawner's translation of a grant (the same
  device-plugin resources and GPU product selector as a server's pod), with no node: the
  cluster's scheduler chooses it;
* ``priorityClassName``: the job's class maps to a PriorityClass, so the cluster's own
  scheduler preempts preemptible jobs for servers and other pods (:func:`priority_classes`);
* with Kueue, the class's LocalQueue (``kueue.x-k8s.io/queue-name``) and ``suspend``: the
  Job waits until Kueue admits it within its ClusterQueue's quota;
* ``terminationGracePeriodSeconds``: the time the runner has between SIGTERM (the
  kubelet's, on preemption or eviction) and SIGKILL to checkpoint;
* ``podFailurePolicy``: a pod stopped by a disruption (preemption, eviction, node drain:
  the ``DisruptionTarget`` condition) or one whose runner exited 75 (it checkpointed
  after a signal) does not count against ``backoffLimit``: the Job makes a new pod, which
  resumes from the checkpoint on the job's volume; a cell failure (exit 1) fails the Job.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from gpuslice.vocab import EXIT_PREEMPTED
from gpuslice_spawner.launchers.kubernetes import KubernetesResources, kubespawner_settings

# The label on every batch job's Job and pod (the service finds its own by it)
JOB_LABEL = ("app.kubernetes.io/name", "gpuslice-job")
ATTEMPT_LABEL = "gpuslice.dev/attempt"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Kubernetes label values: at most 63 characters, alphanumerics at both ends
LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?")

PRIORITY_CLASS_NAMES = {
    "preemptible": "gpuslice-preemptible",
    "normal": "gpuslice-normal",
    "high": "gpuslice-high",
}


def pod_placement(
    grants: Sequence[Mapping[str, Any]], resources: KubernetesResources | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """The resource limits and node selector of a pod that holds all of ``grants``: the
    spawner's translation of each grant (device-plugin resources, the granted node and GPU
    product), summed. A pod runs on one node: slices granted on several cannot be one pod."""
    if not grants:
        raise ValueError("no grants to translate")
    limits: Counter[str] = Counter()
    selectors = []
    for grant in grants:
        settings = kubespawner_settings(grant, resources)
        limits.update({name: int(n) for name, n in settings.extra_resource_limits.items()})
        selectors.append(settings.node_selector)
    if any(selector != selectors[0] for selector in selectors):
        raise ValueError("the job's slices were granted on different nodes or GPU models")
    return {name: str(n) for name, n in limits.items()}, selectors[0]


def job_manifest(
    job_id: int,
    user: str,
    priority: str,
    image: str,
    claim_name: str,
    grants: Sequence[Mapping[str, Any]],
    resources: KubernetesResources | None = None,
    grace_seconds: int = 60,
    max_restarts: int = 3,
    max_runtime_seconds: int = 0,
    namespace: str = "default",
    env: dict[str, str] | None = None,
    run_as: tuple[int, int, tuple[int, ...]] | None = None,
    name: str | None = None,
    job_dir: str | None = None,
    queue: str = "",
    attempt: str = "",
) -> dict[str, Any]:
    """``run_as``: the owner's (uid, gid, supplementary gids), as KubeSpawner sets a user's
    pod; the runner then runs as its owner, without privileges. Required unless the site
    runs jobs as the service's account. ``grants``: the job's slices in a grant's shape,
    requested as the spawner requests a server's (:func:`pod_placement`): a node selector
    only where a grant names a host. ``queue``: Kueue's LocalQueue, or "" without Kueue.
    ``attempt``: the submission's id, as a label (found again after a timed-out create)."""
    limits, selector = pod_placement(grants, resources)
    tolerations = [dict(t) for t in (resources or KubernetesResources()).tolerations]
    labels = _labels(job_id, user)
    if attempt:
        labels[ATTEMPT_LABEL] = attempt
    if queue:
        if not LABEL_VALUE.fullmatch(queue):
            raise ValueError(f"Kueue queue {queue!r} is not a valid label value")
        labels[KUEUE_QUEUE_LABEL] = queue
    # the jobs volume is mounted where the service has it, so a job folder has one path
    job_dir = job_dir or f"/gpuslice-jobs/{job_id}"
    mount = job_dir.rstrip("/").rsplit("/", 1)[0] or "/"
    security: dict[str, Any] = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    if run_as is not None:
        uid, gid, groups = run_as
        security.update(runAsUser=uid, runAsGroup=gid, supplementalGroups=sorted(set(groups)))
    spec: dict[str, Any] = {
        "backoffLimit": max_restarts,
        # a finished Job is removed a day later (kept for an admin's look meanwhile): the
        # backend's list call stays the size of what runs; a gone Job is told by the
        # runner's record in its folder
        "ttlSecondsAfterFinished": 86400,
        "podFailurePolicy": {
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
                {
                    "action": "Ignore",
                    "onExitCodes": {
                        "containerName": "runner",
                        "operator": "In",
                        "values": [EXIT_PREEMPTED],
                    },
                },
                {
                    "action": "FailJob",
                    "onExitCodes": {"containerName": "runner", "operator": "In", "values": [1]},
                },
            ]
        },
        "template": {
            "metadata": {"labels": _labels(job_id, user)},
            "spec": {
                # podFailurePolicy requires Never: the Job controller, not the kubelet,
                # decides about a restart
                "restartPolicy": "Never",
                "priorityClassName": PRIORITY_CLASS_NAMES[priority],
                "terminationGracePeriodSeconds": grace_seconds,
                "securityContext": security,
                # a job gets no token: nothing of the cluster's API either
                "automountServiceAccountToken": False,
                **({"nodeSelector": selector} if selector else {}),
                # the tolerations the service judged the nodes by, as a server's pod has
                **({"tolerations": tolerations} if tolerations else {}),
                "containers": [
                    {
                        "name": "runner",
                        "image": image,
                        "command": ["python", "-m", "gpuslice.run", job_dir],
                        "workingDir": job_dir,
                        "env": [{"name": k, "value": v} for k, v in sorted((env or {}).items())],
                        "resources": {"limits": dict(limits)},
                        "volumeMounts": [{"name": "jobs", "mountPath": mount}],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                    }
                ],
                "volumes": [{"name": "jobs", "persistentVolumeClaim": {"claimName": claim_name}}],
            },
        },
    }
    if max_runtime_seconds:
        spec["activeDeadlineSeconds"] = max_runtime_seconds
    if queue:
        # Kueue admits the Job (unsuspends it) when its ClusterQueue has quota for it
        spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name or f"gpuslice-job-{job_id}",
            "namespace": namespace,
            "labels": labels,
        },
        "spec": spec,
    }


# The PriorityClasses' values, one each: the scheduler's queue takes pending pods in this
# order (high first). A pod of a PreemptLowerPriority class preempts any pod of a lower
# value, and servers and the cluster's other pods have the default priority, 0. So:
# preemptible jobs are below 0 and never preempt: servers, normal jobs and any other pod
# preempt them; normal jobs are at 0: they preempt preemptible jobs, never a server, a
# high job or another pod; high jobs are above 0, and so must never preempt (they would
# preempt servers, normal jobs and the cluster's other pods): first in line for what frees.
PRIORITY_VALUES = {"preemptible": -1000, "normal": 0, "high": 1000}
PREEMPTION_POLICIES = {
    "preemptible": "Never",
    "normal": "PreemptLowerPriority",
    "high": "Never",
}


def priority_classes() -> list[dict[str, Any]]:
    """The PriorityClasses the Jobs refer to (the admin guide's manifest): only normal
    preempts, and only preemptible jobs (:data:`PRIORITY_VALUES`)."""
    return [
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": PRIORITY_CLASS_NAMES[p]},
            "value": v,
            "preemptionPolicy": PREEMPTION_POLICIES[p],
            "globalDefault": False,
            "description": f"gpuslice {p} batch jobs",
        }
        for p, v in PRIORITY_VALUES.items()
    ]


def _labels(job_id: int, user: str) -> dict[str, str]:
    safe_user = "".join(c if c.isalnum() or c in "-_." else "-" for c in user)[:63].strip("-_.")
    return {
        JOB_LABEL[0]: JOB_LABEL[1],
        "gpuslice.dev/job-id": str(job_id),
        "gpuslice.dev/user": safe_user or "user",
    }
