"""Admin actions behind a real JupyterHub: quota changes that take effect on the next
allocation and can be reset, idle exemptions that servers get with their policy, usage
reports from a slice's holder, and the action log that records who did what and why."""

from __future__ import annotations

import pytest

QUOTAS = {"default_user": {"max_slices": 4}, "groups": {"physics": {"max_milli": 500}}}


@pytest.fixture(scope="module")
def shared_hub(tmp_path_factory):
    from tests.harness.hub import start_hub

    work = tmp_path_factory.mktemp("admin-hub")
    # A site's template override: a banner on every page, extending the built-in layout.
    (work / "site-templates").mkdir()
    (work / "site-templates" / "page.html").write_text(
        '{% extends "gpuslice/page.html" %}'
        '{% block announcement %}<p id="site-banner">{{ user }}: maintenance Friday</p>'
        "{% endblock %}"
    )
    site = str(work / "site-templates")
    hub = start_hub(
        work, quotas=QUOTAS, extra_service_config=f"c.GPUSliceService.template_paths = [{site!r}]"
    )
    yield hub
    hub.stop()


@pytest.fixture
def clean(shared_hub):
    yield shared_hub
    token = shared_hub.service_token
    for a in shared_hub.api("GET", "/api/allocations", token).json()["allocations"]:
        shared_hub.api("DELETE", f"/api/allocations/{a['id']}", token)
    admin = shared_hub.add_user("admin")
    for o in shared_hub.api("GET", "/api/admin/quotas", admin).json()["overrides"]:
        path = "default_user" if o["subject"] == "default_user" else f"{o['subject']}/{o['name']}"
        shared_hub.api("DELETE", f"/api/admin/quotas/{path}", admin)


def allocate(hub, user, server):
    return hub.allocate(user, "share-250", server)


def test_admin_endpoints_need_the_admin_scope(clean):
    ann = clean.add_user("ann")
    for method, path, body in [
        ("GET", "/api/admin/quotas", None),
        ("PUT", "/api/admin/quotas/user/ann", {"max_slices": 9, "reason": "x"}),
        ("DELETE", "/api/admin/quotas/user/ann", None),
        ("GET", "/api/admin/exemptions", None),
        ("PUT", "/api/admin/exemptions/ann", {"reason": "x"}),
        ("GET", "/api/admin/actions", None),
    ]:
        r = clean.api(method, path, ann, json=body)
        assert r.status_code == 403, (method, path, r.status_code)
        assert "custom:gpuslice:admin" in r.json()["message"]
    r = clean.api("GET", "/admin", ann, allow_redirects=False)
    assert r.status_code == 403 and "custom:gpuslice:admin" in r.text


def test_a_site_template_override_shows_on_every_page(clean):
    ann = clean.add_user("ann")
    for path in ("/admin", "/"):  # the refusal (403) and the overview page
        r = clean.api("GET", path, ann, allow_redirects=False)
        assert r.headers["Content-Type"].startswith("text/html"), (path, r.status_code)
        assert '<p id="site-banner">ann: maintenance Friday</p>' in r.text, r.text
    admin = clean.add_user("admin")
    r = clean.api("GET", "/admin", admin)
    assert r.status_code == 200 and "site-banner" in r.text
    # the built-in page still around the banner: the admin panel's script and its API
    assert 'name="gpuslice-api"' in r.text and "admin.js" in r.text


def test_a_quota_change_applies_to_the_next_allocation_and_reset_restores_the_config(clean):
    clean.add_user("ann")
    admin = clean.add_user("admin")
    assert allocate(clean, "ann", "a").status_code == 201
    # bad input is refused naming the field, and changes nothing
    for body, needle in [
        ({"max_slices": -1, "reason": "x"}, "max_slices"),
        ({"max_milli": 2.5, "reason": "x"}, "max_milli"),
        ({"max_slices": 1}, "reason"),
        ({"reason": "x"}, "max_slices"),
        ({"max_slices": 1, "reason": "x", "extra": 1}, "extra"),
    ]:
        r = clean.api("PUT", "/api/admin/quotas/user/ann", admin, json=body)
        assert r.status_code == 400 and needle in r.json()["message"], (body, r.text)
    r = clean.api(
        "PUT", "/api/admin/quotas/user/nobody-here", admin, json={"max_slices": 1, "reason": "x"}
    )
    assert r.status_code == 404
    r = clean.api("PUT", "/api/admin/quotas/team/x", admin, json={"max_slices": 1, "reason": "x"})
    assert r.status_code == 404
    r = clean.api(
        "PUT", "/api/admin/quotas/group/fysics", admin, json={"max_slices": 1, "reason": "x"}
    )
    assert r.status_code == 404 and "no such group 'fysics'" in r.json()["message"]
    assert clean.api("GET", "/api/admin/quotas", admin).json()["overrides"] == []

    r = clean.api(
        "PUT",
        "/api/admin/quotas/user/ann",
        admin,
        json={"max_slices": 1, "reason": "paper deadline over"},
    )
    assert r.status_code == 200, r.text
    assert r.json()["set_by"] == "admin" and r.json()["max_slices"] == 1
    refused = allocate(clean, "ann", "b")
    assert refused.status_code == 429 and "1 of 1 slice in use" in refused.json()["message"]
    quotas = clean.api("GET", "/api/admin/quotas", admin).json()
    assert quotas["config"]["users"] == {}
    assert quotas["effective"]["users"]["ann"]["max_slices"] == 1
    assert quotas["in_use"]["users"]["ann"] == {"slices": 1.0, "milli": 250}

    r = clean.api("DELETE", "/api/admin/quotas/user/ann", admin, json={"reason": "back to normal"})
    assert r.status_code == 204
    assert allocate(clean, "ann", "b").status_code == 201  # the default quota of 4 again
    assert clean.api("DELETE", "/api/admin/quotas/user/ann", admin).status_code == 404

    # the default user quota and a group's quota (which keeps its configured borrow_from)
    r = clean.api(
        "PUT", "/api/admin/quotas/default_user", admin, json={"max_slices": 2, "reason": "crunch"}
    )
    assert r.status_code == 200, r.text
    assert allocate(clean, "ann", "c").status_code == 429
    clean.hub_api("POST", "/groups/chemistry")  # on the hub, not in the quotas config
    r = clean.api(
        "PUT", "/api/admin/quotas/group/chemistry", admin, json={"max_milli": 500, "reason": "x"}
    )
    assert r.status_code == 200, r.text

    actions = clean.api("GET", "/api/admin/actions", admin).json()["actions"]
    kinds = [(a["kind"], a["actor"], a["reason"]) for a in actions]
    assert ("quota-set", "admin", "paper deadline over") in kinds
    assert ("quota-reset", "admin", "back to normal") in kinds
    assert ("quota-set", "admin", "crunch") in kinds
    assert kinds.index(("quota-set", "admin", "crunch")) < kinds.index(
        ("quota-reset", "admin", "back to normal")
    )  # newest first


