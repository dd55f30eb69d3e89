"""The ledger mirrors a Kubernetes cluster: its GPU nodes as the inventory
(``gpu_backend = "kubernetes"``) and the GPUs its other pods hold as external allocations
(``KubernetesClusterConfig.sync_interval``), so what the cluster hands out to work that
never came through gpuslice is never offered.

Inventory, one list of nodes at start (as GPU feature discovery and the NVIDIA device plugin
label and advertise them):

* the model: the node's ``nvidia.com/gpu.product`` label (GFD writes the NVML name with
  dashes for spaces); a model a profile names is given its NVML name back, any other keeps
  the label's spelling (the spawner selects nodes with the same label, so it still matches);
* the memory: ``nvidia.com/gpu.memory`` (MiB), else the model's name, else
  ``gpu_memory_mib``;
* the GPUs: what the node's ``allocatable`` says the scheduler can hand out (GFD's
  ``nvidia.com/gpu.count`` also counts GPUs the device plugin stopped advertising). MIG
  instances: the allocatable ``nvidia.com/mig-<profile>`` resources (the device plugin's
  *mixed* strategy; the *single* strategy is refused, its instances look like whole GPUs),
  on the fewest GPUs of the model that hold them (:mod:`.migpack`); whole GPUs: the
  allocatable ``nvidia.com/gpu`` and ``nvidia.com/gpu.shared``, divided by
  ``nvidia.com/gpu.replicas`` (shares of them are time-slices of whole GPUs).

Each pass, one list of nodes and one of pods (all namespaces, bound, not ended, in pages):

* holdings: each pod's GPU resources (the larger of its containers' sum and any init
  container) in the mirror's units (:data:`UNITS`: a whole GPU, a MIG instance of a
  profile, or milli-GPUs of time-sliced or HAMi shares); pods that carry gpuslice's labels
  (its servers' and its batch jobs') are left out, since the ledger records those itself;
* closed nodes: cordoned (``spec.unschedulable``), or with a NoSchedule / NoExecute taint
  that gpuslice's pods do not tolerate (``KubernetesResourcesConfig.tolerations``): the
  scheduler puts no new pod there, so the ledger offers nothing there
  (``Ledger.mirror_engine_out``) until the node opens again; what is held there stays held.

Tested against a stand-in API server answering in the API's shapes, with nodes labelled as
GFD labels them; no cluster runs here.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

from traitlets import Dict, Float, Unicode
from traitlets.config import Configurable

from gpuslice_spawner.launchers.kubernetes import (
    ALLOCATION_LABEL,
    BLOCKING_EFFECTS,
    KubernetesResources,
    kueue_queue_value,
    product_label_value,
    share_slices,
)
from gpuslice_spawner.launchers.slurm import SlurmGres

from .errors import ConfigError
from .jobs.backends.kubernetes import JOB_LABEL
from .kubeapi import list_all, run_sync
from .ledger import Ledger
from .migpack import pack_mig_exact
from .profiles import Profile
from .slurminventory import model_memory_mib
from .slurmusage import steady

KEY = "gpu_backend"
ENGINE = "Kubernetes"
# GPU feature discovery's node labels
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
# The mirror's units, in the ledger's external-holdings vocabulary: "gpu" a whole GPU (of
# any model), "gpu:<profile>" a MIG instance, "shard" one milli-GPU of a share
UNITS = SlurmGres(gpu="gpu", share="shard", shards_per_gpu=1000)
MEMORY_SETTING = "c.KubernetesClusterConfig.gpu_memory_mib"


class KubernetesClusterConfig(Configurable):
    """How the service reaches the Kubernetes cluster and what it reads of it."""

    api_url = Unicode(
        "",
        help="The Kubernetes API's URL, e.g. ``http://127.0.0.1:8001`` behind "
        "``kubectl proxy``. Empty: the service account's in a pod, else the kubeconfig. "
        "Used by job_backend = 'kubernetes', gpu_backend = 'kubernetes' and the mirror.",
    ).tag(config=True)

    sync_interval = Float(
        0.0,
        help="Seconds between reads of what the cluster's pods hold (one list of nodes and "
        "one of bound pods): GPUs, MIG instances and shares held by pods that did not come "
        "through gpuslice are held in the ledger as ``external`` allocations, so they are "
        "never offered, and released when the pods end. The service's hosts must be the "
        "node names (gpu_backend = 'kubernetes' reads them so). 0: off.",
    ).tag(config=True)

    gpu_memory_mib = Dict(
        {},
        help="Memory (MiB) of GPU models whose nodes have no ``nvidia.com/gpu.memory`` "
        "label and whose name does not say it, by model name, for gpu_backend = "
        "'kubernetes'.",
    ).tag(config=True)


def check_cluster_config(
    cluster: KubernetesClusterConfig, needed_by: str, configured: AbstractSet[str] = frozenset()
) -> None:
    """Refuse at start what would fail later: a negative interval, or Kubernetes asked for
    (``needed_by``: the setting that uses it, if any; or the mirror) without the client;
    and ``configured`` settings (the names set in the config) where no Kubernetes is used,
    which would do nothing."""
    key = "KubernetesClusterConfig.sync_interval"
    if cluster.sync_interval < 0:
        raise ConfigError(key, "must be >= 0 seconds (0: off)")
    unused = sorted(configured - {"sync_interval"})
    if unused and not needed_by and cluster.sync_interval == 0:
        raise ConfigError(
            f"KubernetesClusterConfig.{unused[0]}",
            "does nothing: no Kubernetes cluster is used (gpu_backend and job_backend are "
            "not 'kubernetes', and sync_interval is 0)",
        )
    if needed_by or cluster.sync_interval > 0:
        try:
            import kubernetes_asyncio  # noqa: F401
        except ImportError:
            raise ConfigError(
                needed_by or key,
                "needs the Kubernetes client: pip install 'gpuslice[kubernetes]'",
            ) from None
    for model, mib in cluster.gpu_memory_mib.items():
        if not isinstance(mib, int) or isinstance(mib, bool) or mib <= 0:
            raise ConfigError(
                "KubernetesClusterConfig.gpu_memory_mib", f"{model!r}: a positive MiB count"
            )


def check_kubernetes_units(
    res: KubernetesResources, profiles: Iterable[Profile], used: bool
) -> None:
    """Refuse at start what the cluster's units cannot hold (``used``: Kubernetes serves
    the slices: its inventory, its batch jobs or its servers' resource names are set): a
    share profile that is no whole number of the device plugin's time-slices (the pod asks
    for slices, the ledger charges milli-GPUs: a share-250 with 2 replicas would be placed
    four to a GPU that has two slices), and a server queue that is no label value."""
    if not used:
        return
    if res.server_queue:
        try:
            kueue_queue_value(res.server_queue)
        except ValueError as e:
            raise ConfigError("KubernetesResourcesConfig.server_kueue_queue", str(e)) from None
    if res.share_mode == "hami":
        return  # HAMi's shares are percentages of a GPU, not slices
    for i, profile in enumerate(profiles):
        if profile.kind != "share":
            continue
        try:
            share_slices(profile.gpu_milli, res.replicas)
        except ValueError as e:
            key = "KubernetesResourcesConfig.time_slicing_replicas"
            if res.replicas:
                key = f"profiles[{i}].gpu_milli"
            raise ConfigError(key, f"profile {profile.name}: {e}") from None


def cpu_milli(quantity: str) -> int:
    """A CPU quantity ("64", "63500m", "1.5") in milli-CPUs."""
    text = str(quantity).strip()
    if text.endswith("m"):
        return int(float(text[:-1]))
    return int(float(text) * 1000)


_SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}
_QUANTITY = re.compile(r"^([0-9.]+)([KMGT]i?|k)?$")


def memory_mib(quantity: str) -> int:
    """A memory quantity ("515Gi", "528000000Ki", "64G", bytes) in MiB, rounded down."""
    found = _QUANTITY.match(str(quantity).strip())
    if not found:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    number, suffix = found.groups()
    return int(float(number) * _SUFFIX.get(suffix or "", 1) // 2**20)


def _model(product: str, known: Iterable[str]) -> str:
    """The NVML name of GFD's product label, where a known model has that label value."""
    for model in known:
        try:
            if product_label_value(model) == product:
                return model
        except ValueError:
            continue
    return product


