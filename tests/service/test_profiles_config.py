"""Malformed profile and quota config is refused with the offending key named."""

import pytest

from gpuslice_hub.errors import ConfigError
from gpuslice_hub.profiles import parse_profiles
from gpuslice_hub.quotas import Charge, Held, Holding, Usage, parse_quotas

GOOD = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb"},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "gpu-2", "kind": "gpu", "count": 2, "groups": ["ml"]},
]


def test_good_profiles_parse_into_requests():
    profiles = parse_profiles(GOOD)
    assert list(profiles) == ["mig-1g.10gb", "share-250", "gpu-2"]
    share = profiles["share-250"].request()
    assert (share.kind, share.gpu_milli, share.gpu_memory_mib) == ("share", 250, 20480)
    assert profiles["gpu-2"].request().total_gpu_milli == 2000
    assert profiles["gpu-2"].allowed_for(["ml", "x"]) and not profiles["gpu-2"].allowed_for([])
    assert profiles["mig-1g.10gb"].allowed_for([])


def test_every_mig_profile_discovery_reports_can_be_offered():
    # one grammar with discovery (gpuslice.gpu.profiles): media-extension variants and
    # the larger GPUs' instances NVML reports are profiles an admin can name
    from gpuslice.gpu.profiles import parse_mig_profile

    for name in ("1g.10gb+me", "1g.20gb+me.all", "7g.141gb", "8g.180gb", "4g.71gb"):
        parse_mig_profile(name)  # discovery accepts it
        raw = [{"name": "p", "kind": "mig", "mig_profile": name}]
        assert parse_profiles(raw)["p"].mig_profile == name


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"profiles": "x"}, "profiles"),
        ([{"name": "a", "kind": "share", "gpu_milli": 1000}], "profiles[0].gpu_milli"),
        ([{"name": "a", "kind": "share", "gpu_milli": "250"}], "profiles[0].gpu_milli"),
        ([{"name": "a", "kind": "tpu"}], "profiles[0].kind"),
        ([{"name": "A B", "kind": "gpu"}], "profiles[0].name"),
        ([{"name": "a", "kind": "mig", "mig_profile": "9g"}], "profiles[0].mig_profile"),
        ([{"name": "a", "kind": "mig", "mig_profile": "5g.40gb"}], "profiles[0].mig_profile"),
        ([{"name": "a", "kind": "gpu", "count": 0}], "profiles[0].count"),
        ([{"name": "a", "kind": "gpu", "gpu_milli": 5}], "profiles[0].gpu_milli"),
        ([{"name": "a", "kind": "gpu", "idle_timout": 5}], "profiles[0].idle_timout"),
        ([{"name": "a", "kind": "gpu", "groups": "ml"}], "profiles[0].groups"),
        ([{"name": "a", "kind": "gpu", "quota_weight": 0}], "profiles[0].quota_weight"),
        ([GOOD[0], {**GOOD[0]}], "profiles[1].name"),
    ],
)
def test_bad_profiles_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        parse_profiles(raw if isinstance(raw, list) else raw["profiles"])
    assert info.value.key == key
    assert str(info.value).startswith(key + ":")


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"user": {}}, "quotas.user"),
        ({"users": {"bob": {"max_slices": -1}}}, "quotas.users.bob.max_slices"),
        ({"users": {"bob": {"max_milli": 1.5}}}, "quotas.users.bob.max_milli"),
        ({"users": {"bob": {"borrow_from": []}}}, "quotas.users.bob.borrow_from"),
        ({"groups": {"a": {"borrow_from": ["b"]}}}, "quotas.groups.a.borrow_from[0]"),
        ({"groups": {"a": {"borrow_from": "b"}}}, "quotas.groups.a.borrow_from"),
        ({"default_user": []}, "quotas.default_user"),
    ],
)
def test_bad_quotas_name_the_key(raw, key):
    with pytest.raises(ConfigError) as info:
        parse_quotas(raw)
    assert info.value.key == key


def holding(user, group, slices=1.0, milli=250):
    return Holding(user, group, Usage(slices, milli))


