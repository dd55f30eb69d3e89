"""The spawn form in a real browser (Debian's Chromium) against a real hub.

With ``GPUSLICE_SCREENSHOT=<path.png>`` the test also saves the screenshot used in
docs/admin-guide.md::

    GPUSLICE_SCREENSHOT=docs/images/spawn-form.png \
        .venv/bin/pytest tests/spawner/test_spawn_form_browser.py
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.browser.lab import login
from tests.harness.engines import need, need_module
from tests.harness.markers import require

pytestmark = [pytest.mark.hub, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

PROFILES = [
    {
        "name": "mig-1g.10gb",
        "display_name": "Small MIG slice (1g.10gb)",
        "kind": "mig",
        "mig_profile": "1g.10gb",
        "idle_timeout": 1800,
    },
    {
        "name": "mig-3g.40gb",
        "display_name": "Medium MIG slice (3g.40gb)",
        "kind": "mig",
        "mig_profile": "3g.40gb",
        "idle_timeout": 3600,
    },
    {
        "name": "share-250",
        "display_name": "Quarter GPU, time-sliced",
        "kind": "share",
        "gpu_milli": 250,
        "gpu_memory_mib": 20480,
        "idle_timeout": 1800,
    },
    {
        "name": "gpu-1",
        "display_name": "Whole A100 80GB",
        "kind": "gpu",
        "count": 1,
        "idle_timeout": 3600,
    },
]


# A site's own spawn option beside the slice (issue 46): the wrapped spawner's form (here
# an admin's options_form; KubeSpawner's profile_list or batchspawner's fields alike) sits
# below the slice choice in one form, and both reach the spawn.
OWN_FIELD = """
c.Spawner.options_form = (
    '<label class="site-start-in">Start in <select name="start_in">'
    '<option value="/tree">Notebook</option><option value="/lab">JupyterLab</option>'
    '</select></label>'
)
c.Spawner.options_from_form = "simple"
c.Spawner.apply_user_options = {"start_in": "default_url"}
c.GPUSliceMixin.allowed_user_options = {"start_in": "/(tree|lab)"}
"""


def open_spawn_form(page: Any, hub: Any, user: str) -> None:
    """Log in through the hub's login page and open the spawn form."""
    login(page, hub.url, user)
    page.goto(f"{hub.url}/hub/spawn")


