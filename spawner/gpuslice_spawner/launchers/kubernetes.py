"""Turn a gpuslice grant into KubeSpawner settings (pure; no cluster needed).

A grant is what the gpuslice service returns for an allocation::

    {"id": 17, "profile": "mig-1g.18gb", "kind": "mig", "host": "node1",
     "assignments": [{"gpu_uuid": "GPU-…", "gpu_model": "NVIDIA H100 80GB HBM3",
                      "milli": 142, "memory_mib": 18432,
                      "mig_uuid": "MIG-…", "mig_profile": "1g.18gb"}]}

Kubernetes cannot be told *which* MIG instance or GPU to use -- the device plugin picks
one of the kind asked for on the node. So the pod asks for the same *kind and amount*
the service granted, on the host the service placed it on (so the service's per-host
ledger stays true), and the device plugin does the rest.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from gpuslice.gpu.profiles import parse_mig_profile

ShareMode = Literal["time-slicing-renamed", "time-slicing", "hami"]

# The label on a server's pod naming the ledger's allocation it holds: the service's mirror of
# the cluster's pods leaves such pods out (the ledger records them itself).
ALLOCATION_LABEL = "gpuslice.dev/allocation-id"
# Kueue's label naming a pod's LocalQueue (its pod integration admits labelled pods)
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# Taint effects that keep a new pod off a node (PreferNoSchedule only discourages it)
BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
# GPU nodes are commonly tainted so that only GPU pods land there (GKE and AKS GPU pools,
# the GPU operator's guides); every gpuslice pod is a GPU pod, so it tolerates that taint
DEFAULT_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
)
# Kubernetes label values: at most 63 characters, alphanumerics at both ends.
_LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?")
# MIG profile names as NVML prints them (1g.10gb, 1g.18gb+me, 7g.80gb); they become part
# of a resource name, which the API server would reject with a less helpful message.


def _is_mig_profile(name: str) -> bool:
    try:
        parse_mig_profile(name)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class KubernetesResources:
    """Resource and label names of the GPU stack on the cluster.

    Defaults match the NVIDIA device plugin with the *mixed* MIG strategy and GPU
    feature discovery; ``share_mode`` says how the cluster offers fractional GPUs:

    * ``time-slicing-renamed``: device plugin time-slicing with ``renameByDefault``,
      shares are advertised as ``nvidia.com/gpu.shared`` -- no memory or compute cap.
    * ``time-slicing``: time-slicing without renaming, a share is one ``nvidia.com/gpu``
      replica -- no cap either. Whole-GPU grants then also ask for ``nvidia.com/gpu``,
      which on a time-sliced node counts replicas, not GPUs: only nodes without
      time-slicing can honour them (the renamed mode keeps the two apart).
    * ``hami``: HAMi's device plugin, which enforces the grant's memory cap
      (``nvidia.com/gpumem``, MiB) and compute share (``nvidia.com/gpucores``, percent).

    ``replicas``: the time-slices the device plugin makes of each GPU (0: not known; a
    time-sliced share cannot then be asked for). ``tolerations``: every gpuslice pod's
    (servers and batch jobs); a node with a taint they do not tolerate is not offered.
    ``server_queue``: Kueue's LocalQueue for servers' pods ("" without Kueue).
    """

    gpu: str = "nvidia.com/gpu"
    mig_prefix: str = "nvidia.com/mig-"
    shared_gpu: str = "nvidia.com/gpu.shared"
    share_mode: ShareMode = "time-slicing-renamed"
    hami_memory: str = "nvidia.com/gpumem"
    hami_cores: str = "nvidia.com/gpucores"
    product_label: str | None = "nvidia.com/gpu.product"
    # None: let Kubernetes choose the node (the service's host bookkeeping may then drift)
    host_label: str | None = "kubernetes.io/hostname"
    replicas: int = 0
    tolerations: tuple[Mapping[str, Any], ...] = DEFAULT_TOLERATIONS
    server_queue: str = ""

    def is_gpu_resource(self, name: str) -> bool:
        """Whether ``name`` is one of these GPU resources (a grant's, not the admin's)."""
        return name.startswith(self.mig_prefix) or name in {
            self.gpu,
            self.shared_gpu,
            self.hami_memory,
            self.hami_cores,
        }


@dataclass(frozen=True)
class KubeSpawnerSettings:
    """The KubeSpawner traits a grant decides; limits and guarantees are always equal
    because Kubernetes refuses extended resources whose request differs from the limit."""

    extra_resource_limits: dict[str, str] = field(default_factory=dict)
    extra_resource_guarantees: dict[str, str] = field(default_factory=dict)
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, Any]] = field(default_factory=list)

    def traits(self) -> dict[str, Any]:
        """As keyword arguments / trait values for KubeSpawner (and ``objects.make_pod``)."""
        return {
            "extra_resource_limits": dict(self.extra_resource_limits),
            "extra_resource_guarantees": dict(self.extra_resource_guarantees),
            "node_selector": dict(self.node_selector),
            "tolerations": [dict(t) for t in self.tolerations],
        }


def product_label_value(model: str) -> str:
    """GPU feature discovery's ``nvidia.com/gpu.product`` value for an NVML model name."""
    value = model.strip().replace(" ", "-")
    if not _LABEL_VALUE.fullmatch(value):
        raise ValueError(f"GPU model {model!r} does not make a valid label value ({value!r})")
    return value


