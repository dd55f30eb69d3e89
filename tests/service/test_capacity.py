"""How many more of each profile fit: counted host by host, cached per ledger state."""

from __future__ import annotations

import copy
import random

from gpuslice_hub.clusterview import apply, count_fits
from gpuslice_hub.ledger import Caller
from gpuslice_hub.placement import (
    GPUState,
    HostState,
    MigSlotState,
    Placement,
    Request,
    get_policy,
    place,
)


def count_across_the_cluster(request: Request, hosts: list[HostState], policy) -> int:
    """The plain definition: place one after another anywhere, until nothing fits."""
    scratch = copy.deepcopy(hosts)
    n = 0
    while n < 256:
        result = place(request, scratch, policy, learn=False)
        if not isinstance(result, Placement):
            return n
        apply(scratch, request, result)
        n += 1
    return n


def random_cluster(rng: random.Random) -> list[HostState]:
    hosts = []
    for h in range(rng.randint(1, 5)):
        gpus = []
        for g in range(rng.randint(0, 4)):
            if rng.random() < 0.3:
                slots = [
                    MigSlotState(f"m{h}{g}{i}", rng.choice(["1g.10gb", "2g.20gb"]), 10240, 142)
                    for i in range(rng.randint(1, 4))
                ]
                for slot in slots:
                    slot.free = rng.random() < 0.6
                gpus.append(GPUState(f"g{h}{g}", "A100", 81920, mig=slots))
            else:
                free = rng.choice([0, 250, 500, 750, 1000])
                gpus.append(GPUState(f"g{h}{g}", "A100", 81920, free_milli=free))
        hosts.append(HostState(f"h{h}", rng.choice([2000, 8000, 64000]), 256000, gpus, h))
    return hosts


def test_counting_host_by_host_matches_placing_across_the_cluster() -> None:
    rng = random.Random(7)
    requests = [
        Request("share", cpu_milli=1000, gpu_milli=250, gpu_memory_mib=20480),
        Request("share", cpu_milli=1000, gpu_milli=500),
        Request("gpu", cpu_milli=2000, count=1),
        Request("gpu", cpu_milli=2000, count=2),
        Request("mig", cpu_milli=1000, mig_profile="1g.10gb"),
    ]
    for policy_name in ("default", "best-fit"):
        policy = get_policy(policy_name)
        for _ in range(60):
            hosts = random_cluster(rng)
            for request in requests:
                expected = count_across_the_cluster(request, hosts, policy)
                assert count_fits(request, hosts, policy) == expected, (request, hosts)
    # the cap still applies
    big = [HostState("h", 10**6, 10**7, [GPUState(f"g{i}", "A100", 81920) for i in range(80)])]
    assert count_fits(Request("share", gpu_milli=250), big, get_policy("default"), cap=100) == 100


def test_cached_capacity_follows_writes_of_other_ledgers(make_ledger) -> None:
    first, second = make_ledger(), make_ledger()  # two processes on one database
    before = {p["name"]: p["free"] for p in second.availability("ann", ())}
    second.availability("ann", ())  # served from the cache now
    alloc, _ = first.allocate(Caller("bob", (), "bob"), "gpu-1", "")
    after = {p["name"]: p["free"] for p in second.availability("ann", ())}
    assert after["gpu-1"] == before["gpu-1"] - 1
    assert second.profile_capacity()["gpu-1"][0] == after["gpu-1"]
    first.release(alloc["id"], "bob", "done")
    assert {p["name"]: p["free"] for p in second.availability("ann", ())} == before
