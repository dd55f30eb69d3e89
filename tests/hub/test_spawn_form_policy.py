"""The spawn form announces the idle policy a server will really apply: the admin's
per-profile overrides and exemptions, not the profile's own default timeout."""

from __future__ import annotations

import re

import pytest

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
    return hub.logged_in(user).get(f"{hub.url}/hub/spawn", timeout=30).text


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
    # the reason is the service's: here the profile's exemption, not the person's
    assert "not reclaimed when idle (profile gpu-1 is exempt)" in row(html, "gpu-1")

    # an exemption set in the admin panel shows up in the form too
    r = hub.api("PUT", "/api/admin/exemptions/ann", admin, json={"reason": "demo day"})
    assert r.status_code == 200, r.text
    shown = row(spawn_page(hub, "ann"), "share-250")
    assert "not reclaimed when idle (exempted by admin: demo day)" in shown
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


def test_the_form_escapes_what_it_shows_and_an_admin_template_replaces_it(tmp_path):
    """A profile's name, description and refusal reason come from config and the service:
    the template escapes them all. An admin's spawn_form.html wins over the package's."""
    evil = "<img src=x onerror=alert(1)>"
    profiles = [
        {
            "name": "a",
            "display_name": evil,
            "description": evil,
            "free": 0,
            "total": 2,
            "available": False,
            "reason": evil,
            "idle": {"timeout": 0},
        },
        {"name": "b", "free": 3, "total": 4, "available": True, "idle": {"timeout": 0}},
    ]
    html = render_form(profiles, simulated=True, quota=[{"scope": "user", "text": "1 of 2"}])
    assert evil not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    assert 'value="b" checked' in html and 'value="a" disabled' in html
    assert "3 of 4 free" in html and "Unavailable: &lt;img" in html
    assert "simulated" in html and "Your quota: 1 of 2." in html
    assert "gpuslice-none" not in html  # b is free
    nothing = render_form([profiles[0]])
    assert "Nothing is free for you right now" in nothing and "[type=submit]" in nothing
    # none free, but a spawn may take a preemptible batch job's slice: offered, and said so
    taken = {**profiles[1], "free": 0, "from_batch": True, "from_batch_seconds": 60}
    html = render_form([taken])
    assert 'value="b" checked' in html and "0 of 4 free, one from a batch job" in html
    assert "preemptible batch job" in html and "up to 1 min" in html
    assert "gpuslice-none" not in html
    # a profile with free slices is preselected before one taken from a batch job
    free = {**profiles[1], "name": "c"}
    assert 'value="c" checked' in render_form([taken, free])

    (tmp_path / "spawn_form.html").write_text(
        "<ul>{% for p in profiles %}<li>{{ p.display_name }}: {{ p.status }}</li>{% endfor %}</ul>"
    )
    mine = render_form(profiles, template_paths=[str(tmp_path)])
    shown = "<li>&lt;img src=x onerror=alert(1)&gt;: 0 of 2 free</li><li>b: 3 of 4 free</li>"
    assert mine == f"<ul>{shown}</ul>"
