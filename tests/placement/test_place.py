"""``place`` as the service calls it: HostState in, Placement or Refusal out."""

import copy

import pytest

from gpuslice_hub.placement import (
    POLICIES,
    Assignment,
    GPUState,
    HostState,
    MigSlotState,
    Placement,
    Refusal,
    Request,
    feasible,
    fitting_gpus,
    get_policy,
    place,
)


def hosts():
    mig = [
        MigSlotState("MIG-a", "1g.10gb", 10_000, 142, free=False),
        MigSlotState("MIG-b", "1g.10gb", 10_000, 142),
        MigSlotState("MIG-c", "3g.40gb", 40_000, 428),
    ]
    return [
        HostState(
            "plain",
            32_000,
            128_000,
            [
                GPUState("g0", "A100", 80_000, free_milli=250, free_memory_mib=20_000),
                GPUState("g1", "A100", 80_000, free_milli=600, free_memory_mib=8_000),
                GPUState("g2", "A100", 80_000, drained=True),
            ],
            rank=0,
        ),
        HostState("migged", 32_000, 128_000, [GPUState("m0", "A100", 80_000, mig=mig)], rank=1),
        HostState("t4", 4_000, 16_000, [GPUState("t0", "T4", 16_000)], rank=2),
    ]


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_place_is_pure_and_honours_every_rule(name):
    hs = hosts()
    before = copy.deepcopy(hs)
    policy = get_policy(name)

    # MIG: only a free instance of the profile, on the MIG GPU
    got = place(Request("mig", mig_profile="1g.10gb"), hs, policy)
    assert got == Placement("migged", (Assignment("m0", 142, 10_000, "MIG-b"),))
    assert isinstance(place(Request("mig", mig_profile="7g.80gb"), hs, policy), Refusal)

    # A share needs free milli and memory on one allowed GPU; g1 has the milli but too
    # little memory, g2 is drained, the T4 is not allowed
    req = Request("share", gpu_milli=200, gpu_memory_mib=10_000, models=("A100",))
    got = place(req, hs, policy)
    assert got == Placement("plain", (Assignment("g0", 200, 10_000),))

    # the drained GPU and the MIG GPU are never handed out whole; the T4 is
    got = place(Request("gpu", cpu_milli=1000), hs, policy)
    assert got == Placement("t4", (Assignment("t0", 1000, 16_000),))
    assert isinstance(place(Request("gpu", count=2), hs, policy), Refusal)

    # model constraint
    refusal = place(Request("share", gpu_milli=100, models=("H100",)), hs, policy)
    assert isinstance(refusal, Refusal) and "H100" in refusal.reason

    # CPU-only goes somewhere with CPU, and memory is checked
    assert isinstance(place(Request("none", cpu_milli=8_000), hs, policy), Placement)
    assert isinstance(place(Request("none", memory_mib=200_000), hs, policy), Refusal)

    assert hs == before


def test_share_without_cap_is_charged_proportional_memory():
    hs = [HostState("h", 8000, 8000, [GPUState("g", "T4", 16_000)])]
    got = place(Request("share", gpu_milli=250), hs, get_policy("default"))
    assert got == Placement("h", (Assignment("g", 250, 4_000),))


def test_feasible_and_fitting_gpus():
    h = hosts()[0]
    share = Request("share", gpu_milli=300)
    assert [g.uuid for g in fitting_gpus(share, h)] == ["g1"]
    assert feasible(share, h)
    assert not feasible(Request("share", gpu_milli=700), h)
    assert not feasible(Request("none", cpu_milli=32_001), h)


def test_default_prefers_the_gpu_that_keeps_whole_gpus_whole():
    # Host a has a GPU with 500 free; b is empty. Whatever the learned typical requests are
    # (here: 500-milli shares and whole GPUs), filling a's half-used GPU fragments nothing.
    policy = get_policy("default")
    hs = [
        HostState("a", 64_000, 64_000, [GPUState("a0", "T4", 16_000, free_milli=500)], rank=1),
        HostState("b", 64_000, 64_000, [GPUState("b0", "T4", 16_000)], rank=0),
    ]
    for _ in range(3):
        place(Request("gpu"), hs, policy)
    got = place(Request("share", gpu_milli=500), hs, policy)
    assert isinstance(got, Placement) and got.host == "a"


def test_empty_host_list_is_a_refusal():
    assert isinstance(place(Request("none"), [], get_policy("default")), Refusal)


def test_what_if_calls_do_not_teach_the_policy():
    policy = get_policy("default")
    hs = [HostState("h", 64_000, 64_000, [GPUState("g", "T4", 16_000)])]
    place(Request("gpu"), hs, policy)
    place(Request("share", gpu_milli=300), hs, policy, learn=False)
    assert policy.online is not None and policy.online.seen == 1
