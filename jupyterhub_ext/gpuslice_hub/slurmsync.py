"""The loop that keeps the ledger's external holdings equal to what Slurm's jobs hold
beyond gpuslice's own slices (``GPUSliceService.slurm_sync_interval``), and which nodes
Slurm starts no new work on (drained, down, reserved: never offered), and, hourly, checks
the service's hosts against Slurm's nodes and their gres."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Collection, Mapping

from gpuslice_spawner.launchers.slurm import SlurmGres

from .ledger import Ledger
from .slurmusage import SlurmReadError, read_held, read_node_states, read_nodes, steady


async def sync_once(
    ledger: Ledger,
    cfg: SlurmGres,
    log: logging.Logger,
    read: Callable[[], Mapping[str, Counter[str]]] = read_held,
    before: Mapping[str, Counter[str]] | None = None,
    batch_by_id: bool = False,
) -> tuple[int, int, list[str], dict[str, Counter[str]]]:
    """One pass, off the event loop: read Slurm, then update the ledger with what this
    read and ``before`` (the previous read; None on the first pass) agree on. Returns what
    changed and this read. A failed read raises and changes nothing (what Slurm held stays
    held until Slurm says otherwise). ``batch_by_id``: ``read`` leaves gpuslice's own batch
    jobs out (:meth:`~gpuslice_hub.ledger.external.ExternalMixin.sync_external`)."""
    now = dict(await asyncio.to_thread(read))
    held = now if before is None else steady(before, now)
    added, released, problems = await asyncio.to_thread(
        ledger.sync_external, held, cfg, batch_by_id
    )
    if added or released:
        log.info("Slurm: %d holding(s) outside gpuslice added, %d released", added, released)
    return added, released, problems, now


async def sync_node_states(
    ledger: Ledger,
    log: logging.Logger,
    read: Callable[[], Mapping[str, str]] = read_node_states,
) -> list[str]:
    """Mirror which nodes Slurm starts no new work on (drained, down, in a reservation)
    into the ledger, which then offers nothing there: one read, applied at once (a drain
    takes effect in Slurm at once too). A failed read raises and changes nothing."""
    out = await asyncio.to_thread(read)
    changes = await asyncio.to_thread(ledger.mirror_engine_out, out)
    for change in changes:
        log.info("Slurm: %s", change)
    return changes


# How often the service's hosts are compared with Slurm's nodes (an hour)
CHECK_SECONDS = 3600.0


async def check_nodes(
    ledger: Ledger,
    cfg: SlurmGres,
    read: Callable[[], Mapping[str, Counter[str]]] = read_nodes,
) -> list[str]:
    """Where the service's hand-written hosts and Slurm's nodes and gres disagree."""
    nodes = await asyncio.to_thread(read)
    return await asyncio.to_thread(ledger.slurm_mismatches, nodes, cfg)


async def run_slurm_sync(
    ledger: Ledger,
    interval: float,
    cfg: SlurmGres,
    log: logging.Logger,
    on_synced: Callable[[], None] = lambda: None,
    own_jobs: Callable[[], Collection[str]] | None = None,
    submitting: Callable[[], Collection[tuple[str, str]]] | None = None,
) -> None:
    """``own_jobs``: the Slurm ids of gpuslice's batch jobs that the job scheduler records
    in the ledger itself (Slurm schedules them); None when they are not Slurm's.
    ``submitting``: the (Slurm job name, user) of those whose id is not known yet (their
    sbatch has not answered): Slurm may run them already, and the mirror must not take
    them for foreign work (it did, and then the job pass could not record the job: its
    GPU was counted as Slurm's for the whole run)."""
    reported: set[str] = set()

    def read() -> Mapping[str, Counter[str]]:
        # (the names first, then the ids: a job whose id is written in between is in one)
        names = submitting() if submitting else ()
        ids = own_jobs() if own_jobs else ()
        return read_held(exclude=ids, submitting=names)

    before: dict[str, Counter[str]] | None = None
    checked = -CHECK_SECONDS
    loop = asyncio.get_running_loop()
    while True:
        try:
            if loop.time() - checked >= CHECK_SECONDS:
                checked = loop.time()
                for problem in await check_nodes(ledger, cfg):
                    log.error("Slurm and the service's hosts disagree: %s", problem)
            # nodes first: a node Slurm runs nothing new on is not offered from now
            await sync_node_states(ledger, log)
            _, _, problems, before = await sync_once(
                ledger, cfg, log, read, before, batch_by_id=own_jobs is not None
            )
            on_synced()
            for problem in problems:
                if problem not in reported:  # once, not every few seconds
                    log.warning("%s: check gres.conf against the service's hosts", problem)
            reported = set(problems)
        except SlurmReadError as e:
            log.warning("Slurm could not be read (%s); its holdings are kept as they were", e)
        except Exception:
            log.exception("mirroring Slurm's holdings failed")
        await asyncio.sleep(interval)
