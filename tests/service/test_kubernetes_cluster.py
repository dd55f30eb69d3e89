"""The ledger mirrors a Kubernetes cluster: ``gpu_backend = "kubernetes"`` reads the hosts
from the nodes (allocatable resources and GPU feature discovery's labels), and the mirror
holds what the cluster's other pods hold, so it is never offered.

Units on nodes and pods in the API's shapes, labelled as GFD and the NVIDIA device plugin
(mixed MIG strategy, time-slicing) label them, and the same through real HTTP against the
stand-in API server (``tests/jobs/fake_kube_api.py``), paged as the API pages. No cluster
runs here.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from gpuslice.gpu import discover
from gpuslice_hub.errors import ConfigError, Refused
from gpuslice_hub.kubecluster import (
    closed_nodes,
    cpu_milli,
    held_by_pods,
    hosts_from_nodes,
    memory_mib,
    read_cluster,
    read_held,
    run_kubernetes_sync,
    tolerates,
)
from gpuslice_hub.profiles import parse_profiles
from gpuslice_spawner.launchers.kubernetes import KubernetesResources
from tests.harness.engines import need_module
from tests.jobs.fake_kube_api import FakeCluster, start_fake_api
from tests.service.conftest import build_ledger

A100 = "NVIDIA A100-SXM4-80GB"
RES = KubernetesResources()
JOB = {"app.kubernetes.io/name": "gpuslice-job"}


def node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    """A Node as the API returns it (the fields the inventory reads, and some it does not)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", **labels},
        },
        "status": {
            "capacity": dict(allocatable),
            "allocatable": {"cpu": "63500m", "memory": "528273516Ki", "pods": "110", **allocatable},
        },
    }


NODES = [
    # eight A100s, two of them in MIG mode (mixed strategy): two 3g.40gb and seven 1g.10gb
    node(
        "gpu-a",
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81920",
            "nvidia.com/mig.strategy": "mixed",
        },
        {"nvidia.com/gpu": "6", "nvidia.com/mig-3g.40gb": "2", "nvidia.com/mig-1g.10gb": "7"},
    ),
    # four time-sliced A100-40GB, four slices each (renameByDefault: gpu.shared)
    node(
        "gpu-b",
        {
            "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
            "nvidia.com/gpu.count": "4",
            "nvidia.com/gpu.replicas": "4",
            "nvidia.com/gpu.memory": "40960",
        },
        {"nvidia.com/gpu.shared": "16"},
    ),
    node("cpu-1", {}, {}),  # no GPUs: not a host of the ledger
]


def test_nodes_become_hosts_with_their_models_mig_instances_and_whole_gpus():
    hosts = hosts_from_nodes(NODES, RES, {}, known_models=[A100])
    assert [h["name"] for h in hosts] == ["gpu-a", "gpu-b"]
    a100 = {"model": A100, "memory_mib": 81920}  # the profiles' NVML name for the label
    assert hosts[0] == {
        "name": "gpu-a",
        "cpu_milli": 63500,
        "memory_mib": 528273516 // 1024,
        "gpus": [
            {**a100, "count": 6},
            {**a100, "mig": ["3g.40gb", "3g.40gb"]},
            {**a100, "mig": ["1g.10gb"] * 7},
        ],
    }
    # a model no profile names keeps GFD's spelling (the spawner selects with the same label)
    assert hosts[1]["gpus"] == [{"model": "NVIDIA-A100-SXM4-40GB", "memory_mib": 40960, "count": 4}]
    inventory = discover("static", hosts)  # what the static backend makes of it
    instances = [m.profile for g in inventory.hosts[0].gpus for m in g.mig_instances]
    assert sorted(instances) == ["1g.10gb"] * 7 + ["3g.40gb"] * 2
    assert len(inventory.hosts[1].gpus) == 4


