"""GPUSliceKubeSpawner: a gpuslice slice as pod resources, started by KubeSpawner.

Entry point ``gpuslice-kubernetes``; needs the ``kubernetes`` extra (KubeSpawner). The
package itself never imports this module, so the local spawners work without KubeSpawner.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jupyterhub.utils import maybe_future

from .kubernetes_resources import KubernetesResourcesConfig
from .launchers.kubernetes import (
    ALLOCATION_LABEL,
    KUEUE_QUEUE_LABEL,
    KubernetesResources,
    kubespawner_settings,
    kueue_queue_value,
)
from .spawner import SLICE_OPTION, GPUSliceMixin, SliceRefused

try:
    from kubespawner import KubeSpawner
except ImportError as e:  # pragma: no cover - depends on the installed extras
    raise ImportError(
        "GPUSliceKubeSpawner needs KubeSpawner: pip install 'gpuslice[kubernetes]'"
    ) from e


class GPUSliceKubeSpawner(GPUSliceMixin, KubeSpawner):
    """KubeSpawner whose pod asks for exactly the slice gpuslice granted, on its node.

    Configure KubeSpawner as usual (image, storage, ``profile_list`` with images and
    ``profile_options``, ...) and the cluster's GPU resource names as
    ``c.KubernetesResourcesConfig`` (in gpuslice_config.py, shared with the service's
    Kubernetes jobs). The spawn form shows the slice choice, then KubeSpawner's profile_list;
    the spawn options are ``slice`` (gpuslice's) and ``profile`` plus the profile's options
    (KubeSpawner's). The grant's GPU resources, node selector and labels win over a profile's
    ``kubespawner_override``.
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

    def wrapped_uses_profile(self) -> bool:
        # With a profile_list, "profile" is KubeSpawner's (an image, an environment)
        return bool(self.profile_list)

    async def _profile_list(self) -> list[dict[str, Any]]:
        """The profile_list as KubeSpawner reads it: a list, or a callable's answer."""
        profiles = self.profile_list
        if callable(profiles):
            profiles = await maybe_future(profiles(self))
        if isinstance(profiles, dict):  # (KubeSpawner takes a dict too, in key order)
            return [profiles[k] for k in sorted(profiles)]
        return list(profiles or [])

    async def check_wrapped_options(self, options: dict[str, Any]) -> None:
        # KubeSpawner's options: "profile", and each profile option (a choice, or the
        # free text of an "unlisted choice"); the rest are checked as for any launcher
        names: set[str] = set()
        choices: dict[str, set[str]] = {}
        for profile in await self._profile_list():
            names.add("profile")
            for name, option in (profile.get("profile_options") or {}).items():
                names.update((name, f"{name}--unlisted-choice"))
                choices.setdefault(name, set()).update(option.get("choices") or {})
        names.discard(SLICE_OPTION)  # gpuslice's, whatever a profile calls its options
        theirs = {k: v for k, v in options.items() if k in names}
        await super().check_wrapped_options({k: v for k, v in options.items() if k not in names})
        if not theirs:
            return
        for name, value in sorted(theirs.items()):
            if not isinstance(value, str):
                raise SliceRefused(f"Spawn option {name!r} must be a string.", 400)
            if name in choices and value not in choices[name]:
                offered = ", ".join(repr(c) for c in sorted(choices[name]))
                wrong = f"Spawn option {name!r} has no choice {value[:40]!r}"
                raise SliceRefused(f"{wrong}; choose one of {offered}.", 400)
        try:
            # KubeSpawner's own check and overrides (its profile_list), before a slice is
            # taken; its start() applies them again
            await self.load_user_options()
        except (ValueError, KeyError) as e:
            # (KubeSpawner's message repeats what the user sent, which may be anything)
            raise SliceRefused(f"Spawn options refused: {str(e)[:300]}", 400) from None

    async def load_user_options(self) -> None:
        if self.profile_list:
            # the profile (an image, its options) the user chose beside the slice; without
            # a profile_list KubeSpawner has nothing to apply ("profile" then names the
            # slice, which it would only warn about)
            await super().load_user_options()
        if self.grant:
            # a profile's kubespawner_override may name GPU resources, node selectors or
            # labels of its own: the slice gpuslice granted wins, as the pod must hold it
            self.apply_grant(self.grant)

    def get_env(self) -> dict[str, str]:
        env = super().get_env()
        # The device plugin picks the device inside the pod and sets the visible devices
        # itself; the grant's uuid would name a device the container cannot see.
        env.pop("CUDA_VISIBLE_DEVICES", None)
        return env
