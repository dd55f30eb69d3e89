"""A managed service stops with the JupyterHub that started it.

JupyterHub starts its managed services in sessions of their own and stops them at its own
clean shutdown. A hub killed outright (SIGKILL, the kernel's OOM killer) stops nothing: the
service runs on, orphaned, serving the old hub's configuration, and holds the ledger
(db/owner.py), so the service of the restarted hub refuses to start and gpuslice follows
a configuration nobody runs any more until someone finds the survivor and kills it.

So the service watches the hub process that started it (once a second, on Linux, from
``/proc``) and stops as if the hub had stopped it when that process is gone, letting go of
the ledger for the restarted hub's service. Which hub:

- the one ``configure_jupyterhub`` ran in: the hub reads its config before it starts its
  services, and the service's environment names that process (``GPUSLICE_HUB_PID``). A hub
  killed before the service even looked is then seen gone at once, and a service started
  through a wrapper (``sudo``) still knows its hub;
- otherwise (a service configured by hand), its parent process, when that is a
  ``jupyterhub`` command as the service starts.

A service started any other way (by hand, by systemd as an external service) is left alone:
there is no hub whose life it should share.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from pathlib import Path

# The hub process's id, set by configure_jupyterhub in the managed service's environment.
HUB_PID_ENV = "GPUSLICE_HUB_PID"
# How often the hub is looked at: a read of its /proc entry. The restarted hub's service
# waits up to db/owner.WAIT_SECONDS for the ledger, far longer than this.
CHECK_SECONDS = 1.0


def hub_parent(pid: int | None = None, environ: dict[str, str] | None = None) -> int | None:
    """The pid of the JupyterHub process that started this service as a managed service
    (see the module's docstring), or None: not a hub service, or no hub to follow."""
    env = os.environ if environ is None else environ
    if "JUPYTERHUB_SERVICE_NAME" not in env:
        return None
    named = env.get(HUB_PID_ENV, "")
    if named.isdigit() and int(named) > 0:
        return int(named)  # (whether it still runs is the watch's to see)
    ppid = os.getppid() if pid is None else pid
    if ppid <= 1:
        return None
    return ppid if is_hub(ppid) else None


def is_hub(pid: int) -> bool:
    """Whether process ``pid`` runs a ``jupyterhub`` command (a dead one, a zombie, or one
    that cannot be read, does not)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return is_jupyterhub_command(argv)


def is_jupyterhub_command(argv: list[bytes]) -> bool:
    """``jupyterhub …``, ``/path/to/jupyterhub …`` or ``python -m jupyterhub[.app] …``."""
    for i, arg in enumerate(argv):
        if os.path.basename(arg) == b"jupyterhub":
            return True
        if arg == b"-m" and i + 1 < len(argv) and argv[i + 1] in (b"jupyterhub", b"jupyterhub.app"):
            return True
    return False


class _CannotTell(Exception):
    """``/proc`` does not say (not Linux, or not readable): nothing is concluded."""


def _started(pid: int) -> str | None:
    """When process ``pid`` started (in clock ticks since boot; a pid reused by a later
    process is not the hub), None when there is no such process or it is a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):  # (the latter: gone while read)
        if not Path("/proc/self/stat").exists():
            raise _CannotTell from None
        return None
    except (OSError, IndexError) as e:
        raise _CannotTell from e
    return None if fields[0] == "Z" else fields[19]


async def watch_hub(
    hub_pid: int, stop: Callable[[], None], log: logging.Logger | logging.LoggerAdapter
) -> None:
    """Call ``stop`` once the hub process ``hub_pid`` is gone. Only a process that is
    positively gone counts (whatever its command line: the hub named by the environment
    may be started any way), never one ``/proc`` cannot tell about."""
    try:
        started = _started(hub_pid)
        while started is not None and _started(hub_pid) == started:
            await asyncio.sleep(CHECK_SECONDS)
    except _CannotTell:
        log.info("cannot watch the JupyterHub process %d (no /proc): not followed", hub_pid)
        return
    log.warning(
        "the JupyterHub that started this service (process %d) is gone: stopping, so "
        "that the service of the hub's next start can take the ledger",
        hub_pid,
    )
    stop()
