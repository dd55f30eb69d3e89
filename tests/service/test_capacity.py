"""How many more of each profile fit: counted from each host's free units, cached per
ledger state, and equal to placing one request after another until nothing fits."""

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
    while True:
        result = place(request, scratch, policy, learn=False)
        if not isinstance(result, Placement):
            return n
        apply(scratch, request, result)
        n += 1


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
                model = rng.choice(["A100", "A100", "H100"])
                gpu = GPUState(f"g{h}{g}", model, 81920, free_milli=free)
                gpu.free_memory_mib = rng.choice([81920, 40960, 10240])
                gpu.drained = rng.random() < 0.1
                gpus.append(gpu)
        memory = rng.choice([16000, 256000])
        hosts.append(HostState(f"h{h}", rng.choice([2000, 8000, 64000]), memory, gpus, h))
    return hosts


def test_counting_host_by_host_matches_placing_across_the_cluster() -> None:
    rng = random.Random(7)
    requests = [
        Request("share", cpu_milli=1000, gpu_milli=250, gpu_memory_mib=20480),
        Request("share", cpu_milli=1000, gpu_milli=500),
        Request("gpu", cpu_milli=2000, count=1),
        Request("gpu", cpu_milli=2000, count=2),
        Request("gpu", count=3, models=("A100",)),
        Request("share", memory_mib=4000, gpu_milli=125, models=("H100",)),
        Request("mig", cpu_milli=1000, mig_profile="1g.10gb"),
        Request("mig", mig_profile="2g.20gb", memory_mib=3000),
    ]
    for policy_name in ("default", "best-fit"):
        policy = get_policy(policy_name)
        for _ in range(60):
            hosts = random_cluster(rng)
            for request in requests:
                expected = count_across_the_cluster(request, hosts, policy)
                assert count_fits(request, hosts) == expected, (request, hosts)


def test_counts_are_exact_at_the_size_of_a_large_site() -> None:
    # 200 hosts x 8 GPUs: 6 400 quarter shares, 1 600 whole GPUs, 800 pairs (no cap at 256)
    hosts = [
        HostState(f"h{h}", 10**6, 10**7, [GPUState(f"g{h}-{i}", "A100", 81920) for i in range(8)])
        for h in range(200)
    ]
    assert count_fits(Request("share", gpu_milli=250, gpu_memory_mib=20480), hosts) == 6400
    assert count_fits(Request("gpu", count=1), hosts) == 1600
    assert count_fits(Request("gpu", count=2), hosts) == 800
    assert count_fits(Request("gpu", count=3), hosts) == 400  # 2 of each host's 8 left over


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
