"""GPUSliceKubeSpawner: a gpuslice slice as pod resources, started by KubeSpawner.

Entry point ``gpuslice-kubernetes``; needs the ``kubernetes`` extra (KubeSpawner). The
package itself never imports this module, so the local spawners work without KubeSpawner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from traitlets import Enum, Unicode

from .launchers.kubernetes import KubernetesResources, ShareMode, kubespawner_settings
from .spawner import GPUSliceMixin

try:
    from kubespawner import KubeSpawner
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "GPUSliceKubeSpawner needs KubeSpawner: pip install 'gpuslice[kubernetes]'"
    ) from e


class GPUSliceKubeSpawner(GPUSliceMixin, KubeSpawner):
    """KubeSpawner whose pod asks for exactly the slice gpuslice granted, on its node.

    Configure KubeSpawner as usual (image, storage, ...) and the GPU naming here; do not set
    ``KubeSpawner.profile_list``: the ``profile`` spawn option is gpuslice's.
    """

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

    def kubernetes_resources(self) -> KubernetesResources:
        return KubernetesResources(
            gpu=self.gpu_resource,
            mig_prefix=self.mig_resource_prefix,
            shared_gpu=self.shared_gpu_resource,
            share_mode=cast(ShareMode, self.share_mode),
            hami_memory=self.hami_memory_resource,
            hami_cores=self.hami_cores_resource,
            product_label=self.gpu_product_label or None,
            host_label=self.node_host_label or None,
        )

    def _is_gpu_resource(self, name: str) -> bool:
        res = self.kubernetes_resources()
        return name.startswith(res.mig_prefix) or name in {
            res.gpu,
            res.shared_gpu,
            res.hami_memory,
            res.hami_cores,
        }

    def _kept(self, trait: str, drop: Callable[[str], bool]) -> dict[str, str]:
        current: dict[str, str] = getattr(self, trait)
        return {k: v for k, v in current.items() if not drop(k)}

    def apply_grant(self, grant: dict[str, Any]) -> None:
        settings = kubespawner_settings(grant, self.kubernetes_resources())
        # The spawner object outlives one spawn: drop the previous grant's GPU resources and
        # selectors (a MIG limit must not survive into a share spawn) but keep whatever
        # else the admin configured (hugepages, a node pool selector, ...).
        selector_keys = {k for k in (self.gpu_product_label, self.node_host_label) if k}
        limits = self._kept("extra_resource_limits", self._is_gpu_resource)
        guarantees = self._kept("extra_resource_guarantees", self._is_gpu_resource)
        selector = self._kept("node_selector", selector_keys.__contains__)
        self.extra_resource_limits = {**limits, **settings.extra_resource_limits}
        self.extra_resource_guarantees = {**guarantees, **settings.extra_resource_guarantees}
        self.node_selector = {**selector, **settings.node_selector}

    async def load_user_options(self) -> None:
        # KubeSpawner reads user_options["profile"] as a profile_list slug; here it names a
        # gpuslice profile, already checked by the mixin and turned into resources above.
        if self.profile_list:
            self.log.warning(
                "KubeSpawner.profile_list is ignored with GPUSliceKubeSpawner: users choose "
                "gpuslice profiles; set images and other resources with KubeSpawner's traits"
            )

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # The device plugin picks the device inside the pod and sets the visible devices
        # itself; the grant's uuid would name a device the container cannot see.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env