def hosts_from_nodes(
    nodes: list[Mapping[str, Any]],
    res: KubernetesResources,
    memory: Mapping[str, int],
    known_models: Iterable[str] = (),
) -> list[dict[str, Any]]:
    """The ``hosts`` of the static backend for the cluster's GPU nodes (the API's
    ``NodeList`` items); nodes without GPUs are left out."""
    known = list(known_models)
    hosts = []
    for node in sorted(nodes, key=lambda n: str(n.get("metadata", {}).get("name"))):
        meta = node.get("metadata") or {}
        name = str(meta.get("name") or "")
        labels: Mapping[str, str] = meta.get("labels") or {}
        allocatable: Mapping[str, str] = (node.get("status") or {}).get("allocatable") or {}
        mig = Counter(
            {
                key[len(res.mig_prefix) :]: int(value)
                for key, value in allocatable.items()
                if key.startswith(res.mig_prefix) and int(value) > 0
            }
        )
        # GPUs not in MIG mode, as the device plugin advertises them (in time-slices): what
        # the scheduler can hand out. GFD's nvidia.com/gpu.count also counts GPUs the
        # plugin no longer advertises (unhealthy ones): never offered
        advertised = int(allocatable.get(res.gpu, 0) or 0) + int(
            allocatable.get(res.shared_gpu, 0) or 0
        )
        if not advertised and not mig:
            continue  # no GPUs it can schedule
        if labels.get(MIG_STRATEGY_LABEL) == "single":
            raise ConfigError(
                KEY,
                f"node {name} uses the device plugin's 'single' MIG strategy: its MIG "
                "instances look like whole GPUs; use the 'mixed' strategy "
                "(nvidia.com/mig-<profile> resources)",
            )
        host_label = labels.get(res.host_label or "", name) if res.host_label else name
        if host_label != name:
            raise ConfigError(
                KEY,
                f"node {name}: its {res.host_label} label is {host_label!r}; servers are "
                "pinned by that label to the ledger's host, which is the node's name",
            )
        product = labels.get(res.product_label or "", "") if res.product_label else ""
        if not product:
            raise ConfigError(
                KEY,
                f"node {name} has GPUs but no {res.product_label or 'GPU product'} label "
                "(GPU feature discovery's): the ledger would not know their model",
            )
        model = _model(product, [*known, *memory])
        mib = int(labels.get(GPU_MEMORY_LABEL, 0) or 0) or model_memory_mib(
            model, memory, MEMORY_SETTING
        )
        replicas = _replicas(labels)
        if replicas > 1 and res.replicas and replicas != res.replicas:
            # a share's pod asks for slices by the setting: on this node they would be
            # another size than the ledger charges
            raise ConfigError(
                "KubernetesResourcesConfig.time_slicing_replicas",
                f"is {res.replicas}, but node {name} is labelled {GPU_REPLICAS_LABEL}="
                f"{replicas}: give every time-sliced node the same replicas",
            )
        try:
            # the fewest GPUs that hold the instances: the others are advertised whole
            gpus = pack_mig_exact(mig, model, mib) if mig else []
        except ValueError as e:
            raise ConfigError(
                KEY,
                f"node {name}: its {model} GPUs ({mib} MiB) cannot hold its MIG instances "
                f"({', '.join(f'{n} of {p}' for p, n in sorted(mig.items()))}): {e}",
            ) from None
        # a time-sliced GPU is advertised as its replicas; a part of them is no GPU
        whole = advertised // replicas
        if whole:
            gpus.insert(0, {"model": model, "memory_mib": mib, "count": whole})
        hosts.append(
            {
                "name": name,
                "cpu_milli": cpu_milli(allocatable.get("cpu", "0")),
                "memory_mib": memory_mib(allocatable.get("memory", "0")),
                "gpus": gpus,
            }
        )
    return hosts


