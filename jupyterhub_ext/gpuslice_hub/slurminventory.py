"""The inventory from Slurm (``gpu_backend = "slurm"``): hosts and GPUs read from
``sinfo --json`` instead of written by hand.

Slurm knows each node's CPUs, memory and gres (``gpu:a100:2,gpu:1g.10gb:3,shard:16``); the
ledger needs GPUs with a model and memory, and MIG instances on their GPU. So:

* a typed whole-GPU gres (``gpu:a100:2``) is that many GPUs of the model that
  ``SlurmGresConfig.gpu_gres_types`` maps to the type; the memory comes from the model's
  name ("NVIDIA A100-SXM4-80GB": 80 GB) or ``SlurmGresConfig.gpu_memory_mib``;
* a MIG-typed gres (``gpu:1g.10gb:3``, as Slurm's NVML autodetection names MIG instances) is
  that many instances, packed onto GPUs of the node's whole-GPU model (or the only model
  configured) — Slurm does not say which GPU an instance is on, and the ledger counts
  instances per profile and node, as Slurm does;
* shards and MPS are a property of whole GPUs (checked hourly against ``shards_per_gpu``);
* untyped GPUs (``gpu:2``), or a type no model maps to, are refused at start with the node's
  name: the ledger would not know what they are.

The result is the same list of hosts the ``static`` backend reads, so it is validated the
same way.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from gpuslice_spawner.launchers.slurm import SlurmGres, share_units

from .errors import ConfigError
from .ledger.external import is_mig_type
from .migpack import pack_mig_exact
from .profiles import Profile
from .slurmusage import SHARE_GRES, SlurmReadError, json_command, parse_gres_detail

KEY = "gpu_backend"
_MEMORY_IN_NAME = re.compile(r"(\d+)\s*GB", re.IGNORECASE)


def model_memory_mib(
    model: str, memory: Mapping[str, int], setting: str = "c.SlurmGresConfig.gpu_memory_mib"
) -> int:
    """A GPU model's memory: configured (``setting``), or as its name says ("...-80GB":
    80 GiB)."""
    if model in memory:
        return int(memory[model])
    found = _MEMORY_IN_NAME.findall(model)
    if not found:
        raise ConfigError(
            KEY,
            f"the memory of {model!r} is not in its name: set {setting} = {{{model!r}: <MiB>}}",
        )
    return int(found[-1]) * 1024


def hosts_from_nodes(
    nodes: list[Mapping[str, Any]], cfg: SlurmGres, memory: Mapping[str, int]
) -> list[dict[str, Any]]:
    """The ``hosts`` of the static backend for Slurm's GPU nodes (``sinfo --json``'s
    ``nodes``); nodes without GPUs are left out."""
    models = {gtype: model for model, gtype in cfg.gpu_types.items()}
    hosts = []
    for node in sorted(nodes, key=lambda n: str(n.get("name"))):
        name = str(node.get("name") or "")
        gres = parse_gres_detail(str(node.get("gres") or ""))
        gpus: list[dict[str, Any]] = []
        mig: Counter[str] = Counter()
        for key, count in sorted(gres.items()):
            gname, _, gtype = key.partition(":")
            if gname in SHARE_GRES or gname != cfg.gpu:
                continue
            if not gtype:
                raise ConfigError(
                    KEY,
                    f"node {name} has untyped GPUs ({key}:{count}): give them a Type in "
                    "gres.conf and map it in c.SlurmGresConfig.gpu_gres_types",
                )
            if is_mig_type(gtype):
                mig[gtype] = count
                continue
            if gtype not in models:
                raise ConfigError(
                    KEY,
                    f"node {name}: gres type {gtype!r} is no model's in "
                    "c.SlurmGresConfig.gpu_gres_types (model -> type)",
                )
            model = models[gtype]
            gpus.append(
                {"model": model, "memory_mib": model_memory_mib(model, memory), "count": count}
            )
        if mig:
            gpus += _mig_gpus(name, mig, gpus, models, memory)
        if not gpus:
            continue
        hosts.append(
            {
                "name": name,
                "cpu_milli": int(node.get("cpus") or 0) * 1000,
                "memory_mib": int(node.get("real_memory") or 0),
                "gpus": gpus,
            }
        )
    return hosts


def _mig_gpus(
    node: str,
    instances: Counter[str],
    whole: list[dict[str, Any]],
    models: Mapping[str, str],
    memory: Mapping[str, int],
) -> list[dict[str, Any]]:
    """MIG GPUs holding ``instances``, as few as hold them (migpack: first-fit lost a whole
    GPU of a node whose GPUs were split alike, as on Kubernetes)."""
    candidates = {g["model"] for g in whole} or set(models.values())
    if len(candidates) != 1:
        raise ConfigError(
            KEY,
            f"node {node} has MIG instances but its GPUs' model cannot be told "
            f"({', '.join(sorted(candidates)) or 'no model'}): map exactly one model in "
            "c.SlurmGresConfig.gpu_gres_types, or one per node",
        )
    (model,) = candidates
    mib = model_memory_mib(model, memory)
    try:
        return pack_mig_exact(instances, model, mib)
    except ValueError as e:
        raise ConfigError(
            KEY,
            f"node {node}: its {model} GPUs ({mib} MiB) cannot hold its MIG instances "
            f"({', '.join(f'{n} of {p}' for p, n in sorted(instances.items()))}): {e}",
        ) from e


def home_nodes(
    nodes: list[Mapping[str, Any]], leave_out: Collection[str]
) -> list[Mapping[str, Any]]:
    """The nodes that are this cluster's capacity: not those whose every partition is one
    of ``leave_out`` (the burst partition's: capacity bought elsewhere, see the admin
    guide's burst section). A node in a home partition too stays."""
    away = {p for p in leave_out if p}
    return [
        n
        for n in nodes
        if not away or not (set(map(str, n.get("partitions") or [])) or {""}) <= away
    ]


def check_slurm_units(cfg: SlurmGres, profiles: Iterable[Profile], used: bool) -> None:
    """Refuse at start a share profile that is no whole number of Slurm's share units
    (``used``: Slurm serves the slices: its inventory, its batch jobs or its mirror are
    on, or ``c.SlurmGresConfig`` is set for the servers). The job asks Slurm for units,
    the ledger charges milli-GPUs: a share-300 with 8 shards per GPU asked for 3 shards
    (375 milli), Slurm put the third such job on another GPU than the ledger, and the
    ledger offered a whole GPU Slurm could not run."""
    if not used:
        return
    for i, profile in enumerate(profiles):
        if profile.kind != "share":
            continue
        try:
            share_units(profile.gpu_milli, cfg)
        except ValueError as e:
            raise ConfigError(f"profiles[{i}].gpu_milli", f"profile {profile.name}: {e}") from None


def read_slurm_hosts(
    cfg: SlurmGres,
    memory: Mapping[str, int],
    env: Mapping[str, str] | None = None,
    leave_out: Collection[str] = (),
) -> list[dict[str, Any]]:
    """Slurm's GPU nodes as hosts: one ``sinfo --json``. ``leave_out``: partitions whose
    nodes are not this cluster's (:func:`home_nodes`)."""
    try:
        data = json_command(["sinfo", "--json"], env, 30)
    except SlurmReadError as e:
        raise ConfigError(KEY, f"Slurm's nodes could not be read: {e}") from None
    nodes = data.get("nodes")
    if not isinstance(nodes, list):
        raise ConfigError(KEY, "sinfo --json gave no node list")
    ours = home_nodes([n for n in nodes if isinstance(n, dict)], leave_out)
    hosts = hosts_from_nodes(ours, cfg, memory)
    if not hosts:
        raise ConfigError(KEY, "Slurm has no node with GPU gres (gres.conf)")
    return hosts
