"""The ``static`` and ``simulated`` backends: hosts and GPUs declared in the hub config.

``static`` describes real GPUs on hosts the hub cannot query (Slurm nodes, remote
machines); ``simulated`` describes GPUs that do not exist at all so gpuslice can be tried
on a laptop. Both read the same format; uuids are derived from host name and position so
they are identical across restarts, because the allocation ledger keys on them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..model import GPU, Host, Inventory, MigInstance, MigMode
from .errors import ConfigError
from .profiles import DEFAULT_COMPUTE_SLICES, compute_milli, parse_mig_profile

_HOST_KEYS = {"name", "cpu_milli", "memory_mib", "gpus"}
_GPU_KEYS = {"model", "memory_mib", "count", "mig", "compute_slices", "uuids"}
_HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _positive_int(value: Any, path: str) -> int:
    # bool is an int subclass; "count: True" is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(path, f"must be a positive integer, got {value!r}")
    return value


def _check_keys(entry: Mapping[str, Any], allowed: set[str], path: str) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise ConfigError(
            path, f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed))})"
        )


def _require(entry: Mapping[str, Any], key: str, path: str) -> Any:
    if key not in entry:
        raise ConfigError(f"{path}.{key}", "is required")
    return entry[key]


def _parse_layout(
    layout: Any, path: str, memory_mib: int, total_slices: int
) -> list[tuple[str, int, int]]:
    if isinstance(layout, str) or not isinstance(layout, Sequence):
        raise ConfigError(path, f"must be a list of MIG profile names, got {layout!r}")
    parsed = []
    for j, name in enumerate(layout):
        try:
            slices, gb = parse_mig_profile(name)
        except ConfigError as e:
            raise ConfigError(f"{path}[{j}]", e.message) from None
        parsed.append((name.strip(), slices, gb))
    used_slices = sum(s for _, s, _ in parsed)
    if used_slices > total_slices:
        raise ConfigError(
            path,
            f"the layout uses {used_slices} compute slices, more than the GPU's {total_slices}",
        )
    gpu_gb = math.ceil(memory_mib / 1024)
    used_gb = sum(gb for _, _, gb in parsed)
    if used_gb > gpu_gb:
        raise ConfigError(
            path, f"the layout needs {used_gb} GB of memory, more than the GPU's {gpu_gb} GB"
        )
    return parsed


def _parse_host(entry: Any, path: str, backend: str) -> Host:
    if not isinstance(entry, Mapping):
        raise ConfigError(path, "must be a dict with name, cpu_milli, memory_mib, gpus")
    _check_keys(entry, _HOST_KEYS, path)
    name = _require(entry, "name", path)
    if not isinstance(name, str) or not _HOST_NAME_RE.match(name):
        raise ConfigError(
            f"{path}.name", f"must be a host name (letters, digits, '.', '_', '-'), got {name!r}"
        )
    cpu_milli = _positive_int(_require(entry, "cpu_milli", path), f"{path}.cpu_milli")
    memory_mib = _positive_int(_require(entry, "memory_mib", path), f"{path}.memory_mib")
    gpu_entries = entry.get("gpus", [])
    if isinstance(gpu_entries, str | bytes) or not isinstance(gpu_entries, Sequence):
        raise ConfigError(f"{path}.gpus", f"must be a list, got {gpu_entries!r}")

    gpus: list[GPU] = []
    for k, g in enumerate(gpu_entries):
        gpath = f"{path}.gpus[{k}]"
        if not isinstance(g, Mapping):
            raise ConfigError(gpath, "must be a dict with model, memory_mib, count")
        _check_keys(g, _GPU_KEYS, gpath)
        model = _require(g, "model", gpath)
        if not isinstance(model, str) or not model.strip():
            raise ConfigError(f"{gpath}.model", f"must be a non-empty string, got {model!r}")
        gpu_mib = _positive_int(_require(g, "memory_mib", gpath), f"{gpath}.memory_mib")
        count = _positive_int(g.get("count", 1), f"{gpath}.count")
        total_slices = _positive_int(
            g.get("compute_slices", DEFAULT_COMPUTE_SLICES), f"{gpath}.compute_slices"
        )
        if total_slices > 8:
            raise ConfigError(f"{gpath}.compute_slices", f"must be at most 8, got {total_slices}")
        layout = None
        if g.get("mig") is not None:
            layout = _parse_layout(g["mig"], f"{gpath}.mig", gpu_mib, total_slices)
        uuids = g.get("uuids")
        if uuids is not None:
            if backend != "static":
                raise ConfigError(f"{gpath}.uuids", "only the static backend takes real uuids")
            if (
                isinstance(uuids, str)
                or not isinstance(uuids, Sequence)
                or len(uuids) != count
                or not all(isinstance(u, str) and u.startswith("GPU-") for u in uuids)
            ):
                raise ConfigError(
                    f"{gpath}.uuids", f"must be a list of {count} 'GPU-…' strings, got {uuids!r}"
                )

        tag = "sim" if backend == "simulated" else "static"
        for c in range(count):
            index = len(gpus)
            uuid = uuids[c] if uuids is not None else f"GPU-{tag}-{name}-{index}"
            instances: tuple[MigInstance, ...] = ()
            if layout is not None:
                instances = tuple(
                    MigInstance(
                        uuid=f"MIG-{tag}-{name}-{index}-{j}",
                        profile=prof,
                        memory_mib=min(gb * 1024, gpu_mib),
                        milli=compute_milli(slices, total_slices),
                    )
                    for j, (prof, slices, gb) in enumerate(layout)
                )
            gpus.append(
                GPU(
                    uuid=uuid,
                    host=name,
                    index=index,
                    model=model.strip(),
                    memory_mib=gpu_mib,
                    mig_mode=MigMode.ENABLED if layout is not None else MigMode.DISABLED,
                    mig_instances=instances,
                )
            )
    return Host(name=name, cpu_milli=cpu_milli, memory_mib=memory_mib, gpus=tuple(gpus))


def declared_inventory(backend: str, hosts_config: Any) -> Inventory:
    """Build an inventory for ``static`` or ``simulated`` from the admin's host list."""
    if backend not in ("static", "simulated"):
        raise ValueError(f"declared_inventory handles static/simulated, not {backend!r}")
    if hosts_config is None:
        raise ConfigError(
            "hosts",
            f"the {backend} backend needs a hosts list, e.g. "
            '[{"name": "node1", "cpu_milli": 8000, "memory_mib": 32768, '
            '"gpus": [{"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 1}]}]',
        )
    if isinstance(hosts_config, str | bytes | Mapping) or not isinstance(hosts_config, Sequence):
        raise ConfigError("hosts", f"must be a list of host dicts, got {hosts_config!r}")
    hosts = []
    seen: set[str] = set()
    for i, entry in enumerate(hosts_config):
        host = _parse_host(entry, f"hosts[{i}]", backend)
        if host.name in seen:
            raise ConfigError(f"hosts[{i}].name", f"{host.name!r} is declared twice")
        seen.add(host.name)
        hosts.append(host)
    return Inventory(backend=backend, hosts=tuple(hosts), simulated=backend == "simulated")