def kueue_queue_value(queue: str) -> str:
    """``queue`` as the value of Kueue's queue label, or ValueError naming it."""
    if not queue or not _LABEL_VALUE.fullmatch(queue):
        raise ValueError(f"Kueue queue {queue!r} is not a valid label value")
    return queue


def kubespawner_settings(
    grant: Mapping[str, Any], resources: KubernetesResources | None = None
) -> KubeSpawnerSettings:
    """KubeSpawner settings that request exactly what ``grant`` holds."""
    res = resources or KubernetesResources()
    kind = grant.get("kind")
    assignments = list(grant.get("assignments") or [])
    if not assignments:
        raise ValueError(f"grant {grant.get('id')} has no assignments")

    if kind == "mig":
        limits = _mig_limits(assignments, res)
    elif kind == "share":
        limits = _share_limits(assignments, res)
    elif kind == "gpu":
        limits = {res.gpu: str(len(assignments))}
    else:
        raise ValueError(f"grant {grant.get('id')} has unknown kind {kind!r}")

    selector: dict[str, str] = {}
    models = {a.get("gpu_model") for a in assignments}
    # a grant spanning two models (possible for whole GPUs) cannot be one product selector
    if res.product_label and len(models) == 1 and None not in models:
        selector[res.product_label] = product_label_value(str(models.pop()))
    if res.host_label and grant.get("host"):
        host = str(grant["host"])
        if not _LABEL_VALUE.fullmatch(host):
            raise ValueError(f"host {host!r} is not a valid label value")
        selector[res.host_label] = host
    return KubeSpawnerSettings(
        extra_resource_limits=dict(limits),
        extra_resource_guarantees=dict(limits),
        node_selector=selector,
        tolerations=[dict(t) for t in res.tolerations],
    )


def share_slices(milli: int, replicas: int) -> int:
    """How many of the device plugin's time-slices (``replicas`` per GPU) a share of
    ``milli`` milli-GPUs is. ValueError unless it is a whole number of them: the plugin
    counts slices, the ledger milli-GPUs, and both must agree on what a GPU holds."""
    if replicas < 1:
        raise ValueError(
            "the device plugin's time-slicing replicas are not known "
            "(c.KubernetesResourcesConfig.time_slicing_replicas)"
        )
    slices, rest = divmod(milli * replicas, 1000)
    if rest or not slices:
        raise ValueError(
            f"a share of {milli} milli-GPU is {milli * replicas / 1000:g} of the "
            f"{replicas} time-slices of a GPU; a share must be a whole number of them: "
            + nearest_shares(milli, replicas)
        )
    return slices


def nearest_shares(milli: int, replicas: int) -> str:
    """The valid share sizes nearest ``milli`` with ``replicas`` slices a GPU, in words."""
    # (a share is less than a whole GPU: k of the replicas, k < replicas)
    valid = [k * 1000 // replicas for k in range(1, replicas) if k * 1000 % replicas == 0]
    below = [v for v in valid if v < milli][-1:]
    above = [v for v in valid if v > milli][:1]
    if not below + above:
        return (
            f"no share is, with {replicas} replicas (make the replicas a divisor of 1000, "
            "e.g. 2, 4, 5, 8 or 10, or offer whole GPUs)"
        )
    return f"nearest valid gpu_milli {' or '.join(str(v) for v in below + above)}"


def _mig_limits(assignments: list[Mapping[str, Any]], res: KubernetesResources) -> dict[str, str]:
    profiles: Counter[str] = Counter()
    for a in assignments:
        profile = a.get("mig_profile")
        if not profile or not _is_mig_profile(str(profile)):
            raise ValueError(f"MIG assignment without a valid mig_profile: {dict(a)!r}")
        profiles[str(profile)] += 1
    return {f"{res.mig_prefix}{profile}": str(n) for profile, n in profiles.items()}


def _share_limits(assignments: list[Mapping[str, Any]], res: KubernetesResources) -> dict[str, str]:
    if len(assignments) != 1:
        # one container sees one time-sliced device; two shares would be two devices
        raise ValueError(f"a share grant holds exactly one GPU share, got {len(assignments)}")
    (a,) = assignments
    milli = int(a.get("milli") or 0)
    if not 0 < milli <= 1000:
        raise ValueError(f"share of {milli} milli-GPU is out of range")
    if res.share_mode in ("time-slicing-renamed", "time-slicing"):
        # as many time-slices as the share is of a GPU: one slice is 1/replicas of it, and
        # the plugin hands out slices, so a share-500 with 2 replicas is one, with 4 two
        resource = res.shared_gpu if res.share_mode == "time-slicing-renamed" else res.gpu
        return {resource: str(share_slices(milli, res.replicas))}
    if res.share_mode == "hami":
        # round the compute share up: a 12.5 % grant must not become a 12 % cap
        limits = {res.gpu: "1", res.hami_cores: str(min(100, math.ceil(milli / 10)))}
        if a.get("memory_mib"):
            limits[res.hami_memory] = str(int(a["memory_mib"]))
        return limits
    raise ValueError(f"unknown share_mode {res.share_mode!r}")
