"""The harness's ports: bindable, distinct, never handed out twice by a process, and picked
below the kernel's ephemeral range, where no outgoing connection can take one before the
server it was picked for binds it."""

from __future__ import annotations

import socket

from tests.harness import ports


def test_ports_are_free_distinct_new_and_below_the_ephemeral_range(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    first, second = ports.free_ports(4), ports.free_ports(4)
    picked = first + second
    assert len(set(picked)) == 8
    assert all(ports.LOW <= p < ports._ephemeral_low() and p % 2 == 1 for p in picked)
    for p in picked:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # (free: nothing took it)


def test_a_port_in_use_is_not_picked(monkeypatch):
    # the range cut to 64 ports, all but every eighth one held by a listener
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports.LOW + 64)
    monkeypatch.setattr(ports, "_handed_out", set())
    held: list[socket.socket] = []
    others: set[int] = set()
    try:
        for port in range(ports.LOW, ports.LOW + 64):
            if port % 8:
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port))
                    s.listen()
                    held.append(s)
                except OSError:
                    # in use by another process (the suite's other worker): it may be let
                    # go before the picking, and then be rightly picked
                    s.close()
                    others.add(port)
        busy = {s.getsockname()[1] for s in held}
        picked = ports.free_ports(4) + ports.free_ports(4)
        assert len(set(picked)) == 8 and not set(picked) & busy
        assert all(p % 8 == 0 or p in others for p in picked), (picked, others)
    finally:
        for s in held:
            s.close()