def node_replicas(nodes: list[Mapping[str, Any]]) -> dict[str, int]:
    """Per node, how many time-slices each GPU is advertised as (GFD's replicas label)."""
    out = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        labels = meta.get("labels") or {}
        out[str(meta.get("name"))] = _replicas(labels)
    return out


def _replicas(labels: Mapping[str, str]) -> int:
    """How many time-slices each of a node's GPUs is advertised as (GFD's label)."""
    return max(1, int(labels.get(GPU_REPLICAS_LABEL, "1") or 1))


def tolerates(tolerations: Iterable[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of ``tolerations`` tolerates ``taint``, by Kubernetes' rules: the same
    effect (or none named), and the same key and value (``Equal``, the default) or the
    key alone (``Exists``; no key: every taint). A NoExecute toleration with
    ``tolerationSeconds`` evicts the pod in the end: not tolerated."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if taint.get("effect") == "NoExecute" and t.get("tolerationSeconds") is not None:
            continue
        if (t.get("operator") or "Equal") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def closed_reason(node: Mapping[str, Any], tolerations: Iterable[Mapping[str, Any]]) -> str:
    """Why the scheduler puts no new gpuslice pod on ``node`` (cordoned, a taint its pods
    do not tolerate), or "" when it may."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return f"cordoned in {ENGINE}"
    allowed = list(tolerations)
    for taint in spec.get("taints") or []:
        if taint.get("effect") in BLOCKING_EFFECTS and not tolerates(allowed, taint):
            value = f"={taint['value']}" if taint.get("value") else ""
            return f"tainted {taint.get('key')}{value}:{taint.get('effect')} in {ENGINE}"
    return ""


def closed_nodes(
    nodes: Iterable[Mapping[str, Any]], tolerations: Iterable[Mapping[str, Any]]
) -> dict[str, str]:
    """The nodes no new gpuslice pod can land on, and why (:func:`closed_reason`)."""
    allowed = list(tolerations)
    out = {}
    for node in nodes:
        why = closed_reason(node, allowed)
        if why:
            out[str((node.get("metadata") or {}).get("name"))] = why
    return out


def is_recorded(pod: Mapping[str, Any], jobs: Collection[str]) -> bool:
    """Whether the ledger records ``pod`` itself: a server's (the spawner's
    :data:`ALLOCATION_LABEL`), or a batch job's whose Job is one of ``jobs`` (the pass
    records those; the pod of an unrecorded job, or of one already over, is held here)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    if ALLOCATION_LABEL in labels:
        return True
    return labels.get(JOB_LABEL[0]) == JOB_LABEL[1] and labels.get("job-name") in jobs


