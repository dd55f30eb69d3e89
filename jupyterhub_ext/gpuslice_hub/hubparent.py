"""A managed service stops with the JupyterHub that started it.

JupyterHub starts its managed services in sessions of their own and stops them at its own
clean shutdown. A hub killed outright (SIGKILL, the kernel's OOM killer) stops nothing: the
service runs on, orphaned, serving the old hub's configuration, and holds the ledger
(db/owner.py), so the service of the restarted hub refuses to start and gpuslice follows
a configuration nobody runs any more until someone finds the survivor and kills it.

A service whose parent was a JupyterHub process watches for that parent to go (on Linux the
orphan is handed to init or a subreaper: its parent pid changes) and then stops as if the
hub had stopped it, letting go of the ledger for the restarted hub's service. A service
started any other way (by hand, by systemd as an external service) is left alone: there is
no hub whose life it should share.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

# How often the parent is looked at: a getppid() call; the restarted hub's service waits
# up to db/owner.WAIT_SECONDS for the ledger, far longer than this.
CHECK_SECONDS = 1.0


def hub_parent(pid: int | None = None, environ: dict[str, str] | None = None) -> int | None:
    """The pid of the JupyterHub process that started this service as a managed service,
    or None: no hub service environment, no parent but init, or a parent that is not a
    ``jupyterhub`` command (read from ``/proc``; elsewhere None, and nothing is watched)."""
    env = os.environ if environ is None else environ
    if "JUPYTERHUB_SERVICE_NAME" not in env:
        return None
    ppid = os.getppid() if pid is None else pid
    if ppid <= 1:
        return None
    try:
        argv = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    return ppid if is_jupyterhub_command(argv) else None


def is_jupyterhub_command(argv: list[bytes]) -> bool:
    """``jupyterhub …``, ``/path/to/jupyterhub …`` or ``python -m jupyterhub …``."""
    for i, arg in enumerate(argv):
        if os.path.basename(arg) == b"jupyterhub":
            return True
        if arg == b"-m" and i + 1 < len(argv) and argv[i + 1] == b"jupyterhub":
            return True
    return False


async def watch_hub_parent(
    hub_pid: int, stop: Callable[[], None], log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Call ``stop`` once the process that started this one (``hub_pid``) is gone."""
    while os.getppid() == hub_pid:
        await asyncio.sleep(CHECK_SECONDS)
    log.warning(
        "the JupyterHub that started this service (process %d) is gone: stopping, so "
        "that the service of the hub's next start can take the ledger",
        hub_pid,
    )
    stop()