def test_quantities_are_read_as_the_api_writes_them():
    assert [cpu_milli(q) for q in ("64", "63500m", "1.5")] == [64000, 63500, 1500]
    assert memory_mib("515Gi") == 515 * 1024
    assert memory_mib("1048576Ki") == 1024
    assert memory_mib("64G") == 64 * 10**9 // 2**20
    assert memory_mib("1073741824") == 1024
    with pytest.raises(ValueError, match="not a memory quantity"):
        memory_mib("lots")


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"labels": {"nvidia.com/mig.strategy": "single"}}, "'single' MIG strategy"),
        ({"drop": "nvidia.com/gpu.product"}, "no nvidia.com/gpu.product label"),
        ({"labels": {"kubernetes.io/hostname": "other"}}, "its kubernetes.io/hostname label"),
    ],
)
def test_nodes_the_ledger_could_not_describe_are_refused_naming_the_node(change, words):
    bad = node(
        "gpu-a", dict(NODES[0]["metadata"]["labels"]), dict(NODES[0]["status"]["allocatable"])
    )
    bad["metadata"]["labels"].update(change.get("labels", {}))
    bad["metadata"]["labels"].pop(change.get("drop", ""), None)
    with pytest.raises(ConfigError) as e:
        hosts_from_nodes([bad], RES, {})
    assert e.value.key == "gpu_backend" and "gpu-a" in str(e.value) and words in str(e.value)


def test_a_models_memory_comes_from_its_label_its_name_or_the_setting():
    labels = {"nvidia.com/gpu.product": "Tesla-T4", "nvidia.com/gpu.count": "1"}
    t4 = node("t4", labels, {"nvidia.com/gpu": "1"})
    with pytest.raises(ConfigError, match=r"KubernetesClusterConfig\.gpu_memory_mib"):
        hosts_from_nodes([t4], RES, {})
    (host,) = hosts_from_nodes([t4], RES, {"Tesla-T4": 15360})
    assert host["gpus"] == [{"model": "Tesla-T4", "memory_mib": 15360, "count": 1}]


def pod(
    name: str,
    node_name: str,
    limits: dict[str, str],
    labels: dict[str, str] | None = None,
    phase: str = "Running",
    init: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node_name,
        "containers": [{"name": "c", "image": "i", "resources": {"limits": limits}}],
    }
    if init:
        spec["initContainers"] = [{"name": "init", "image": "i", "resources": {"limits": init}}]
    return {
        "metadata": {"name": name, "namespace": "team", "labels": labels or {}},
        "spec": spec,
        "status": {"phase": phase},
    }