def test_an_idle_exemption_reaches_the_policy_servers_fetch_and_can_end(clean):
    ann, admin = clean.add_user("ann"), clean.add_user("admin")
    held = allocate(clean, "ann", "").json()
    policy = clean.api("GET", f"/api/idle-policy?allocation_id={held['id']}", ann).json()["policy"]
    assert policy["exempt"] is False
    r = clean.api("PUT", "/api/admin/exemptions/ann", admin, json={"hours": 0, "reason": "x"})
    assert r.status_code == 400 and "hours" in r.json()["message"]
    assert clean.api("PUT", "/api/admin/exemptions/ann", admin, json={}).status_code == 400
    assert (
        clean.api("PUT", "/api/admin/exemptions/ghost", admin, json={"reason": "x"}).status_code
        == 404
    )
    r = clean.api(
        "PUT",
        "/api/admin/exemptions/ann",
        admin,
        json={"hours": 48, "reason": "long debugging session"},
    )
    assert r.status_code == 200 and r.json()["expires_at"], r.text
    policy = clean.api("GET", f"/api/idle-policy?allocation_id={held['id']}", ann).json()["policy"]
    assert policy["exempt"] is True
    assert "exempted by admin" in policy["exempt_reason"]
    assert "long debugging session" in policy["exempt_reason"]
    listed = clean.api("GET", "/api/admin/exemptions", admin).json()["exemptions"]
    assert [e["user"] for e in listed] == ["ann"]

    assert (
        clean.api("DELETE", "/api/admin/exemptions/ann", admin, json={"reason": "done"}).status_code
        == 204
    )
    policy = clean.api("GET", f"/api/idle-policy?allocation_id={held['id']}", ann).json()["policy"]
    assert policy["exempt"] is False
    assert clean.api("DELETE", "/api/admin/exemptions/ann", admin).status_code == 404
    kinds = [a["kind"] for a in clean.api("GET", "/api/admin/actions", admin).json()["actions"]]
    assert "idle-exempted" in kinds and "idle-unexempted" in kinds


def test_usage_reports_come_from_the_holder_only_and_are_validated(clean):
    ann, bob = clean.add_user("ann"), clean.add_user("bob")
    held = allocate(clean, "ann", "").json()
    path = f"/api/allocations/{held['id']}/usage"
    report = {"utilization": 37.5, "memory_mib": 900, "idle_seconds": 0, "interval_seconds": 60}
    assert clean.api("POST", path, bob, json=report).status_code == 404  # not bob's to know
    admin = clean.add_user("admin")
    assert clean.api("POST", path, admin, json=report).status_code == 403  # no holder
    for body, needle in [
        ({**report, "utilization": 101}, "utilization"),
        ({**report, "utilization": "busy"}, "utilization"),
        ({"memory_mib": 1}, "utilization"),
        ({**report, "idle_seconds": -1}, "idle_seconds"),
    ]:
        r = clean.api("POST", path, ann, json=body)
        assert r.status_code == 400 and needle in r.json()["message"], (body, r.text)
    assert clean.api("POST", "/api/allocations/999999/usage", ann, json=report).status_code == 404
    r = clean.api("POST", path, ann, json=report)
    assert r.status_code == 200 and r.json()["allocation_id"] == held["id"]
    r = clean.api("POST", path, ann, json={**report, "utilization": None})
    assert r.status_code == 200  # unknown utilization is a valid report
    clean.api("DELETE", f"/api/allocations/{held['id']}", ann)
    assert clean.api("POST", path, ann, json=report).status_code == 409
