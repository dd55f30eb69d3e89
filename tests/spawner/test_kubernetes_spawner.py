"""GPUSliceKubeSpawner: the pod KubeSpawner itself would create for each grant, schema-checked.

No cluster: KubeSpawner is built in its test mode (``_mock=True``) with client setup
patched out, and ``get_pod_manifest()`` -- the method KubeSpawner's ``start()`` sends to
the API server -- is called after ``apply_grant``.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from traitlets.config import Config

from tests.harness.engines import need_module

kubespawner_module = need_module("kubespawner.spawner")

from kubernetes_asyncio.client import ApiClient  # noqa: E402

from gpuslice_hub.client import ServiceClient  # noqa: E402
from gpuslice_spawner.kubernetes import GPUSliceKubeSpawner  # noqa: E402
from gpuslice_spawner.kubernetes_resources import KubernetesResourcesConfig  # noqa: E402
from gpuslice_spawner.spawner import GPUSliceSpawner  # noqa: E402
from tests.spawner.test_launchers_kubernetes import (  # noqa: E402
    GPU_GRANT,
    MIG_GRANT,
    SCHEMA_VERSIONS,
    SHARE_GRANT,
    assert_extended_resources_acceptable,
    validate,
)


@pytest.fixture
def make_spawner() -> Iterator[Any]:
    # KubeSpawner.__init__ loads a kubeconfig and makes an API client; neither is needed to
    # build a manifest, and there is no cluster here.
    with (
        mock.patch.object(kubespawner_module, "load_config"),
        mock.patch.object(kubespawner_module, "shared_client"),
    ):

        def make(**traits: Any) -> GPUSliceKubeSpawner:
            """``traits`` of the spawner, and of the shared c.KubernetesResourcesConfig."""
            user = SimpleNamespace(name="alice", id=7, url="/user/alice/", groups=[])
            shared = KubernetesResourcesConfig.class_trait_names(config=True)
            resources = {k: traits.pop(k) for k in list(traits) if k in shared}
            return GPUSliceKubeSpawner(
                _mock=True,
                user=user,
                image="quay.io/jupyter/base-notebook:2024-12-02",
                cmd=["jupyterhub-singleuser"],
                config=Config({"KubernetesResourcesConfig": resources}),
                **traits,
            )

        yield make


async def pod_for(spawner: GPUSliceKubeSpawner, grant: dict[str, Any]) -> dict[str, Any]:
    spawner.grant = grant
    spawner.apply_grant(grant)
    pod = await spawner.get_pod_manifest()
    async with ApiClient() as api:  # serialised exactly as KubeSpawner sends it
        body: dict[str, Any] = api.sanitize_for_serialization(pod)
    return body


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}


CASES = [
    (
        MIG_GRANT,
        "time-slicing-renamed",
        {"nvidia.com/mig-1g.18gb": "1"},
        "NVIDIA-H100-80GB-HBM3",
    ),
    (SHARE_GRANT, "time-slicing-renamed", {"nvidia.com/gpu.shared": "1"}, "NVIDIA-A100-SXM4-40GB"),
    (SHARE_GRANT, "time-slicing", {"nvidia.com/gpu": "1"}, "NVIDIA-A100-SXM4-40GB"),
    (
        SHARE_GRANT,
        "hami",
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "10240", "nvidia.com/gpucores": "25"},
        "NVIDIA-A100-SXM4-40GB",
    ),
    (GPU_GRANT, "time-slicing-renamed", {"nvidia.com/gpu": "2"}, "NVIDIA-H100-80GB-HBM3"),
]


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize(
    "grant, share_mode, limits, product",
    CASES,
    ids=["mig", "share-renamed", "share-timeslicing", "share-hami", "gpu"],
)
async def test_pod_of_each_profile_kind_is_valid_and_holds_the_grant(
    make_spawner: Any,
    grant: dict[str, Any],
    share_mode: str,
    limits: dict[str, str],
    product: str,
    version: str,
):
    pod = await pod_for(make_spawner(share_mode=share_mode, time_slicing_replicas=4), grant)
    validate(pod, version)
    container = pod["spec"]["containers"][0]
    assert container["resources"]["limits"] == limits
    assert container["resources"]["requests"] == limits
    assert_extended_resources_acceptable(container["resources"]["limits"])
    assert pod["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": product,
        "kubernetes.io/hostname": grant["host"],
    }
    # the service's mirror of the cluster's pods knows it as gpuslice's by this label
    assert pod["metadata"]["labels"]["gpuslice.dev/allocation-id"] == str(grant["id"])
    env = env_of(pod)
    assert env["GPUSLICE_ALLOCATION_ID"] == str(grant["id"])
    assert env["GPUSLICE_PROFILE_KIND"] == grant["kind"]
    # the device plugin, not gpuslice, decides which device the container sees
    assert "CUDA_VISIBLE_DEVICES" not in env


async def test_admin_resources_survive_and_the_previous_grant_does_not(make_spawner: Any):
    spawner = make_spawner(
        share_mode="hami",
        extra_resource_limits={"hugepages-2Mi": "1Gi", "nvidia.com/gpu": "4"},
        extra_resource_guarantees={"hugepages-2Mi": "1Gi"},
        node_selector={"cloud.example.com/pool": "gpu", "kubernetes.io/hostname": "stale"},
        mem_limit="8G",
    )
    first = await pod_for(spawner, MIG_GRANT)
    assert first["spec"]["containers"][0]["resources"]["limits"] == {
        "hugepages-2Mi": "1Gi",
        "memory": 8 * 1024**3,  # KubeSpawner turns "8G" into bytes
        "nvidia.com/mig-1g.18gb": "1",
    }
    # the same spawner object spawns again, now with a HAMi share on another node
    second = await pod_for(spawner, SHARE_GRANT)
    validate(second, "latest")
    resources = second["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {
        "hugepages-2Mi": "1Gi",
        "memory": 8 * 1024**3,  # KubeSpawner turns "8G" into bytes
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "10240",
        "nvidia.com/gpucores": "25",
    }
    assert resources["requests"]["nvidia.com/gpucores"] == "25"
    assert "nvidia.com/mig-1g.18gb" not in resources["requests"]
    assert second["spec"]["nodeSelector"] == {
        "cloud.example.com/pool": "gpu",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "kubernetes.io/hostname": "node2",
    }


async def test_server_pods_carry_the_kueue_queue_and_the_tolerations_nodes_are_judged_by(
    make_spawner: Any,
):
    mine = {"key": "example.com/notebooks", "operator": "Exists", "effect": "NoSchedule"}
    spawner = make_spawner(
        server_kueue_queue="interactive-gpu",
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        extra_labels={"team": "ml"},
    )
    spawner.tolerations = [mine]  # the admin's own, on KubeSpawner
    for grant in (MIG_GRANT, GPU_GRANT):  # one spawner object, two spawns
        pod = await pod_for(spawner, grant)
        validate(pod, "latest")
        labels = pod["metadata"]["labels"]
        # Kueue's quota counts the server's GPUs, so it admits no batch work onto them
        assert labels["kueue.x-k8s.io/queue-name"] == "interactive-gpu"
        assert labels["team"] == "ml"
        assert labels["gpuslice.dev/allocation-id"] == str(grant["id"])
        # the admin's toleration and the service's, once each spawn after spawn
        assert pod["spec"]["tolerations"] == [
            mine,
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        ]
    plain = await pod_for(make_spawner(), MIG_GRANT)
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]
    with pytest.raises(ValueError, match="not a valid label value"):
        make_spawner(server_kueue_queue="bad queue").apply_grant(MIG_GRANT)


async def test_resource_and_label_names_come_from_config(make_spawner: Any):
    spawner = make_spawner(
        mig_resource_prefix="example.com/mig-",
        gpu_product_label="",
        node_host_label="example.com/gpu-host",
    )
    pod = await pod_for(spawner, MIG_GRANT)
    validate(pod, "latest")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"example.com/mig-1g.18gb": "1"}
    assert pod["spec"]["nodeSelector"] == {"example.com/gpu-host": "node1"}


async def test_a_grant_the_cluster_cannot_express_is_refused(make_spawner: Any):
    spawner = make_spawner()
    grant = copy.deepcopy(MIG_GRANT)
    grant["assignments"][0]["mig_profile"] = "1g.18gb; rm -rf"
    with pytest.raises(ValueError, match="mig_profile"):
        spawner.apply_grant(grant)


def test_share_mode_is_checked_by_traitlets(make_spawner: Any):
    from traitlets import TraitError

    with pytest.raises(TraitError):
        make_spawner(share_mode="mps").kubernetes_resources()


def test_importing_the_package_needs_neither_kubespawner_nor_batchspawner():
    code = (
        "import sys, json, gpuslice_spawner; "
        "print(json.dumps([m for m in ('kubespawner', 'batchspawner') if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


async def test_pods_can_be_told_a_service_url_they_can_reach(make_spawner: Any):
    spawner = make_spawner(server_service_url="http://proxy-public/services/gpuslice/")
    env = env_of(await pod_for(spawner, MIG_GRANT))
    assert env["GPUSLICE_SERVICE_URL"] == "http://proxy-public/services/gpuslice/"


async def test_its_slices_are_never_overcommitted(make_spawner: Any):
    # the device plugin counts a share at its full size: the service must place it so
    sent: list[dict[str, Any]] = []

    async def allocate(_client: Any, **body: Any) -> dict[str, Any]:
        sent.append(body)
        return {"id": 1}

    with mock.patch.object(ServiceClient, "allocate", allocate):
        assert await make_spawner()._allocate("share-250") == {"id": 1}
        local = GPUSliceSpawner(user=SimpleNamespace(name="alice", groups=[]))
        await local._allocate("share-250")
    assert sent[0]["overcommit"] is False and sent[0]["profile"] == "share-250"
    assert "overcommit" not in sent[1]  # a local process: the service's own choice
    # and its spawn form counts them so
    asked: list[dict[str, Any]] = []

    async def request(_client: Any, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        asked.append({"path": path, **kw})
        return {"profiles": [], "simulated": False}

    kube = make_spawner()
    with mock.patch.object(ServiceClient, "request", request):
        await kube.get_options_form()
        await local.get_options_form()
    # (and how long a spawn from it waits for a batch job: what the form may offer)
    kube_wait, local_wait = f"{kube.preempt_wait():g}", f"{local.preempt_wait():g}"
    assert asked[0]["query"] == {"user": "alice", "overcommit": "false", "wait_seconds": kube_wait}
    assert asked[1]["query"] == {"user": "alice", "wait_seconds": local_wait}
