"""Kubernetes Job manifests for batch jobs, validated against the Kubernetes schemas."""

from __future__ import annotations

from typing import Any

import pytest

from gpuslice_hub.jobs.backends.kubernetes import gpu_limits, job_manifest, priority_classes
from tests.harness.engines import need

try:  # kubernetes-validate bundles the schemas: works offline
    import kubernetes_validate
except ImportError:  # pragma: no cover
    kubernetes_validate = None


def validate(obj: dict[str, Any]) -> None:
    need(kubernetes_validate is not None, "kubernetes-validate")
    assert kubernetes_validate is not None
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


@pytest.mark.parametrize(
    ("kind", "mig", "resource"),
    [
        ("gpu", "", "nvidia.com/gpu"),
        ("mig", "1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("share", "", "nvidia.com/gpu.shared"),
    ],
)
def test_job_manifest_is_valid_and_does_not_count_disruptions(kind, mig, resource):
    job = job_manifest(
        12,
        "alice@example.org",
        "preemptible",
        "quay.io/jupyter/scipy-notebook",
        "jobs-pvc",
        gpu_limits(kind, 1, mig),
        grace_seconds=90,
        max_runtime_seconds=3600,
        env={"GPUSLICE_JOB_ID": "12"},
        run_as=(1001, 1001, (1001, 2000)),
    )
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gpuslice-preemptible"
    assert pod["terminationGracePeriodSeconds"] == 90
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["resources"]["limits"] == {resource: "1"}
    assert pod["containers"][0]["command"] == ["python", "-m", "gpuslice.run", "/gpuslice-jobs/12"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert rules[1]["action"] == "Ignore" and rules[1]["onExitCodes"]["values"] == [75]
    assert rules[2]["action"] == "FailJob" and rules[2]["onExitCodes"]["values"] == [1]
    assert job["metadata"]["labels"]["gpuslice.dev/user"] == "alice-example.org"
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    # it runs as its owner, unprivileged, with no service-account token
    assert pod["securityContext"]["runAsUser"] == 1001
    assert pod["securityContext"]["supplementalGroups"] == [1001, 2000]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False


def test_priority_classes_only_non_preemptible_ones_preempt():
    classes = {c["metadata"]["name"]: c for c in priority_classes()}
    for c in classes.values():
        validate(c)
    assert classes["gpuslice-preemptible"]["preemptionPolicy"] == "Never"
    assert classes["gpuslice-high"]["value"] > classes["gpuslice-normal"]["value"]
    assert classes["gpuslice-normal"]["value"] > classes["gpuslice-preemptible"]["value"]
