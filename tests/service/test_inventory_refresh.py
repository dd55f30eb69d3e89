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
from gpuslice_hub.errors import ConfigError, Refused
from gpuslice_hub.inventory_refresh import Refresher, changes, run_inventory_refresh
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


class Reads:
    """What the backend answers, read after read."""

    def __init__(self, *answers: Inventory | Exception) -> None:
        self.answers = list(answers)

    def __call__(self) -> Inventory:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def refresher(ledger, current: Inventory, reads: Reads, held: set[str] | None = None):
    applied: list[Inventory] = []

    def apply(inv: Inventory) -> None:
        ledger.sync_inventory(inv)
        applied.append(inv)

    return Refresher(current, reads, apply, lambda: held or set(), LOG), applied


def test_a_host_that_joins_is_offered_and_one_that_leaves_keeps_its_holders(make_ledger):
    ledger = make_ledger(profiles=PROFILES, hosts=HOSTS[:1])
    assert present(ledger) == {"n1": True}
    reads = Reads(inventory("n1"), inventory("n1", "n2"), inventory("n1", "n2"))
    r, applied = refresher(ledger, inventory("n1"), reads)
    r.once()  # nothing changed: the ledger is not touched
    r.once()  # n2 seen once: not yet
    assert applied == [] and present(ledger) == {"n1": True}
    r.once()  # seen twice: offered (n1's two GPUs are taken first)
    assert len(applied) == 1 and present(ledger) == {"n1": True, "n2": True}
    held = [ledger.allocate(Caller(f"u{i}", (), f"u{i}"), "gpu-1")[0] for i in range(3)]
    assert {a["host"] for a in held} == {"n1", "n2"}
    on_n2 = next(a for a in held if a["host"] == "n2")
    # n2 leaves: absent, its holder keeps the slice
    reads.answers = [inventory("n1")]
    r.once()
    r.once()
    assert present(ledger) == {"n1": True, "n2": False}
    assert on_n2["id"] in {a.id for a in ledger.snapshot()[2]}
    # once it is given back, the absent GPU is not offered: n1's two are held, so no room
    ledger.release(on_n2["id"], "test", "done")
    with pytest.raises(Refused) as e:
        ledger.allocate(Caller("late", (), "late"), "gpu-1")
    assert e.value.code == "no_capacity"


def test_a_change_seen_once_is_not_applied(make_ledger):
    """A device plugin restarting shows a node without GPUs for one read."""
    ledger = make_ledger(profiles=PROFILES, hosts=HOSTS)
    both = inventory("n1", "n2")
    r, applied = refresher(ledger, both, Reads(inventory("n1"), both, inventory("n1"), both))
    for _ in range(4):
        r.once()
    assert applied == [] and present(ledger) == {"n1": True, "n2": True}


def test_a_held_gpu_is_not_described_anew_until_it_is_released(make_ledger, caplog):
    ledger = make_ledger(profiles=PROFILES, hosts=HOSTS)
    both = inventory("n1", "n2")
    n2 = both.hosts[1]
    (gpu,) = n2.gpus
    # the same GPU (uuid) reported with half its memory: a held row must not be rewritten
    smaller = replace(n2, gpus=(replace(gpu, memory_mib=40960),))
    changed = Inventory(both.backend, (both.hosts[0], smaller))
    held = {gpu.uuid}
    r, applied = refresher(ledger, both, Reads(changed), held)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        for _ in range(4):
            r.once()
    assert applied == []
    assert caplog.text.count("host(s) n2 changed while slices on them are held") == 1
    held.clear()  # released: applied at the next agreeing reads
    r.once()
    r.once()
    assert len(applied) == 1 and applied[0].hosts[1].gpus[0].memory_mib == 40960


def test_an_empty_or_failed_read_changes_nothing_and_is_said_once(make_ledger, caplog):
    ledger = make_ledger(profiles=PROFILES, hosts=HOSTS)
    both = inventory("n1", "n2")
    down = ConfigError("gpu_backend", "sinfo: Unable to contact slurm controller")
    reads = Reads(Inventory("slurm", ()), Inventory("slurm", ()), down, down, down)
    r, applied = refresher(ledger, both, reads)
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        for _ in range(5):
            r.once()
    assert applied == [] and present(ledger) == {"n1": True, "n2": True}
    assert caplog.text.count("came back with no hosts; keeping the 2 known") == 1
    assert caplog.text.count("Unable to contact slurm controller") == 1
    assert "Traceback" not in caplog.text


async def test_the_loop_survives_a_bug_and_keeps_reading(caplog):
    calls = {"n": 0}

    class Broken:
        log = LOG

        def once(self) -> None:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("a bug")

    task = asyncio.ensure_future(run_inventory_refresh(0.01, Broken()))  # type: ignore[arg-type]
    try:
        deadline = asyncio.get_running_loop().time() + 20
        while calls["n"] < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert calls["n"] >= 3 and not task.done()
        assert "reading the inventory again failed" in caplog.text
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
