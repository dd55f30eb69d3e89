"""The spawn form announces the idle policy a server will really apply: the admin's
per-profile overrides and exemptions, not the profile's own default timeout."""

from __future__ import annotations

import re

import pytest
import requests

from gpuslice_spawner.form import render_form

pytestmark = pytest.mark.hub

POLICY = """
c.GPUSliceService.idle_policy = {
    "action": "server",
    "profiles": {"share-250": {"idle_timeout": 30}, "mig-1g.10gb": {"action": "kernel"}},
    "exempt_profiles": ["gpu-1"],
}
"""


def spawn_page(hub, user: str) -> str:
    s = requests.Session()
    s.get(f"{hub.url}/hub/login", timeout=30)
    r = s.post(
        f"{hub.url}/hub/login",
        data={"username": user, "password": "test-password", "_xsrf": s.cookies.get("_xsrf")},
        timeout=30,
    )
    assert r.ok, r.text
    return s.get(f"{hub.url}/hub/spawn", timeout=30).text


def row(html: str, profile: str) -> str:
    match = re.search(rf'data-profile="{re.escape(profile)}">(.*?)</label>', html, re.S)
    assert match, profile
    return re.sub(r"<[^>]+>", " ", match.group(1))


def test_the_form_says_what_the_server_will_do(hub_factory):
    hub = hub_factory(spawner="gpuslice-simple", extra_service_config=POLICY)
    ann = hub.add_user("ann")
    admin = hub.add_user("admin")
    profiles = {p["name"]: p for p in hub.api("GET", "/api/profiles", ann).json()["profiles"]}
    # per-profile override wins over the profile's own 600 s; the default action is "server"
    assert profiles["share-250"]["idle"] == {
        "timeout": 30,
        "action": "server",
        "exempt": False,
        "exempt_reason": None,
    }
    assert profiles["mig-1g.10gb"]["idle"]["action"] == "kernel"
    assert profiles["gpu-1"]["idle"]["exempt"] is True

    html = spawn_page(hub, "ann")
    assert "reclaimed after 30 s idle (the server is stopped)" in row(html, "share-250")
    # kernel-only reclaim says what it does, and that the slice stays with the server
    assert "idle kernels are shut down after 10 min; the slice is held until you stop the" in (
        row(html, "mig-1g.10gb")
    )
    assert "not reclaimed when idle (you are exempt)" in row(html, "gpu-1")

    # an exemption set in the admin panel shows up in the form too
    r = hub.api("PUT", "/api/admin/exemptions/ann", admin, json={"reason": "demo day"})
    assert r.status_code == 200, r.text
    assert "not reclaimed when idle (you are exempt)" in row(spawn_page(hub, "ann"), "share-250")
    # and the server, asking for its policy, is told the same
    held = hub.allocate("ann", "share-250").json()
    policy = hub.api("GET", f"/api/idle-policy?allocation_id={held['id']}", ann).json()
    assert policy["policy"]["exempt"] is True


def test_render_form_words_for_each_policy():
    base = {"kind": "share", "free": 1, "total": 1, "allowed": True, "available": True}
    cases = [
        ({"timeout": 0, "action": "server", "exempt": False}, "never reclaimed when idle"),
        ({"timeout": 7200, "action": "server", "exempt": False}, "reclaimed after 2 h idle"),
        ({"timeout": 90, "action": "kernel", "exempt": False}, "shut down after 1 min"),
        ({"timeout": 90, "action": "server", "exempt": True}, "you are exempt"),
    ]
    for idle, words in cases:
        html = render_form([{**base, "name": "p", "idle": idle}])
        assert words in html, (idle, html)
