"""GPUSliceKubeSpawner: a gpuslice slice as pod resources, started by KubeSpawner.

Entry point ``gpuslice-kubernetes``; needs the ``kubernetes`` extra (KubeSpawner). The
package itself never imports this module, so the local spawners work without KubeSpawner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .kubernetes_resources import KubernetesResourcesConfig
from .launchers.kubernetes import (
    ALLOCATION_LABEL,
    KUEUE_QUEUE_LABEL,
    KubernetesResources,
    kubespawner_settings,
    kueue_queue_value,
)
from .spawner import GPUSliceMixin

try:
    from kubespawner import KubeSpawner
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "GPUSliceKubeSpawner needs KubeSpawner: pip install 'gpuslice[kubernetes]'"
    ) from e


class GPUSliceKubeSpawner(GPUSliceMixin, KubeSpawner):
    """KubeSpawner whose pod asks for exactly the slice gpuslice granted, on its node.

    Configure KubeSpawner as usual (image, storage, ...) and the cluster's GPU resource names
    as ``c.KubernetesResourcesConfig`` (in gpuslice_config.py, shared with the service's
    Kubernetes jobs); do not set ``KubeSpawner.profile_list``: the ``profile`` spawn option
    is gpuslice's.
    """

    engine_counts_shares = True  # (replicas or shards: never overcommitted)

    def kubernetes_resources(self) -> KubernetesResources:
        # the cluster's resource and label names: c.KubernetesResourcesConfig, shared with
        # the service's Kubernetes batch jobs
        return KubernetesResourcesConfig(parent=self).value()

    def _kept(self, trait: str, drop: Callable[[str], bool]) -> dict[str, str]:
        current: dict[str, str] = getattr(self, trait)
        return {k: v for k, v in current.items() if not drop(k)}

    def apply_grant(self, grant: dict[str, Any]) -> None:
        res = self.kubernetes_resources()
        settings = kubespawner_settings(grant, res)
        # The spawner object outlives one spawn: drop the previous grant's GPU resources and
        # selectors (a MIG limit must not survive into a share spawn) but keep whatever
        # else the admin configured (hugepages, a node pool selector, ...).
        selector_keys = {k for k in (res.product_label, res.host_label) if k}
        limits = self._kept("extra_resource_limits", res.is_gpu_resource)
        guarantees = self._kept("extra_resource_guarantees", res.is_gpu_resource)
        selector = self._kept("node_selector", selector_keys.__contains__)
        self.extra_resource_limits = {**limits, **settings.extra_resource_limits}
        self.extra_resource_guarantees = {**guarantees, **settings.extra_resource_guarantees}
        self.node_selector = {**selector, **settings.node_selector}
        # the tolerations the service judged the nodes by (a node whose taints they do not
        # tolerate is never offered), beside the admin's own; once each, spawn after spawn
        # (read by name: mypy cannot type KubeSpawner's trait)
        current: list[dict[str, Any]] = list(getattr(self, "tolerations"))  # noqa: B009
        self.tolerations = current + [t for t in settings.tolerations if t not in current]
        # the service's mirror of the cluster's pods knows this one by it: not foreign
        own = {ALLOCATION_LABEL: str(grant["id"])}
        if res.server_queue:
            # Kueue's quota then counts the GPUs servers hold, so it does not admit batch
            # work onto them
            own[KUEUE_QUEUE_LABEL] = kueue_queue_value(res.server_queue)
        labels = self._kept("extra_labels", {ALLOCATION_LABEL, KUEUE_QUEUE_LABEL}.__contains__)
        self.extra_labels = {**labels, **own}

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