def pod_limits(pod: Mapping[str, Any]) -> Counter[str]:
    """What a pod holds of each extended resource: its containers' sum, or the largest init
    container's where that is more (the scheduler's rule for a pod's request)."""
    spec = pod.get("spec") or {}

    def limits(container: Mapping[str, Any]) -> Counter[str]:
        found = (container.get("resources") or {}).get("limits") or {}
        return Counter({k: int(v) for k, v in found.items() if str(v).isdigit()})

    total: Counter[str] = Counter()
    for container in spec.get("containers") or []:
        total.update(limits(container))
    for container in spec.get("initContainers") or []:
        total |= limits(container)  # the larger of each
    return total


def held_by_pods(
    pods: Iterable[Mapping[str, Any]],
    res: KubernetesResources,
    replicas: Mapping[str, int],
    jobs: Collection[str] = (),
) -> dict[str, Counter[str]]:
    """Per node, what the pods the ledger does not record hold, in :data:`UNITS`
    (``jobs``: the batch Jobs the job pass records, :func:`is_recorded`)."""
    held: dict[str, Counter[str]] = {}
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase not in ("Pending", "Running") or is_recorded(pod, jobs):
            continue
        limits = pod_limits(pod)
        units: Counter[str] = Counter()
        for key, n in limits.items():
            if key.startswith(res.mig_prefix):
                units[f"{UNITS.gpu}:{key[len(res.mig_prefix) :]}"] += n
        slices = replicas.get(node, 1)
        if res.share_mode == "hami" and limits.get(res.hami_cores):
            # a HAMi share: each device a percentage of a GPU
            units[UNITS.share] += limits.get(res.gpu, 1) * min(100, limits[res.hami_cores]) * 10
        elif limits.get(res.gpu):
            if slices > 1:  # a time-sliced node: each is one slice of a GPU
                units[UNITS.share] += math.ceil(limits[res.gpu] * 1000 / slices)
            else:
                units[UNITS.gpu] += limits[res.gpu]
        if limits.get(res.shared_gpu):
            units[UNITS.share] += math.ceil(limits[res.shared_gpu] * 1000 / slices)
        if units:
            held.setdefault(node, Counter()).update(units)
    return held


