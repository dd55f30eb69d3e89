"""Which kernel (or the server, or someone else) a GPU process belongs to.

A GPU process belongs to the nearest kernel among its ancestors, so DataLoader workers
and other children count for their kernel. One inside the server's tree but in no kernel
(a script started from a terminal) belongs to the server, and so does one run by the
server's user that has been re-parented away from the tree (``nohup … &`` after the
terminal closed). Anything else is *foreign*: another user's process on a shared GPU.

PIDs: NVML reports PIDs as the driver sees them (the host's namespace). When the proc
root shows that namespace (a host /proc mounted into the pod, or no container at all),
``NSpid`` in ``/proc/<pid>/status`` lists the PID in every namespace down to the one the
kernel runs in; the innermost is the PID Jupyter knows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .procfs import ProcReader

KERNEL = "kernel"
SERVER = "server"
FOREIGN = "foreign"

_MAX_DEPTH = 128  # a PPid loop cannot happen in procfs, but a fake /proc can have one


@dataclass(frozen=True)
class Owner:
    kind: str  # KERNEL, SERVER or FOREIGN
    kernel_id: str | None = None
    local_pid: int | None = None  # None when the process is not visible at all


class Attributor:
    def __init__(
        self,
        proc: ProcReader | None = None,
        server_pid: int | None = None,
        server_uid: int | None = None,
        count_same_user: bool = True,
    ) -> None:
        self.proc = proc or ProcReader()
        self.server_pid = os.getpid() if server_pid is None else server_pid
        self.server_uid = os.getuid() if server_uid is None else server_uid
        self.count_same_user = count_same_user

    def resolve(self, pids: Iterable[int], kernels: Mapping[str, int]) -> dict[int, Owner]:
        """Owner of each source PID; *kernels* maps kernel id → the kernel's local PID."""
        kernel_of = {pid: kid for kid, pid in kernels.items()}
        # Per call memo: ancestor (proc-root PID) → (kernel id | SERVER marker) or None.
        memo: dict[int, str | None] = {}
        used: set[int] = set()
        owners: dict[int, Owner] = {}
        for pid in pids:
            if pid in owners:
                continue
            info = self.proc.info(pid)
            if info is None:
                owners[pid] = Owner(FOREIGN)
                continue
            used.add(pid)
            found = self._walk(pid, kernel_of, memo, used)
            if found is not None and found != SERVER:
                owners[pid] = Owner(KERNEL, found, info.local_pid)
            elif found == SERVER or (
                self.count_same_user and info.uid is not None and info.uid == self.server_uid
            ):
                owners[pid] = Owner(SERVER, None, info.local_pid)
            else:
                owners[pid] = Owner(FOREIGN, None, info.local_pid)
        self.proc.forget_except(used)
        return owners

    def _walk(
        self,
        pid: int,
        kernel_of: Mapping[int, str],
        memo: dict[int, str | None],
        used: set[int],
    ) -> str | None:
        chain: list[int] = []
        found: str | None = None
        p = pid
        for _ in range(_MAX_DEPTH):
            if p in memo:
                found = memo[p]
                break
            info = self.proc.info(p)
            if info is None:
                break
            used.add(p)
            chain.append(p)
            local = info.local_pid
            if local in kernel_of:
                found = kernel_of[local]
                break
            if local == self.server_pid:
                found = SERVER
                break
            if info.ppid <= 0 or info.ppid == p:
                break
            p = info.ppid
        for q in chain:
            memo[q] = found
        return found
