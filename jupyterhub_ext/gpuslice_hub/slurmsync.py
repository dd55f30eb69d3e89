"""The loop that keeps the ledger's external holdings equal to what Slurm's jobs hold
beyond gpuslice's own slices (``GPUSliceService.slurm_sync_interval``)."""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Mapping

from gpuslice_spawner.launchers.slurm import SlurmGres

from .ledger import Ledger
from .slurmusage import SlurmReadError, read_held, steady


async def sync_once(
    ledger: Ledger,
    cfg: SlurmGres,
    log: logging.Logger,
    read: Callable[[], Mapping[str, Counter[str]]] = read_held,
    before: Mapping[str, Counter[str]] | None = None,
) -> tuple[int, int, list[str], dict[str, Counter[str]]]:
    """One pass, off the event loop: read Slurm, then update the ledger with what this
    read and ``before`` (the previous read; None on the first pass) agree on. Returns what
    changed and this read. A failed read raises and changes nothing (what Slurm held stays
    held until Slurm says otherwise)."""
    now = dict(await asyncio.to_thread(read))
    held = now if before is None else steady(before, now)
    added, released, problems = await asyncio.to_thread(ledger.sync_external, held, cfg)
    if added or released:
        log.info("Slurm: %d holding(s) outside gpuslice added, %d released", added, released)
    return added, released, problems, now


async def run_slurm_sync(
    ledger: Ledger, interval: float, cfg: SlurmGres, log: logging.Logger
) -> None:
    reported: set[str] = set()
    before: dict[str, Counter[str]] | None = None
    while True:
        try:
            _, _, problems, before = await sync_once(ledger, cfg, log, before=before)
            for problem in problems:
                if problem not in reported:  # once, not every few seconds
                    log.warning("%s: check gres.conf against the service's hosts", problem)
            reported = set(problems)
        except SlurmReadError as e:
            log.warning("Slurm could not be read (%s); its holdings are kept as they were", e)
        except Exception:
            log.exception("mirroring Slurm's holdings failed")
        await asyncio.sleep(interval)
