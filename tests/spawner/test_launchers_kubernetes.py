"""Grant -> KubeSpawner settings, checked on the pod KubeSpawner would really create."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient
from kubespawner.objects import make_pod

from gpuslice_spawner.launchers.kubernetes import (
    KubernetesResources,
    KubeSpawnerSettings,
    kubespawner_settings,
    product_label_value,
)
from tests.harness.engines import need

try:  # a test dependency (kubernetes-validate bundles the schemas: works offline)
    import kubernetes_validate
except ImportError:  # pragma: no cover - reported by the schema tests through need()
    kubernetes_validate = None


H100 = "NVIDIA H100 80GB HBM3"

MIG_GRANT: dict[str, Any] = {
    "id": 17,
    "profile": "mig-1g.18gb",
    "kind": "mig",
    "host": "node1",
    "assignments": [
        {
            "gpu_uuid": "GPU-5f1c7a0e-0000-0000-0000-000000000001",
            "gpu_model": H100,
            "milli": 142,
            "memory_mib": 18432,
            "mig_uuid": "MIG-0b6e9c52-0000-0000-0000-000000000001",
            "mig_profile": "1g.18gb",
        }
    ],
}
SHARE_GRANT: dict[str, Any] = {
    "id": 18,
    "profile": "share-250",
    "kind": "share",
    "host": "node2",
    "assignments": [
        {
            "gpu_uuid": "GPU-5f1c7a0e-0000-0000-0000-000000000002",
            "gpu_model": "NVIDIA A100-SXM4-40GB",
            "milli": 250,
            "memory_mib": 10240,
            "mig_uuid": None,
            "mig_profile": None,
        }
    ],
}
GPU_GRANT: dict[str, Any] = {
    "id": 19,
    "profile": "gpu-2",
    "kind": "gpu",
    "host": "node1",
    "assignments": [
        {
            "gpu_uuid": f"GPU-5f1c7a0e-0000-0000-0000-00000000001{i}",
            "gpu_model": H100,
            "milli": 1000,
            "memory_mib": 81559,
            "mig_uuid": None,
            "mig_profile": None,
        }
        for i in range(2)
    ],
}


def test_mig_asks_the_device_plugin_for_one_instance_of_the_profile():
    s = kubespawner_settings(MIG_GRANT)
    assert s.extra_resource_limits == {"nvidia.com/mig-1g.18gb": "1"}
    assert s.extra_resource_guarantees == s.extra_resource_limits
    assert s.node_selector == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "kubernetes.io/hostname": "node1",
    }


def test_two_mig_instances_of_a_profile_are_counted():
    grant = copy.deepcopy(MIG_GRANT)
    second = dict(grant["assignments"][0], mig_uuid="MIG-other")
    grant["assignments"].append(second)
    assert kubespawner_settings(grant).extra_resource_limits == {"nvidia.com/mig-1g.18gb": "2"}


# the device plugin's time-slicing replicas, as c.KubernetesResourcesConfig says them
SLICED = KubernetesResources(replicas=4)


def test_share_default_is_renamed_time_slicing():
    s = kubespawner_settings(SHARE_GRANT, SLICED)
    assert s.extra_resource_limits == {"nvidia.com/gpu.shared": "1"}
    assert s.node_selector["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-40GB"


def test_share_with_plain_time_slicing_is_one_gpu_replica():
    res = KubernetesResources(share_mode="time-slicing", replicas=4)
    s = kubespawner_settings(SHARE_GRANT, res)
    assert s.extra_resource_limits == {"nvidia.com/gpu": "1"}


def share_of(milli: int) -> dict[str, Any]:
    grant = copy.deepcopy(SHARE_GRANT)
    grant["assignments"][0]["milli"] = milli
    return grant


@pytest.mark.parametrize(
    ("milli", "replicas", "slices"),
    [(500, 2, "1"), (250, 4, "1"), (500, 4, "2"), (750, 4, "3"), (375, 8, "3")],
)
def test_a_share_asks_for_as_many_time_slices_as_it_is_of_a_gpu(milli, replicas, slices):
    # the plugin hands out slices of 1000/replicas milli-GPU: a share-500 with 4 replicas is
    # two of them, or the ledger would place four such shares where the plugin runs two
    for mode, resource in [
        ("time-slicing-renamed", "nvidia.com/gpu.shared"),
        ("time-slicing", "nvidia.com/gpu"),
    ]:
        res = KubernetesResources(share_mode=mode, replicas=replicas)
        assert kubespawner_settings(share_of(milli), res).extra_resource_limits == {
            resource: slices
        }


@pytest.mark.parametrize(
    ("milli", "replicas", "words"),
    [
        (250, 2, "0.5 of the 2 time-slices of a GPU; .* nearest valid gpu_milli 500"),
        (300, 8, "2.4 of the 8 .* nearest valid gpu_milli 250 or 375"),
        (250, 3, "no share is, with 3 replicas"),
        (250, 0, "time-slicing replicas are not known"),
    ],
)
def test_a_share_that_is_no_whole_number_of_slices_is_refused(milli, replicas, words):
    with pytest.raises(ValueError, match=words):
        kubespawner_settings(share_of(milli), KubernetesResources(replicas=replicas))
    # HAMi's shares are percentages of a GPU: no slices
    hami = KubernetesResources(share_mode="hami", replicas=replicas)
    limits = kubespawner_settings(share_of(milli), hami).extra_resource_limits
    assert limits["nvidia.com/gpu"] == "1"


def test_share_with_hami_carries_memory_cap_and_compute_percent():
    s = kubespawner_settings(SHARE_GRANT, KubernetesResources(share_mode="hami"))
    assert s.extra_resource_limits == {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "10240",
        "nvidia.com/gpucores": "25",
    }
    assert s.extra_resource_guarantees == s.extra_resource_limits


def test_hami_rounds_a_fractional_percent_up():
    grant = copy.deepcopy(SHARE_GRANT)
    grant["assignments"][0]["milli"] = 125
    s = kubespawner_settings(grant, KubernetesResources(share_mode="hami"))
    assert s.extra_resource_limits["nvidia.com/gpucores"] == "13"


def test_whole_gpus_are_counted():
    s = kubespawner_settings(GPU_GRANT)
    assert s.extra_resource_limits == {"nvidia.com/gpu": "2"}


def test_names_are_configurable():
    res = KubernetesResources(
        gpu="example.com/gpu",
        mig_prefix="example.com/mig-",
        product_label="example.com/product",
        host_label=None,
    )
    assert kubespawner_settings(MIG_GRANT, res).traits() == {
        "extra_resource_limits": {"example.com/mig-1g.18gb": "1"},
        "extra_resource_guarantees": {"example.com/mig-1g.18gb": "1"},
        "node_selector": {"example.com/product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    }
    assert kubespawner_settings(GPU_GRANT, res).extra_resource_limits == {"example.com/gpu": "2"}


def test_mixed_models_get_no_product_selector():
    grant = copy.deepcopy(GPU_GRANT)
    grant["assignments"][1]["gpu_model"] = "NVIDIA A100-SXM4-80GB"
    assert "nvidia.com/gpu.product" not in kubespawner_settings(grant).node_selector


@pytest.mark.parametrize(
    "change, message",
    [
        ({"kind": "tpu"}, "unknown kind"),
        ({"assignments": []}, "no assignments"),
        ({"kind": "mig", "assignments": [{"mig_profile": "1g.18gb\nx"}]}, "mig_profile"),
        ({"kind": "share", "assignments": [{"milli": 0}]}, "out of range"),
        ({"kind": "share", "assignments": [{"milli": 100}, {"milli": 100}]}, "exactly one"),
        ({"host": "node 1"}, "not a valid label value"),
    ],
)
def test_malformed_grants_are_refused(change: dict[str, Any], message: str):
    grant = {**copy.deepcopy(MIG_GRANT), **change}
    with pytest.raises(ValueError, match=message):
        kubespawner_settings(grant)


def test_product_label_value_refuses_what_a_label_cannot_hold():
    assert product_label_value("Tesla T4") == "Tesla-T4"
    with pytest.raises(ValueError):
        product_label_value("x" * 64)


# --- the pod KubeSpawner builds from these settings --------------------------------

# the oldest Kubernetes still commonly run, and the newest schema the package bundles
SCHEMA_VERSIONS = ["1.28.0", "latest"]
# what the API server checks beyond the OpenAPI schema for extended resources
QUALIFIED_NAME = re.compile(
    r"^(?:[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


def validate(pod: dict[str, Any], version: str) -> None:
    need(kubernetes_validate is not None, "kubernetes-validate (pip install kubernetes-validate)")
    assert kubernetes_validate is not None
    if version == "latest":
        version = kubernetes_validate.latest_version()
    kubernetes_validate.validate(pod, version, strict=True)


async def build_pod(settings: KubeSpawnerSettings) -> dict[str, Any]:
    pod = make_pod(
        name="jupyter-alice",
        cmd=["jupyterhub-singleuser"],
        port=8888,
        image="quay.io/jupyter/base-notebook:latest",
        **settings.traits(),
    )
    # serialise exactly as KubeSpawner does before sending the pod to the API server
    async with ApiClient() as api:
        body: dict[str, Any] = api.sanitize_for_serialization(pod)
    return body


def assert_extended_resources_acceptable(resources: dict[str, str]) -> None:
    for name, value in resources.items():
        domain, _, short = name.rpartition("/")
        assert domain and QUALIFIED_NAME.match(name), name
        assert not domain.endswith("kubernetes.io"), name
        assert len(short) <= 63, name
        # extended resources must be whole numbers, and the request must equal the limit
        assert re.fullmatch(r"[1-9][0-9]*", value), (name, value)


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize(
    "grant, resources",
    [
        (MIG_GRANT, KubernetesResources()),
        (SHARE_GRANT, SLICED),
        (SHARE_GRANT, KubernetesResources(share_mode="time-slicing", replicas=4)),
        (SHARE_GRANT, KubernetesResources(share_mode="hami")),
        (GPU_GRANT, KubernetesResources()),
    ],
    ids=["mig", "share-renamed", "share-timeslicing", "share-hami", "gpu"],
)
async def test_pod_is_valid_kubernetes(
    grant: dict[str, Any], resources: KubernetesResources, version: str
):
    settings = kubespawner_settings(grant, resources)
    pod = await build_pod(settings)
    validate(pod, version)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == settings.extra_resource_limits
    assert container["resources"]["requests"] == settings.extra_resource_limits
    assert pod["spec"]["nodeSelector"] == settings.node_selector
    assert pod["spec"]["tolerations"] == settings.tolerations
    assert_extended_resources_acceptable(container["resources"]["limits"])


async def test_the_validator_does_reject_a_broken_pod():
    need(kubernetes_validate is not None, "kubernetes-validate (pip install kubernetes-validate)")
    assert kubernetes_validate is not None
    pod = await build_pod(kubespawner_settings(MIG_GRANT))
    pod["spec"]["containers"][0]["resources"]["limits"] = ["nvidia.com/mig-1g.18gb"]
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod, "latest")
    pod = await build_pod(kubespawner_settings(MIG_GRANT))
    pod["spec"]["nodeSelectors"] = pod["spec"].pop("nodeSelector")  # strict: unknown field
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(pod, "latest")
