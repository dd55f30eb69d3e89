"""Ports for the servers a test starts (hub, proxy, service, Slurm daemons, PostgreSQL).

Binding to port 0 draws from the kernel's ephemeral range, and a port drawn there and
released is free for the kernel to give out again as the local end of any outgoing
connection, by any process, before the server it was picked for binds it: under a busy
suite that server then fails with "address already in use". So ports are picked below that
range, where the kernel never assigns one on its own; the pytest-xdist workers pick from
disjoint residues, and a process never hands the same port out twice."""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

LOW = 20000  # below: where daemons commonly listen (PostgreSQL 5432, Slurm 6817, ...)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _worker() -> tuple[int, int]:
    """(this xdist worker's index, how many there are); (0, 1) outside xdist."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if name.startswith("gw") and name[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(name[2:]) % int(count), int(count)
    return 0, 1


_handed_out: set[int] = set()


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free now, none handed out before by this process. All stay
    bound until every one is picked."""
    high = _ephemeral_low()
    index, count = _worker()
    pool = [p for p in range(LOW + index, high, count) if p not in _handed_out]
    if len(pool) < 4 * n:  # (a range too small to pick from: the kernel's ephemeral ports)
        return _ephemeral_ports(n)
    random.shuffle(pool)
    socks: list[socket.socket] = []
    try:
        for port in pool:
            if len(socks) == n:
                break
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
        ports = [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
    if len(ports) < n:
        return _ephemeral_ports(n)
    _handed_out.update(ports)
    return ports


def _ephemeral_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()