def test_the_pods_that_are_not_gpuslices_hold_whole_gpus_instances_and_slices():
    pods = [
        pod("train", "gpu-a", {"nvidia.com/gpu": "2", "cpu": "8"}),
        pod("eval", "gpu-a", {"nvidia.com/mig-1g.10gb": "1"}, init={"nvidia.com/mig-1g.10gb": "2"}),
        pod("viz", "gpu-b", {"nvidia.com/gpu.shared": "1"}),  # one of four slices
        pod("done", "gpu-a", {"nvidia.com/gpu": "1"}, phase="Succeeded"),
        # what the ledger records itself: a server (its allocation's label) and a batch job
        # the job pass records (its Job is one of those)
        pod("jupyter-ann", "gpu-a", {"nvidia.com/gpu": "1"}, {"gpuslice.dev/allocation-id": "3"}),
        pod("job", "gpu-a", {"nvidia.com/gpu": "1"}, {**JOB, "job-name": "gpuslice-job-1-ab"}),
        # a batch job the ledger could not record (or one already over): held here
        pod("lost", "gpu-b", {"nvidia.com/gpu.shared": "2"}, {**JOB, "job-name": "gpuslice-job-2"}),
    ]
    held = held_by_pods(pods, RES, {"gpu-a": 1, "gpu-b": 4}, jobs={"gpuslice-job-1-ab"})
    assert held == {
        "gpu-a": Counter({"gpu": 2, "gpu:1g.10gb": 2}),  # an init container's larger ask
        "gpu-b": Counter({"shard": 750}),  # milli-GPUs: three quarters of a GPU
    }
    hami = KubernetesResources(share_mode="hami")
    share = pod("s", "gpu-a", {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"})
    assert held_by_pods([share], hami, {}) == {"gpu-a": Counter({"shard": 300})}


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    need_module("kubernetes_asyncio")
    fake, stop = start_fake_api(FakeCluster(nodes=list(NODES)))
    yield fake
    stop()


def test_a_foreign_pod_is_never_offered_and_its_gpu_comes_back_when_it_ends(tmp_path, cluster):
    from gpuslice_hub.kubeapi import api_configuration

    hosts = hosts_from_nodes(NODES, RES, {}, known_models=[A100])
    profiles = [{"name": "mig-1g", "kind": "mig", "mig_profile": "1g.10gb"}]
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=profiles, hosts=hosts)
    configuration = api_configuration(cluster.url)
    # 600 pods of other teams (more than one page of the API's), one holding instances
    for i in range(600):
        cluster.foreign_pod("team", f"web-{i}", "cpu-1", {"cpu": "1"})
    cluster.foreign_pod("team", "eval", "gpu-a", {"nvidia.com/mig-1g.10gb": "3"})
    cluster.foreign_pod("team", "queued", "", {"nvidia.com/mig-1g.10gb": "1"}, phase="Pending")
    before = len(cluster.requests)
    held = asyncio.run(read_held(configuration, RES))
    assert held == {"gpu-a": Counter({"gpu:1g.10gb": 3})}
    pages = [r for r in cluster.requests[before:] if r["path"] == "/api/v1/pods"]
    assert len(pages) == 2 and pages[0]["query"]["limit"] == "500"
    assert pages[0]["query"]["fieldSelector"] == (
        "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
    )

    async def mirror() -> None:
        task = asyncio.ensure_future(
            run_kubernetes_sync(
                ledger, 0.05, lambda: read_cluster(configuration, RES), logging.getLogger("t")
            )
        )
        try:
            # held once two reads agree: 7 instances, 3 held by the pod
            await until(lambda: ledger.profile_capacity()["mig-1g"][0] == 4)
            external = [a for a in ledger.allocations() if a["purpose"] == "external"]
            assert [(a["profile"], a["host"]) for a in external] == [
                ("kubernetes:gpu:1g.10gb", "gpu-a")
            ] * 3
            # no one can release it but the cluster
            with pytest.raises(Refused, match="held by Kubernetes pods outside gpuslice"):
                ledger.release(external[0]["id"], "admin", "tidy up")
            del cluster.pods["eval"]  # the pod ended
            await until(lambda: ledger.profile_capacity()["mig-1g"][0] == 7)
        finally:
            task.cancel()

    asyncio.run(mirror())
    events = [e for e in ledger.events() if str(e["profile"]).startswith("kubernetes:")]
    assert {e["kind"] for e in events} == {"allocated", "released"}
    assert all(e["actor"] == "kubernetes" for e in events)


async def until(check: Any, timeout: float = 20) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, "not within the deadline"
        await asyncio.sleep(0.05)


def test_the_service_reads_its_hosts_from_the_cluster_and_refuses_hand_written_ones(cluster):
    from traitlets.config import Config

    from gpuslice_hub.app import GPUSliceService

    config = Config()
    config.GPUSliceService.gpu_backend = "kubernetes"
    config.GPUSliceService.profiles = [
        {"name": "whole", "kind": "gpu", "count": 1, "models": [A100]}
    ]
    config.KubernetesClusterConfig.api_url = cluster.url
    service = GPUSliceService(config=config)
    # read at start (load_settings); the NVML names of the models come from them
    service.parsed_profiles = parse_profiles(config.GPUSliceService.profiles)
    inventory = service.discover()
    assert inventory.backend == "kubernetes"  # named for where it came from
    assert [h.name for h in inventory.hosts] == ["gpu-a", "gpu-b"]
    assert {g.model for g in inventory.hosts[0].gpus} == {A100}
    config.GPUSliceService.hosts = hosts_from_nodes(NODES, RES, {})
    with pytest.raises(ConfigError) as e:
        GPUSliceService(config=config).discover()
    assert e.value.key == "hosts" and "read from the cluster" in str(e.value)


@pytest.mark.parametrize(
    ("settings", "key"),
    [
        ({"sync_interval": -1.0}, "KubernetesClusterConfig.sync_interval"),
        ({"gpu_memory_mib": {"Tesla-T4": "16GB"}}, "KubernetesClusterConfig.gpu_memory_mib"),
    ],
)
def test_cluster_settings_that_would_fail_later_are_refused_at_start(
    settings, key, monkeypatch, tmp_path
):
    from traitlets.config import Config

    from gpuslice_hub.app import GPUSliceService

    config = Config()
    config.GPUSliceService.profiles = [{"name": "whole", "kind": "gpu", "count": 1}]
    for name, value in settings.items():
        setattr(config.KubernetesClusterConfig, name, value)
    monkeypatch.chdir(tmp_path)  # no gpuslice_config.py to read
    service = GPUSliceService(config=config)
    with pytest.raises(ConfigError) as e:
        service.load_settings()
    assert e.value.key == key


def test_without_gfds_count_label_the_whole_gpus_are_what_the_device_plugin_advertises():
    # mixed strategy: nvidia.com/gpu counts only the GPUs not in MIG mode
    labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
    plain = node("gpu-c", labels, {"nvidia.com/gpu": "3", "nvidia.com/mig-3g.40gb": "2"})
    sliced = node(
        "gpu-d", {**labels, "nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu.shared": "8"}
    )
    hosts = hosts_from_nodes([plain, sliced], RES, {}, known_models=[A100])
    a100 = {"model": A100, "memory_mib": 81920}
    assert hosts[0]["gpus"] == [{**a100, "count": 3}, {**a100, "mig": ["3g.40gb", "3g.40gb"]}]
    assert hosts[1]["gpus"] == [{**a100, "count": 2}]  # eight slices of two GPUs


@pytest.mark.parametrize(
    ("setting", "key"),
    [
        ("c.KubernetesClusterConfig.sync_interval = 30", "KubernetesClusterConfig.sync_interval"),
        ('c.GPUSliceService.gpu_backend = "kubernetes"', "gpu_backend"),
    ],
)
def test_no_way_to_reach_the_api_stops_the_service_with_one_line_naming_the_setting(
    tmp_path, setting, key
):
    """Not in a pod, no api_url, no kubeconfig: a config error at start, not a traceback
    (and nothing listening, no ledger written)."""
    import os
    import subprocess
    import sys

    from tests.harness.hub import SIM_HOSTS, SIM_PROFILES

    need_module("kubernetes_asyncio")
    config = tmp_path / "gpuslice_config.py"
    hosts = f'c.GPUSliceService.gpu_backend = "simulated"\nc.GPUSliceService.hosts = {SIM_HOSTS!r}'
    config.write_text(
        f'c.GPUSliceService.db_url = "sqlite:///{tmp_path}/ledger.sqlite"\n'
        + ("" if key == "gpu_backend" else hosts + "\n")
        + f"c.GPUSliceService.profiles = {SIM_PROFILES!r}\n"
        'c.GPUSliceService.ip = "127.0.0.1"\nc.GPUSliceService.port = 1\n'
        # (share-250 is one of four time-slices: the units are fine, the API is not)
        "c.KubernetesResourcesConfig.time_slicing_replicas = 4\n"
        f"{setting}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
    env["KUBECONFIG"] = str(tmp_path / "no-such-kubeconfig")
    out = subprocess.run(
        [sys.executable, "-m", "gpuslice_hub.app", "--config", str(config)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert f"gpuslice: invalid configuration: {key}" in out.stderr, out.stderr[-3000:]
    assert "the Kubernetes API cannot be reached" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "ledger.sqlite").exists()


# -- what the scheduler can hand out: allocatable, exact MIG, closed nodes (issue 46) -------

A100_LABELS = {
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    "nvidia.com/gpu.memory": "81920",
    "nvidia.com/mig.strategy": "mixed",
}


def test_whole_gpus_are_what_the_node_can_hand_out_not_gfds_count():
    # GFD counts four GPUs; the device plugin advertises three (one went unhealthy): a
    # fourth granted would wait Pending for ever
    sick = node("gpu-c", {**A100_LABELS, "nvidia.com/gpu.count": "4"}, {"nvidia.com/gpu": "3"})
    (host,) = hosts_from_nodes([sick], RES, {}, known_models=[A100])
    assert host["gpus"] == [{"model": A100, "memory_mib": 81920, "count": 3}]
    # a time-sliced node: its slices, divided by the replicas; a node advertising nothing
    # (its device plugin down) has nothing to offer
    sliced = node(
        "gpu-d",
        {**A100_LABELS, "nvidia.com/gpu.count": "4", "nvidia.com/gpu.replicas": "4"},
        {"nvidia.com/gpu.shared": "12"},
    )
    down = node("gpu-e", {**A100_LABELS, "nvidia.com/gpu.count": "8"}, {"nvidia.com/gpu": "0"})
    hosts = hosts_from_nodes([sliced, down], RES, {}, known_models=[A100])
    assert [(h["name"], h["gpus"][0]["count"]) for h in hosts] == [("gpu-d", 3)]


def test_a_mixed_mig_node_is_rebuilt_with_as_many_gpus_as_it_has():
    # four A100s, two split 3g.40gb + 2g.20gb + 1g.10gb + 1g.10gb (mixed strategy): the
    # device plugin advertises the instances and the two whole GPUs
    mixed = node(
        "gpu-m",
        {**A100_LABELS, "nvidia.com/gpu.count": "4"},
        {
            "nvidia.com/gpu": "2",
            "nvidia.com/mig-3g.40gb": "2",
            "nvidia.com/mig-2g.20gb": "2",
            "nvidia.com/mig-1g.10gb": "4",
        },
    )
    (host,) = hosts_from_nodes([mixed], RES, {}, known_models=[A100])
    whole = [g["count"] for g in host["gpus"] if "count" in g]
    layouts = [g["mig"] for g in host["gpus"] if "mig" in g]
    assert whole == [2] and len(layouts) == 2, host["gpus"]  # four GPUs, as the node has
    assert sorted(p for layout in layouts for p in layout) == sorted(
        ["3g.40gb"] * 2 + ["2g.20gb"] * 2 + ["1g.10gb"] * 4
    )
    for layout in layouts:  # each a GPU that holds them: 7 compute slices, 80 GB
        sizes = [tuple(int(x) for x in p.replace("g.", " ").rstrip("gb").split()) for p in layout]
        assert sum(s for s, _ in sizes) <= 7 and sum(g for _, g in sizes) <= 80, layout
    inventory = discover("static", [host])
    assert len(inventory.hosts[0].gpus) == 4
    assert sum(len(g.mig_instances) for g in inventory.hosts[0].gpus) == 8


def test_mig_instances_no_gpu_of_the_model_can_hold_are_refused_naming_the_node():
    big = node("gpu-s", {**A100_LABELS, "nvidia.com/gpu.memory": "40960"}, {})
    big["status"]["allocatable"]["nvidia.com/mig-7g.80gb"] = "1"
    with pytest.raises(ConfigError) as e:
        hosts_from_nodes([big], RES, {})
    assert e.value.key == "gpu_backend" and "gpu-s" in str(e.value)
    assert "cannot hold its MIG instances" in str(e.value)


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"unschedulable": True}, "cordoned in Kubernetes"),
        (
            {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
            "tainted dedicated=ml:NoSchedule in Kubernetes",
        ),
        (
            {"taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}]},
            "tainted node.kubernetes.io/unreachable:NoExecute in Kubernetes",
        ),
        # what gpuslice's pods tolerate (the default: the GPU nodes' own taint), and a taint
        # that only discourages a pod, keep the node open
        ({"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]}, ""),
        ({"taints": [{"key": "dedicated", "effect": "PreferNoSchedule"}]}, ""),
        ({}, ""),
    ],
)
def test_a_node_is_closed_when_cordoned_or_tainted_against_gpuslices_pods(spec, why):
    closed = node("gpu-a", {}, {})
    closed["spec"] = spec
    assert closed_nodes([closed], RES.tolerations) == ({"gpu-a": why} if why else {})


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "ml"}, True),  # Equal, every effect
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # no key: every taint
        ({"key": "dedicated", "value": "other"}, False),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations_are_matched_as_kubernetes_matches_them(toleration, tolerated):
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    assert tolerates([toleration], taint) is tolerated
    # a NoExecute toleration for a while evicts the pod in the end
    evicting = {"key": "x", "effect": "NoExecute"}
    assert not tolerates([{"key": "x", "operator": "Exists", "tolerationSeconds": 60}], evicting)


def test_cordoned_and_tainted_nodes_are_offered_nothing_every_pass(tmp_path, cluster):
    """Through the stand-in API server: the mirror's pass reads the nodes' state, and the
    ledger offers nothing on a node the scheduler puts no new pod on, until it opens."""
    from gpuslice_hub.kubeapi import api_configuration

    hosts = hosts_from_nodes(NODES, RES, {}, known_models=[A100])
    profiles = [
        {"name": "mig-1g", "kind": "mig", "mig_profile": "1g.10gb"},
        {"name": "whole", "kind": "gpu", "count": 1},
    ]
    ledger = build_ledger(f"sqlite:///{tmp_path}/l.sqlite", profiles=profiles, hosts=hosts)
    configuration = api_configuration(cluster.url)
    gpu_a, gpu_b = cluster.nodes[0], cluster.nodes[1]
    assert ledger.profile_capacity()["mig-1g"] == (7, 7)
    assert ledger.profile_capacity()["whole"] == (10, 10)  # six on gpu-a, four on gpu-b

    def free() -> tuple[int, int]:
        capacity = ledger.profile_capacity()
        return capacity["mig-1g"][0], capacity["whole"][0]

    async def mirror() -> None:
        task = asyncio.ensure_future(
            run_kubernetes_sync(
                ledger, 0.05, lambda: read_cluster(configuration, RES), logging.getLogger("t")
            )
        )
        try:
            # kubectl cordon gpu-a; gpu-b carries the GPU nodes' taint, which gpuslice's
            # pods tolerate, and one that only discourages pods
            gpu_a["spec"] = {"unschedulable": True}
            gpu_b["spec"] = {
                "taints": [
                    {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"},
                    {"key": "spot", "effect": "PreferNoSchedule"},
                ]
            }
            await until(lambda: free() == (0, 4))
            # a taint gpuslice's pods do not tolerate closes gpu-b too
            gpu_b["spec"]["taints"].append(
                {"key": "team", "value": "vision", "effect": "NoExecute"}
            )
            await until(lambda: free() == (0, 0))
            (entry,) = [e for e in ledger.availability("ann", []) if e["name"] == "mig-1g"]
            assert "cordoned in Kubernetes" in str(entry), entry  # says why
            # kubectl uncordon gpu-a, the taint removed: offered again
            gpu_a["spec"] = {}
            gpu_b["spec"]["taints"].pop()
            await until(lambda: free() == (7, 10))
        finally:
            task.cancel()

    asyncio.run(mirror())


def service_with(tmp_path, monkeypatch, profiles, **resources):
    from traitlets.config import Config

    from gpuslice_hub.app import GPUSliceService

    config = Config()
    config.GPUSliceService.profiles = profiles
    for name, value in resources.items():
        setattr(config.KubernetesResourcesConfig, name, value)
    monkeypatch.chdir(tmp_path)  # no gpuslice_config.py to read
    return GPUSliceService(config=config)


QUARTER = {"name": "share-250", "kind": "share", "gpu_milli": 250}
HALF = {"name": "share-500", "kind": "share", "gpu_milli": 500}
WHOLE = {"name": "gpu-1", "kind": "gpu", "count": 1}


def test_a_share_that_is_no_whole_number_of_time_slices_is_refused_at_start(tmp_path, monkeypatch):
    # the device plugin makes two slices of a GPU: a quarter is half of one, and the ledger
    # would place four where the plugin has two
    service = service_with(tmp_path, monkeypatch, [WHOLE, QUARTER], time_slicing_replicas=2)
    with pytest.raises(ConfigError) as e:
        service.load_settings()
    assert e.value.key == "profiles[1].gpu_milli"
    assert "profile share-250" in str(e.value) and "nearest valid gpu_milli 500" in str(e.value)
    # a half is one of the two: served (its pod asks for one gpu.shared)
    service_with(tmp_path, monkeypatch, [WHOLE, HALF], time_slicing_replicas=2).load_settings()
    # replicas not said: no share can be served by time-slicing
    service = service_with(tmp_path, monkeypatch, [HALF], share_mode="time-slicing")
    with pytest.raises(ConfigError) as e:
        service.load_settings()
    assert e.value.key == "KubernetesResourcesConfig.time_slicing_replicas"
    assert "profile share-500" in str(e.value)
    # HAMi's shares are percentages, not slices
    service_with(tmp_path, monkeypatch, [QUARTER], share_mode="hami").load_settings()
    # and a server queue that no label can hold
    service = service_with(tmp_path, monkeypatch, [WHOLE], server_kueue_queue="interactive gpu")
    with pytest.raises(ConfigError) as e:
        service.load_settings()
    assert e.value.key == "KubernetesResourcesConfig.server_kueue_queue"


def test_a_time_sliced_node_with_other_replicas_than_the_setting_is_refused():
    labels = {**A100_LABELS, "nvidia.com/gpu.replicas": "4"}
    sliced = node("gpu-t", labels, {"nvidia.com/gpu.shared": "16"})
    (host,) = hosts_from_nodes([sliced], KubernetesResources(replicas=4), {}, [A100])
    assert host["gpus"] == [{"model": A100, "memory_mib": 81920, "count": 4}]
    with pytest.raises(ConfigError) as e:
        hosts_from_nodes([sliced], KubernetesResources(replicas=2), {}, [A100])
    assert e.value.key == "KubernetesResourcesConfig.time_slicing_replicas"
    assert "gpu-t" in str(e.value) and "nvidia.com/gpu.replicas=4" in str(e.value)