def test_the_form_shows_live_availability_and_why_not(hub_factory: Any):
    need(Path(CHROMIUM).exists(), "Chromium (apt-get install chromium)")
    sync_api = need_module("playwright.sync_api")
    hub = hub_factory(
        spawner="gpuslice-simple",
        profiles=PROFILES,
        quotas={"default_user": {"max_slices": 2}},
        extra_hub_config=OWN_FIELD,
    )
    # colleagues hold both 1g.10gb instances and one whole GPU
    for user, profile in (("bob", "mig-1g.10gb"), ("cat", "mig-1g.10gb"), ("dan", "gpu-1")):
        hub.add_user(user)
        r = hub.allocate(user, profile)
        assert r.status_code == 201, r.text
    hub.add_user("ann")

    require("browser", "drives Chromium")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            open_spawn_form(page, hub, "ann")
            form = page.locator(".gpuslice-form")
            form.wait_for()

            busy = page.locator('[data-profile="mig-1g.10gb"]')
            assert "disabled" in (busy.get_attribute("class") or "")
            assert busy.locator("input").is_disabled()
            assert "0 of 2 free" in busy.inner_text()
            assert "Unavailable: all in use (2 of 2 in use)" in busy.inner_text()
            medium = page.locator('[data-profile="mig-3g.40gb"]')
            assert medium.locator("input").is_checked()  # the first available is preselected
            assert "1 of 1 free" in page.locator('[data-profile="mig-3g.40gb"]').inner_text()
            assert "simulated" in form.inner_text()
            # what her quota leaves her, before she picks
            assert "Your quota: 0 of 2 slices in use." in form.inner_text()

            shot = os.environ.get("GPUSLICE_SCREENSHOT")
            if shot:
                Path(shot).parent.mkdir(parents=True, exist_ok=True)
                page.screenshot(path=shot, full_page=True)

            # the site's own field, below the slices, in the same form
            own = page.locator("form#spawn_form .gpuslice-wrapped-form select[name=start_in]")
            assert own.is_visible()
            assert page.locator("form#spawn_form .gpuslice-form").count() == 1
            # choosing a free profile in the browser starts a server on it, as she chose it
            page.locator('[data-profile="share-250"] input').check()
            own.select_option("/lab")
            assert page.locator('[data-profile="share-250"] input').is_checked()
            page.locator("form#spawn_form input[type=submit], form#spawn_form button").first.click()
            hub.wait_ready("ann")
            page.wait_for_url("**/user/ann/**", timeout=60_000)  # the hub sends her there
            model = hub.server_model("ann") or {}
            assert model["user_options"] == {"slice": "share-250", "start_in": "/lab"}

            # The service's overview page: styled like the admin panel, a way back to the
            # hub, her quota and her slice; a drained GPU would read as such, not "in use".
            page.goto(f"{hub.url}/services/gpuslice/")
            quota = page.locator("#gs-quota")
            quota.wait_for()
            assert "You: 1 of 2 slices in use" in quota.inner_text()
            held = page.locator("#gs-held").inner_text()
            assert "The slices you hold" in held and "share-250" in held and "bob" not in held
            profiles = page.locator("#gs-profiles").inner_text()
            assert "Small MIG slice (1g.10gb)" in profiles and "all in use" in profiles
            background = page.evaluate("getComputedStyle(document.body).backgroundColor")
            assert background == "rgb(246, 247, 249)", background  # admin.css applied
            page.get_by_role("link", name="Hub home").click()
            page.wait_for_url("**/hub/home")
        finally:
            browser.close()
    held = hub.api("GET", "/api/allocations?user=ann", hub.service_token).json()["allocations"]
    assert [a["profile"] for a in held] == ["share-250"]
    hub.hub_api("DELETE", "/users/ann/server")
    hub.wait_gone("ann")


def test_a_stale_form_shows_the_refusal_and_start_is_off_with_nothing_to_pick(hub_factory: Any):
    need(Path(CHROMIUM).exists(), "Chromium (apt-get install chromium)")
    sync_api = need_module("playwright.sync_api")
    hub = hub_factory(spawner="gpuslice-simple", profiles=PROFILES[:1])  # two 1g.10gb slices
    hub.add_user("ann")
    hub.add_user("bob")
    require("browser", "drives Chromium")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1100, "height": 760})
            open_spawn_form(page, hub, "ann")
            page.locator(".gpuslice-form").wait_for()
            start = page.locator("form#spawn_form [type=submit]").first
            assert start.is_enabled()
            # while ann reads the form, colleagues take both slices
            for server in ("a", "b"):
                assert hub.allocate("bob", "mig-1g.10gb", server).status_code == 201
            with page.expect_response("**/hub/spawn**") as answer:
                start.click()
            assert answer.value.status == 409
            # the service's own words, on the form (not "500: Internal Server Error"), naming
            # the profile as the form does
            page.get_by_text("No Small MIG slice (1g.10gb) free (2 of 2 in use)").wait_for()
            assert "Internal Server Error" not in page.content()
            # the form came back with the current picture: nothing to pick, Start is off
            assert page.locator(".gpuslice-none").is_visible()
            assert page.locator("form#spawn_form [type=submit]").first.is_disabled()
        finally:
            browser.close()
    assert hub.server_model("ann") is None or not hub.server_model("ann").get("ready")
    assert (
        hub.api("GET", "/api/allocations?user=ann", hub.service_token).json()["allocations"] == []
    )
