"""Reading the inventory again while the service runs (``inventory_refresh_interval``).

Hosts join and leave a Slurm or Kubernetes cluster, and an admin may repartition a GPU's MIG
instances, without the service restarting. Every interval the backend is read again; when
what it describes changed, the ledger is synced (new hosts and GPUs are offered, vanished ones
are marked absent while their holders keep them) and the change is logged. A read that fails,
or finds no host at all where there were some (Slurm's controller away, an API answering
with an empty list), changes nothing: an outage must not look like the whole cluster left.
A change is applied once two reads in a row agree on it, and never re-describes a GPU
whose slices are held.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from gpuslice.gpu import GPUDiscoveryError
from gpuslice.model import GPU, Host, Inventory

from .errors import ConfigError


def _by_name(inventory: Inventory) -> dict[str, Host]:
    return {h.name: h for h in inventory.hosts}


def _gpu_description(g: GPU) -> tuple:
    return (g.index, g.model, g.memory_mib, g.mig_mode, frozenset(g.mig_instances))


def _canonical(host: Host) -> tuple:
    """A host's description, independent of the order the backend listed things in."""
    gpus = sorted((g.uuid, *_gpu_description(g)) for g in host.gpus)
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


def keep_held(current: Inventory, new: Inventory, held: set[str]) -> tuple[Inventory, list[str]]:
    """``new``, but for the hosts where it would describe a held GPU (or a GPU with a held
    MIG instance) anew: those keep their current description until the slices are released
    (the claims point at the rows it would rewrite). A held GPU that vanished is no
    reason to wait: it is marked absent and its holders keep it. Returns the inventory to
    apply and the hosts kept as they were."""
    before = _by_name(current)
    hosts, kept = [], []
    for host in new.hosts:
        old = before.get(host.name)
        if old is not None and _canonical(old) != _canonical(host):
            now = {g.uuid: g for g in host.gpus}
            for g in old.gpus:
                in_use = g.uuid in held or any(m.uuid in held for m in g.mig_instances)
                again = now.get(g.uuid)
                if in_use and again is not None and _gpu_description(again) != _gpu_description(g):
                    kept.append(host.name)
                    host = old
                    break
        hosts.append(host)
    return Inventory(new.backend, tuple(hosts), new.simulated), kept


class Refresher:
    """Reads the backend, and applies a change once two reads in a row agree on it: a
    device plugin restarting, or a MIG repartition half done, shows for one read."""

    def __init__(
        self,
        current: Inventory,
        discover: Callable[[], Inventory],
        apply: Callable[[Inventory], None],
        held: Callable[[], set[str]],
        log: logging.Logger,
    ) -> None:
        self.current, self.discover, self.apply, self.held, self.log = (
            current,
            discover,
            apply,
            held,
            log,
        )
        self.pending: Inventory | None = None
        self._said: str | None = None  # the last failure or deferral logged

    def _say(self, message: str) -> None:
        """A warning once, not once per interval while it lasts."""
        if message != self._said:
            self.log.warning("%s", message)
            self._said = message

    def once(self) -> None:
        try:
            new = self.discover()
        except (ConfigError, GPUDiscoveryError) as e:
            # Slurm's controller or the API away, a node not described yet: one line
            self._say(f"reading the inventory again failed, the known one stays: {e}")
            return
        if not new.hosts and self.current.hosts:
            self._say(
                f"the {new.backend} inventory came back with no hosts; keeping the "
                f"{len(self.current.hosts)} known (an outage of the backend, or every host "
                "removed: restart the service to accept an empty cluster)"
            )
            return
        diff = changes(self.current, new)
        if not diff:
            self.pending, self._said = None, None
            return
        if self.pending is None or changes(self.pending, new):
            self.pending = new  # applied if the next read agrees
            return
        merged, kept = keep_held(self.current, new, self.held())
        self.pending = None
        if kept:
            self._say(
                f"host(s) {', '.join(kept)} changed while slices on them are held: their new "
                "description is applied once those are released"
            )
        applied = changes(self.current, merged)
        if applied:
            self.apply(merged)
            self.log.info("inventory changed: %s", ", ".join(applied))
            self.current = merged


async def run_inventory_refresh(interval: float, refresher: Refresher) -> None:
    """Every ``interval`` seconds, in a worker thread (reading Slurm forks ``sinfo``, reading
    Kubernetes lists every node)."""
    while True:
        await asyncio.sleep(interval)
        try:
            await asyncio.to_thread(refresher.once)
        except Exception:
            # a bug, or the ledger away: tried again at the next interval
            refresher.log.exception("reading the inventory again failed; the known one stays")