def test_user_quota_counts_weighted_slices_and_milli():
    q = parse_quotas({"default_user": {"max_slices": 2}, "users": {"vip": {"max_milli": 1500}}})
    one = Usage(1, 250)
    assert q.check("ann", [], one, Held.of([holding("ann", None)])) == Charge(None)
    reason = q.check("ann", [], one, Held.of([holding("ann", None), holding("ann", None)]))
    assert reason == "over your quota (2 of 2 slices in use; this needs 1 slice)"
    # vip has no slice limit but a milli limit: 1250 + 250 fits, 1250 + 500 does not
    held = [holding("vip", None, milli=1250)]
    assert q.check("vip", [], Usage(1, 250), Held.of(held)) == Charge(None)
    assert "1.25 of 1.5 GPUs" in q.check("vip", [], Usage(1, 500), Held.of(held))


def test_group_quota_and_borrowing_idle_quota():
    q = parse_quotas(
        {
            "groups": {
                "physics": {"max_slices": 1, "borrow_from": ["chem"]},
                "chem": {"max_slices": 2},
                "bio": {"max_slices": 1},
            }
        }
    )
    want = Usage(1, 250)
    assert q.check("p1", ["physics"], want, Held.of([])) == Charge("physics")
    full = [holding("p1", "physics")]
    # physics is full: it borrows chem's unused quota
    assert q.check("p2", ["physics"], want, Held.of(full)) == Charge("chem", borrowed=True)
    # once chem's quota is used (by its own and borrowed slices), physics is refused
    used = [*full, holding("p2", "chem"), holding("c1", "chem")]
    assert "over the quota of group physics" in q.check("p3", ["physics"], want, Held.of(used))
    # bio may not borrow: not configured
    assert "group bio" in q.check("b2", ["bio"], want, Held.of([holding("b1", "bio")]))
    # a user in no group with a quota is not limited by group quotas
    assert q.check("x", ["other"], want, Held.of(used)) == Charge(None)


def test_a_request_larger_than_the_whole_quota_says_what_it_needs():
    q = parse_quotas(
        {"groups": {"physics": {"max_milli": 1000}}, "users": {"tiny": {"max_milli": 100}}}
    )
    # nothing held: "0 of 1 GPU in use" alone would read as a contradiction
    assert q.check("p1", ["physics"], Usage(1, 2000), Held.of([])) == (
        "over the quota of group physics (0 of 1 GPU in use; this needs 2 GPUs)"
    )
    assert q.check("tiny", [], Usage(1, 250), Held.of([])) == (
        "over your quota (0 of 0.1 GPUs in use; this needs 0.25 GPUs)"
    )


def test_standing_lists_every_quota_that_limits_a_user_with_its_use():
    q = parse_quotas(
        {
            "default_user": {"max_slices": 2},
            "users": {"vip": {"max_milli": 4000}},
            "groups": {"physics": {"max_slices": 3}, "chem": {"max_slices": 1}},
        }
    )
    held = [holding("ann", "physics"), holding("bob", "physics"), holding("cat", "chem")]
    assert q.standing("ann", ["physics", "bio"], Held.of(held)) == [
        {
            "scope": "user",
            "name": "ann",
            "max_slices": 2,
            "max_milli": None,
            "used_slices": 1,
            "used_milli": 250,
            "text": "1 of 2 slices in use",
        },
        {
            "scope": "group",
            "name": "physics",
            "max_slices": 3,
            "max_milli": None,
            "used_slices": 2,
            "used_milli": 500,
            "text": "2 of 3 slices in use",
        },
    ]
    assert [s["text"] for s in q.standing("vip", [], Held.of(held))] == ["0 of 4 GPUs in use"]
    assert parse_quotas({}).standing("ann", ["physics"], Held.of(held)) == []


def test_an_exempt_profile_is_named_to_people_as_the_spawn_form_names_it():
    """The spawn form's row and the lab say why a server is not reclaimed: by the profile's
    display name, not its config name (issue 44)."""
    from gpuslice.idle_policy import PolicyConfig
    from gpuslice_hub.idle import effective_policy

    profiles = parse_profiles([{**GOOD[1], "display_name": "Quarter GPU"}])
    config = PolicyConfig.parse({"exempt_profiles": ["share-250"], "exempt_users": ["root"]})
    policy = effective_policy(config, profiles, "ann", [], "share-250", None)
    assert policy.exempt and policy.exempt_reason == "profile Quarter GPU is exempt"
    # other reasons are untouched
    root = effective_policy(config, profiles, "root", [], "share-250", None)
    assert root.exempt_reason == "user root is exempt"
