"""Reading the inventory again while the service runs (``inventory_refresh_interval``).

Hosts join and leave a Slurm or Kubernetes cluster, and an admin may repartition a GPU's MIG
instances, without the service restarting. Every interval the backend is read again; when
what it describes changed, the ledger is synced (new hosts and GPUs are offered, vanished ones
are marked absent while their holders keep them) and the change is logged. A read that fails,
or finds no host at all where there were some (Slurm's controller away, an API answering
with an empty list), changes nothing: an outage must not look like the whole cluster left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuslice.model import Host, Inventory


def _by_name(inventory: Inventory) -> dict[str, Host]:
    return {h.name: h for h in inventory.hosts}


def _canonical(host: Host) -> tuple:
    """A host's description, independent of the order the backend listed things in."""
    gpus = sorted(
        (g.uuid, g.index, g.model, g.memory_mib, g.mig_mode, frozenset(g.mig_instances))
        for g in host.gpus
    )
    return (host.cpu_milli, host.memory_mib, tuple(gpus))


def changes(old: Inventory, new: Inventory) -> list[str]:
    """What differs, host by host, in words (empty: nothing)."""
    before, after = _by_name(old), _by_name(new)
    out = [f"+{name} ({len(after[name].gpus)} GPUs)" for name in sorted(set(after) - set(before))]
    out += [f"-{name}" for name in sorted(set(before) - set(after))]
    for name in sorted(set(before) & set(after)):
        if _canonical(before[name]) != _canonical(after[name]):
            out.append(f"{name} changed ({len(before[name].gpus)} -> {len(after[name].gpus)} GPUs)")
    return out


def refresh_once(
    current: Inventory,
    discover: Callable[[], Inventory],
    apply: Callable[[Inventory], None],
    log: logging.Logger,
) -> Inventory:
    """Read the backend once; apply and return what changed (else return ``current``)."""
    new = discover()
    if not new.hosts and current.hosts:
        log.warning(
            "the %s inventory came back with no hosts; keeping the %d known (an outage of the "
            "backend, or every host removed: restart the service to accept an empty cluster)",
            new.backend,
            len(current.hosts),
        )
        return current
    diff = changes(current, new)
    if not diff:
        return current
    apply(new)
    log.info("inventory changed: %s", ", ".join(diff))
    return new


async def run_inventory_refresh(
    interval: float,
    current: Inventory,
    discover: Callable[[], Inventory],
    apply: Callable[[Inventory], None],
    log: logging.Logger,
) -> None:
    """Every ``interval`` seconds, in a worker thread (reading Slurm forks ``sinfo``, reading
    Kubernetes lists every node)."""
    while True:
        await asyncio.sleep(interval)
        try:
            current = await asyncio.to_thread(refresh_once, current, discover, apply, log)
        except Exception:
            # tried again at the next interval
            log.exception("reading the inventory again failed; the known one stays")
