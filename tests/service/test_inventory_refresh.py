"""Reading the inventory again while the service runs: hosts that join are offered, hosts
that leave are marked absent (their holders keep their slices), an outage changes nothing.

Over real SQLite and PostgreSQL ledgers; then a real service behind a real hub reading a
Kubernetes API stand-in whose nodes change."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import pytest

from gpuslice.gpu import discover
from gpuslice.model import Inventory
from gpuslice_hub.errors import Refused
from gpuslice_hub.inventory_refresh import changes, refresh_once, run_inventory_refresh
from gpuslice_hub.ledger import Caller
from tests.harness.engines import need_module
from tests.harness.hub import wait_for

HOSTS = [
    {
        "name": "n1",
        "cpu_milli": 32000,
        "memory_mib": 256000,
        "gpus": [{"model": "A100", "memory_mib": 81920, "count": 2}],
    },
    {
        "name": "n2",
        "cpu_milli": 32000,
        "memory_mib": 256000,
        "gpus": [{"model": "A100", "memory_mib": 81920, "count": 1}],
    },
]
PROFILES = [{"name": "gpu-1", "kind": "gpu", "count": 1}]
LOG = logging.getLogger("test.inventory")


def inventory(*names: str) -> Inventory:
    return discover("simulated", [h for h in HOSTS if h["name"] in names])


def present(ledger) -> dict[str, bool]:
    hosts, _, _ = ledger.snapshot()
    return {h.name: h.present for h in hosts}


def test_changes_say_what_joined_left_and_changed_whatever_the_order():
    both = inventory("n1", "n2")
    assert changes(both, Inventory(both.backend, tuple(reversed(both.hosts)))) == []
    assert changes(inventory("n1"), both) == ["+n2 (1 GPUs)"]
    assert changes(both, inventory("n1")) == ["-n2"]
    n1 = both.hosts[0]
    fewer = replace(n1, gpus=n1.gpus[:1])
    assert changes(both, Inventory(both.backend, (fewer, both.hosts[1]))) == [
        "n1 changed (2 -> 1 GPUs)"
    ]


def test_a_host_that_joins_is_offered_and_one_that_leaves_keeps_its_holders(make_ledger):
    ledger = make_ledger(profiles=PROFILES, hosts=HOSTS[:1])
    assert present(ledger) == {"n1": True}
    applied: list[Inventory] = []

    def apply(inv: Inventory) -> None:
        ledger.sync_inventory(inv)
        applied.append(inv)

    # nothing changed: the ledger is not touched
    current = inventory("n1")
    assert refresh_once(current, lambda: inventory("n1"), apply, LOG) is current
    assert applied == []
    # n2 joins: its GPU is offered (n1's two are taken first)
    current = refresh_once(current, lambda: inventory("n1", "n2"), apply, LOG)
    assert len(applied) == 1 and present(ledger) == {"n1": True, "n2": True}
    held = [ledger.allocate(Caller(f"u{i}", (), f"u{i}"), "gpu-1")[0] for i in range(3)]
    assert {a["host"] for a in held} == {"n1", "n2"}
    on_n2 = next(a for a in held if a["host"] == "n2")
    # n2 leaves: absent, nothing new lands there, its holder keeps the slice
    current = refresh_once(current, lambda: inventory("n1"), apply, LOG)
    assert present(ledger) == {"n1": True, "n2": False}
    assert on_n2["id"] in {a.id for a in ledger.snapshot()[2]}
    # once it is given back, the absent GPU is not offered: n1's two are held, so no room
    ledger.release(on_n2["id"], "test", "done")
    with pytest.raises(Refused) as e:
        ledger.allocate(Caller("late", (), "late"), "gpu-1")
    assert e.value.code == "no_capacity"


def test_an_empty_read_where_there_were_hosts_changes_nothing(make_ledger, caplog):
    ledger = make_ledger(profiles=PROFILES, hosts=HOSTS)
    current = inventory("n1", "n2")
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        kept = refresh_once(current, lambda: Inventory("slurm", ()), ledger.sync_inventory, LOG)
    assert kept is current and present(ledger) == {"n1": True, "n2": True}
    assert "came back with no hosts; keeping the 2 known" in caplog.text


async def test_the_loop_survives_a_failed_read_and_applies_the_next_change(caplog):
    reads = {"n": 0}
    applied: list[Inventory] = []

    def read() -> Inventory:
        reads["n"] += 1
        if reads["n"] == 1:
            raise RuntimeError("sinfo: Unable to contact slurm controller")
        return inventory("n1", "n2")

    task = asyncio.ensure_future(
        run_inventory_refresh(0.01, inventory("n1"), read, applied.append, LOG)
    )
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while not applied and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert [len(i.hosts) for i in applied] == [2] and not task.done()
        assert "reading the inventory again failed" in caplog.text
        # the same read again: nothing more applied
        n = reads["n"]
        while reads["n"] < n + 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert len(applied) == 1
    finally:
        task.cancel()


@pytest.mark.hub
def test_the_running_service_offers_a_node_that_joins_the_cluster(hub_factory: Any):
    need_module("kubernetes_asyncio")
    from tests.jobs.fake_kube_api import FakeCluster, start_fake_api
    from tests.service.test_kubernetes_cluster import NODES

    fake, stop = start_fake_api(FakeCluster(nodes=[NODES[0]]))
    try:
        hub = hub_factory(
            profiles=[{"name": "mig-1g", "kind": "mig", "mig_profile": "1g.10gb"}],
            extra_service_config=(
                'c.GPUSliceService.gpu_backend = "kubernetes"\n'
                "c.GPUSliceService.hosts = []\n"
                f'c.KubernetesClusterConfig.api_url = "{fake.url}"\n'
                "c.GPUSliceService.inventory_refresh_interval = 0.5\n"
            ),
        )
        admin = hub.add_user("admin")

        def hosts() -> dict[str, bool]:
            inv = hub.api("GET", "/api/inventory", admin).json()
            return {h["name"]: h["present"] for h in inv["hosts"]}

        assert hosts() == {"gpu-a": True}
        fake.nodes.append(NODES[1])
        wait_for(lambda: hosts() == {"gpu-a": True, "gpu-b": True}, 30, "gpu-b to be offered")
        fake.nodes.remove(NODES[0])
        wait_for(lambda: hosts() == {"gpu-a": False, "gpu-b": True}, 30, "gpu-a to be absent")
        assert "inventory changed: +gpu-b (4 GPUs)" in hub.log()
        assert "inventory changed: -gpu-a" in hub.log()
    finally:
        stop()
