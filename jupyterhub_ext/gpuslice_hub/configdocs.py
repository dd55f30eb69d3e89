"""The configuration reference, generated from the traits themselves.

``docs/config-reference.md`` is this module's output; a test fails when they differ, so the
reference never describes a setting that does not exist or a default that changed.

    python -m gpuslice_hub.configdocs > docs/config-reference.md
"""

from __future__ import annotations

import importlib
import inspect
import re
from typing import Any

from traitlets import HasTraits

# (module, class, where it is set, what it is for), in the order of the document
SECTIONS = (
    (
        "gpuslice_hub.app",
        "GPUSliceService",
        "gpuslice_config.py",
        "The hub service: inventory, ledger, placement, quotas, idle reclaim rules, the API.",
    ),
    (
        "gpuslice_hub.jobs.manager",
        "JobManager",
        "gpuslice_config.py",
        "Batch jobs: the queue, preemption, checkpoints, the backends that run them.",
    ),
    (
        "gpuslice_spawner.slurm_gres",
        "SlurmGresConfig",
        "gpuslice_config.py (configure_jupyterhub copies it to the hub for the spawner)",
        "The Slurm cluster's gres names, for servers and batch jobs alike.",
    ),
    (
        "gpuslice_spawner.kubernetes_resources",
        "KubernetesResourcesConfig",
        "gpuslice_config.py (configure_jupyterhub copies it to the hub for the spawner)",
        "The Kubernetes cluster's GPU resource and label names, for servers and batch jobs.",
    ),
    (
        "gpuslice_hub.kubecluster",
        "KubernetesClusterConfig",
        "gpuslice_config.py",
        "Reaching the Kubernetes cluster, and mirroring its nodes and other pods' GPUs.",
    ),
    (
        "gpuslice_spawner.spawner",
        "GPUSliceMixin",
        "jupyterhub_config.py",
        "Every gpuslice spawner (local, Slurm, Kubernetes): asking the service for a slice.",
    ),
    (
        "gpuslice_spawner.kubernetes",
        "GPUSliceKubeSpawner",
        "jupyterhub_config.py",
        "The Kubernetes spawner's own settings (with KubeSpawner's).",
    ),
    (
        "gpuslice_spawner.slurm",
        "GPUSliceSlurmSpawner",
        "jupyterhub_config.py",
        "The Slurm spawner's own settings (with batchspawner's).",
    ),
    (
        "gpuslice.extension.app",
        "GPUSliceExtension",
        "the single-user server's jupyter_server_config",
        "The server extension: GPU activity, idle reclaim, usage reports (set by the spawner).",
    ),
)


def _own_traits(cls: type[HasTraits]) -> dict[str, Any]:
    """The configurable traits ``cls`` defines itself: those of its bases are in their own
    section (or in JupyterHub's, KubeSpawner's, batchspawner's documentation)."""
    mine = {}
    for name, trait in sorted(cls.class_traits(config=True).items()):
        owner = next(k for k in inspect.getmro(cls) if name in vars(k))
        if owner is cls:
            mine[name] = trait
    return mine


def _help(trait: Any) -> str:
    text = inspect.cleandoc(trait.help or "")
    text = re.sub(r"\s*\n\s*", " ", text).strip()
    return text.replace("|", "\\|") or "(no help text)"


def _default(trait: Any) -> str:
    try:
        value = trait.default_value_repr()
    except Exception:  # dynamic defaults (@default) have no static value
        value = "computed"
    value = value.replace("|", "\\|")
    return f"`{value}`" if len(value) <= 60 else f"`{value[:57]}...`"


def reference() -> str:
    out = [
        "# Configuration reference",
        "",
        "Generated from the code (`python -m gpuslice_hub.configdocs`); a test keeps it in",
        "step. The admin guide explains the settings most sites change; this is every one.",
        "",
    ]
    for module, name, where, what in SECTIONS:
        cls = getattr(importlib.import_module(module), name)
        out += [f"## {name}", "", f"{what} Set as `c.{name}.<name>` in {where}.", ""]
        out += ["| setting | type | default | help |", "|---|---|---|---|"]
        for trait_name, trait in _own_traits(cls).items():
            kind = type(trait).__name__
            out.append(f"| `{trait_name}` | {kind} | {_default(trait)} | {_help(trait)} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print(reference(), end="")