# -- the API --------------------------------------------------------------------------------


async def read_nodes(configuration: Any) -> list[Any]:
    return await list_all(configuration, "CoreV1Api", "list_node")


@dataclass(frozen=True)
class ClusterRead:
    """One pass's read: what the pods the ledger does not record hold, per node
    (:func:`held_by_pods`), and the nodes closed to new pods (:func:`closed_nodes`)."""

    held: dict[str, Counter[str]]
    closed: dict[str, str] = field(default_factory=dict)


async def read_held(
    configuration: Any, res: KubernetesResources, jobs: Collection[str] = ()
) -> dict[str, Counter[str]]:
    """What the pods the ledger does not record hold, per node (:func:`read_cluster`)."""
    return (await read_cluster(configuration, res, jobs)).held


async def read_cluster(
    configuration: Any, res: KubernetesResources, jobs: Collection[str] = ()
) -> ClusterRead:
    """One list of nodes, one of pods (``jobs``: :func:`held_by_pods`)."""
    nodes, pods = await asyncio.gather(
        read_nodes(configuration),
        list_all(
            configuration,
            "CoreV1Api",
            "list_pod_for_all_namespaces",
            # bound to a node and not ended: what holds devices now
            field_selector="spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed",
        ),
    )
    return ClusterRead(
        held_by_pods(pods, res, node_replicas(nodes), jobs), closed_nodes(nodes, res.tolerations)
    )


def read_cluster_hosts(
    configuration: Any, res: KubernetesResources, memory: Mapping[str, int], known: Iterable[str]
) -> list[dict[str, Any]]:
    """The cluster's GPU nodes as hosts (at start)."""
    try:
        nodes = run_sync(read_nodes(configuration))
    except Exception as e:  # unreachable, forbidden, ...
        raise ConfigError(KEY, f"the Kubernetes nodes could not be read: {e}") from None
    hosts = hosts_from_nodes(nodes, res, memory, known)
    if not hosts:
        raise ConfigError(KEY, "no Kubernetes node has GPUs (nvidia.com/gpu.count or MIG)")
    return hosts


async def run_kubernetes_sync(
    ledger: Ledger,
    interval: float,
    read: Callable[[], Any],
    log: logging.Logger,
    on_synced: Callable[[], None] = lambda: None,
) -> None:
    """Keep the ledger's external holdings equal to what the cluster's other pods hold,
    and its record of the nodes closed to new pods. ``read``: a coroutine function
    returning :func:`read_cluster`'s answer. A pod's holding is kept once two reads agree
    on it; a node's closing and opening are followed at once (an admin's cordon is no
    flicker, and nothing may be granted there meanwhile); a failed read changes nothing."""
    before: dict[str, Counter[str]] | None = None
    reported: set[str] = set()
    while True:
        try:
            found = await read()
            now = dict(found.held)
            held = now if before is None else steady(before, now)
            added, released, problems = await asyncio.to_thread(
                ledger.sync_external, held, UNITS, engine=ENGINE, all_by_id=True
            )
            before = now
            if added or released:
                log.info(
                    "Kubernetes: %d holding(s) outside gpuslice added, %d released",
                    added,
                    released,
                )
            # nothing is offered on a node closed to new pods; its holders keep theirs
            for change in await asyncio.to_thread(ledger.mirror_engine_out, found.closed, ENGINE):
                log.info("Kubernetes: %s", change)
            on_synced()
            for problem in problems:
                if problem not in reported:  # once, not every few seconds
                    log.warning("%s: check the nodes against the service's hosts", problem)
            reported = set(problems)
        except Exception as e:
            log.warning("the Kubernetes pods could not be mirrored (%s); kept as they were", e)
        await asyncio.sleep(interval)
