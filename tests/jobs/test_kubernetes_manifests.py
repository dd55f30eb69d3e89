"""Kubernetes Job manifests for batch jobs, validated against the Kubernetes schemas."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gpuslice_hub.jobs.backends.kubernetes import job_manifest, pod_placement, priority_classes
from gpuslice_spawner.launchers.kubernetes import KubernetesResources
from tests.harness.engines import need

try:  # kubernetes-validate bundles the schemas: works offline
    import kubernetes_validate
except ImportError:  # pragma: no cover
    kubernetes_validate = None


def validate(obj: dict[str, Any]) -> None:
    need(kubernetes_validate is not None, "kubernetes-validate")
    assert kubernetes_validate is not None
    kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)


A100 = "NVIDIA A100-SXM4-80GB"


def grant(kind: str, mig: str = "", host: str = "gpu-node-1", milli: int = 1000) -> dict:
    """A ledger allocation, as the scheduler hands it to a backend."""
    one = {"gpu_uuid": "GPU-1", "gpu_model": A100, "milli": milli, "memory_mib": 20480}
    if mig:
        one.update(mig_uuid="MIG-1", mig_profile=mig)
    return {"id": 3, "kind": kind, "host": host, "assignments": [one]}


@pytest.mark.parametrize(
    ("kind", "mig", "resource"),
    [
        ("gpu", "", "nvidia.com/gpu"),
        ("mig", "1g.10gb", "nvidia.com/mig-1g.10gb"),
        ("share", "", "nvidia.com/gpu.shared"),
    ],
)
def test_job_manifest_is_valid_and_does_not_count_disruptions(kind, mig, resource):
    # a share-250 with the device plugin's 4 time-slices a GPU: one slice
    job = job_manifest(
        12,
        "alice@example.org",
        "preemptible",
        "quay.io/jupyter/scipy-notebook",
        "jobs-pvc",
        [grant(kind, mig, milli=250 if kind == "share" else 1000)],
        grace_seconds=90,
        max_runtime_seconds=3600,
        env={"GPUSLICE_JOB_ID": "12"},
        run_as=(1001, 1001, (1001, 2000)),
        resources=KubernetesResources(replicas=4),
    )
    validate(job)
    pod = job["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "gpuslice-preemptible"
    assert pod["terminationGracePeriodSeconds"] == 90
    assert pod["restartPolicy"] == "Never"
    assert pod["containers"][0]["resources"]["limits"] == {resource: "1"}
    # on the node and GPU model the ledger granted, as the spawner pins a server
    assert pod["nodeSelector"] == {
        "kubernetes.io/hostname": "gpu-node-1",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    assert pod["containers"][0]["command"] == ["python", "-m", "gpuslice.run", "/gpuslice-jobs/12"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert rules[1]["action"] == "Ignore" and rules[1]["onExitCodes"]["values"] == [75]
    assert rules[2]["action"] == "FailJob" and rules[2]["onExitCodes"]["values"] == [1]
    assert job["metadata"]["labels"]["gpuslice.dev/user"] == "alice-example.org"
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400  # finished Jobs do not pile up
    # it runs as its owner, unprivileged, with no service-account token
    assert pod["securityContext"]["runAsUser"] == 1001
    assert pod["securityContext"]["supplementalGroups"] == [1001, 2000]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False


def test_one_priority_class_per_job_class_in_order_and_no_job_preempts_a_server():
    classes = {c["metadata"]["name"]: c for c in priority_classes()}
    for c in classes.values():
        validate(c)
    values = [classes[f"gpuslice-{p}"]["value"] for p in ("preemptible", "normal", "high")]
    # the scheduler's queue takes pending pods by value: high first, then normal
    assert values == sorted(set(values)), values
    # a pod preempts only pods of a lower value; servers and the cluster's other pods have
    # the default priority, 0: a class that may preempt is never above it, so no job ever
    # preempts a server, and none but preemptible ones are ever preempted by a job
    server = 0
    for c in classes.values():
        if c["preemptionPolicy"] == "PreemptLowerPriority":
            assert c["value"] <= server, c["metadata"]["name"]
    preemptible = classes["gpuslice-preemptible"]
    assert preemptible["value"] < server and preemptible["preemptionPolicy"] == "Never"
    normal = classes["gpuslice-normal"]
    assert normal["value"] > preemptible["value"]
    assert normal["preemptionPolicy"] == "PreemptLowerPriority"  # preempts preemptible ones
    assert not any(c["globalDefault"] for c in classes.values())


def test_the_admin_guide_applies_the_priority_classes_the_jobs_name():
    """The manifest the guide tells admins to apply is the one the backend refers to."""
    import yaml

    guide = (Path(__file__).resolve().parents[2] / "docs" / "admin-guide.md").read_text()
    block = re.search(r"<!-- manifest: priority-classes -->\n```yaml\n(.*?)\n```", guide, re.S)
    assert block, "the guide has no PriorityClass manifest"
    applied = [doc for doc in yaml.safe_load_all(block.group(1)) if doc]
    for doc in applied:
        validate(doc)
    assert applied == priority_classes()


def test_a_jobs_pod_tolerates_what_the_service_judged_the_nodes_by():
    mine = {"key": "example.com/batch", "operator": "Equal", "value": "yes", "effect": "NoExecute"}
    res = KubernetesResources(tolerations=(mine,))
    job = job_manifest(3, "ann", "normal", "img", "pvc", [grant("gpu")], res)
    validate(job)
    assert job["spec"]["template"]["spec"]["tolerations"] == [mine]
    default = job_manifest(3, "ann", "normal", "img", "pvc", [grant("gpu")])
    assert default["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]


def test_a_kueue_job_is_created_suspended_in_its_queue_and_names_are_checked():
    job = job_manifest(
        3, "ann", "normal", "img", "pvc", [grant("gpu")], queue="gpu-team", attempt="ab12"
    )
    validate(job)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-team"
    assert job["metadata"]["labels"]["gpuslice.dev/attempt"] == "ab12"
    with pytest.raises(ValueError, match="not a valid label value"):
        job_manifest(3, "ann", "normal", "img", "pvc", [grant("gpu")], queue="bad queue!")


def test_a_job_of_several_slices_is_one_pod_with_their_sum_on_their_node():
    limits, selector = pod_placement([grant("mig", "1g.10gb"), grant("mig", "1g.10gb")])
    assert limits == {"nvidia.com/mig-1g.10gb": "2"}
    assert selector["kubernetes.io/hostname"] == "gpu-node-1"
    # the site's share mode, as for servers (one translator, KubernetesResources)
    hami = KubernetesResources(share_mode="hami")
    limits, _ = pod_placement([grant("share", milli=250)], hami)
    assert limits == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpucores": "25",
        "nvidia.com/gpumem": "20480",
    }
    with pytest.raises(ValueError, match="different nodes"):
        pod_placement([grant("gpu"), grant("gpu", host="gpu-node-2")])
    with pytest.raises(ValueError, match="no grants"):
        pod_placement([])
