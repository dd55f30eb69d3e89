"""How the Kubernetes cluster names GPU resources and node labels: one setting for the
notebook servers (GPUSliceKubeSpawner) and the batch jobs (``job_backend = 'kubernetes'``),
which both turn a gpuslice grant into pod resources with
:mod:`gpuslice_spawner.launchers.kubernetes`.

Set it once, as ``c.KubernetesResourcesConfig.<name>`` in gpuslice_config.py: the service
reads it there, and ``configure_jupyterhub`` copies it into the hub's config for the spawner.
Needs no KubeSpawner (the service imports it).
"""

from __future__ import annotations

from typing import cast

from traitlets import Dict, Enum, Int, List, Unicode
from traitlets.config import Configurable

from .launchers.kubernetes import DEFAULT_TOLERATIONS, KubernetesResources, ShareMode


class KubernetesResourcesConfig(Configurable):
    """The cluster's GPU resource and label names, for servers and batch jobs alike."""

    share_mode = Enum(
        ["time-slicing-renamed", "time-slicing", "hami"],
        default_value="time-slicing-renamed",
        help="How the cluster offers fractional GPUs. 'time-slicing-renamed': NVIDIA device "
        "plugin time-slicing with renameByDefault (a share is one nvidia.com/gpu.shared); "
        "'time-slicing': without renaming (a share is one nvidia.com/gpu replica); 'hami': "
        "HAMi, which enforces the share's memory cap and compute percentage.",
    ).tag(config=True)

    gpu_resource = Unicode(
        "nvidia.com/gpu", help="Extended resource of a whole GPU (and of a HAMi share)."
    ).tag(config=True)

    mig_resource_prefix = Unicode(
        "nvidia.com/mig-",
        help="Prefix of MIG instance resources; the MIG profile (e.g. 1g.10gb) is appended. "
        "The default matches the NVIDIA device plugin's 'mixed' MIG strategy.",
    ).tag(config=True)

    shared_gpu_resource = Unicode(
        "nvidia.com/gpu.shared",
        help="Resource of a time-sliced share when share_mode is 'time-slicing-renamed'.",
    ).tag(config=True)

    hami_memory_resource = Unicode(
        "nvidia.com/gpumem", help="HAMi resource carrying the share's memory cap (MiB)."
    ).tag(config=True)

    hami_cores_resource = Unicode(
        "nvidia.com/gpucores", help="HAMi resource carrying the share's compute percentage."
    ).tag(config=True)

    gpu_product_label = Unicode(
        "nvidia.com/gpu.product",
        help="Node label holding the GPU model (GPU feature discovery's); the pod selects "
        "the granted model with it. Empty: no product selector.",
    ).tag(config=True)

    node_host_label = Unicode(
        "kubernetes.io/hostname",
        help="Node label matched against the granted host, so the pod runs where gpuslice "
        "counted the slice; name inventory hosts after this label's values. Empty: let "
        "Kubernetes choose the node (gpuslice's per-host accounting may then drift).",
    ).tag(config=True)

    time_slicing_replicas = Int(
        0,
        help="How many time-slices the NVIDIA device plugin makes of each GPU (its config's "
        "sharing.timeSlicing.resources[].replicas; GFD labels the nodes "
        "nvidia.com/gpu.replicas). A share profile's pod asks for gpu_milli x replicas / "
        "1000 of them, which must be a whole number: with 4, share-250 is one slice and "
        "share-500 two; with 2, share-250 is refused at start. 0: not set, which refuses "
        "share profiles at start where Kubernetes time-slicing serves them (share_mode "
        "'time-slicing-renamed' or 'time-slicing'). With gpu_backend = 'kubernetes', a "
        "time-sliced node labelled with other replicas is refused at start. Not used with "
        "'hami'.",
    ).tag(config=True)

    tolerations = List(
        Dict(),
        default_value=[dict(t) for t in DEFAULT_TOLERATIONS],
        help="Tolerations of every gpuslice pod (servers and batch jobs), as Kubernetes "
        "writes them ({'key', 'operator', 'value', 'effect'}). A node with a NoSchedule or "
        "NoExecute taint these do not tolerate, like a cordoned node, is not offered (the "
        "service holds its free GPUs while KubernetesClusterConfig.sync_interval mirrors "
        "the cluster). Set them here rather than in KubeSpawner.tolerations, so the service "
        "knows them. The default tolerates the usual GPU-node taint nvidia.com/gpu.",
    ).tag(config=True)

    server_kueue_queue = Unicode(
        "",
        help="Kueue LocalQueue of the servers' pods (the label kueue.x-k8s.io/queue-name), "
        "so Kueue's quota counts the GPUs interactive servers hold and does not admit "
        "batch work onto them. Needs Kueue's pod integration for the hub's namespace; a "
        "server's pod then waits for Kueue's admission like any pod of the queue. Empty: no "
        "label.",
    ).tag(config=True)

    def value(self) -> KubernetesResources:
        return KubernetesResources(
            gpu=self.gpu_resource,
            mig_prefix=self.mig_resource_prefix,
            shared_gpu=self.shared_gpu_resource,
            share_mode=cast(ShareMode, self.share_mode),
            hami_memory=self.hami_memory_resource,
            hami_cores=self.hami_cores_resource,
            product_label=self.gpu_product_label or None,
            host_label=self.node_host_label or None,
            replicas=self.time_slicing_replicas,
            tolerations=tuple(dict(t) for t in self.tolerations),
            server_queue=self.server_kueue_queue,
        )
