"""JupyterLab with the gpuslice labextension, in a real browser against a real hub, service
and single-user server: log in, spawn with a slice, see the status bar item, get an idle
warning (with the open notebook saved), click "Keep working" and see the deadline move; or
click "Save and release GPU" and see the server stop and the slice go back.

To refresh the screenshots in docs/images::

    GPUSLICE_SCREENSHOTS=docs/images .venv/bin/pytest tests/browser/test_lab.py
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
import requests

from tests.harness.hub import wait_for

from .lab import (
    chromium,
    find_in_palette,
    hub_config_for_lab,
    need_browser_and_labextension,
    screenshot_path,
    settled,
    spawn_in_browser,
    type_into_first_cell,
    write_lab_settings,
    write_notebook,
)

pytestmark = [pytest.mark.hub, pytest.mark.browser, pytest.mark.timeout(420)]

PROFILES = [
    {
        "name": "share-250",
        "display_name": "Quarter GPU, time-sliced",
        "kind": "share",
        "gpu_milli": 250,
        "gpu_memory_mib": 20480,
        "idle_timeout": 3600,
    },
    {"name": "gpu-1", "display_name": "Whole A100 80GB", "kind": "gpu", "count": 1},
]

# A short idle policy so the warning comes within seconds: warned after ~IDLE - LEAD
# seconds of idleness, culled LEAD seconds later (time enough to click).
IDLE_TIMEOUT = 50
WARNING_LEAD = 30
SERVER_ARGS = [
    f"--GPUSliceExtension.idle_timeout={IDLE_TIMEOUT}",
    f"--GPUSliceExtension.warning_lead={WARNING_LEAD}",
    "--GPUSliceExtension.sample_interval=1",
    "--GPUSliceExtension.idle_window=1",
    "--GPUSliceExtension.policy_from_service=False",
    "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
    # window.jupyterapp, for LOSE_CONNECTION
    "--LabApp.expose_app_in_browser=True",
]
STATUS_TEXT = "document.querySelector('.jp-gpuslice-status')?.textContent"
# What JupyterLab's service manager signals when it loses its server (a request that could
# not be made): the application's IConnectionLost handler answers it. Resolves after the
# next frame, when a dialog it opened is in the page.
LOSE_CONNECTION = """() => new Promise(resolve => {
    window.jupyterapp.serviceManager.connectionFailure.emit(new Error('connection lost'));
    requestAnimationFrame(() => requestAnimationFrame(resolve));
})"""


def gpu_status(hub: Any, user: str, token: str) -> dict[str, Any]:
    """The server extension's status, read with the user's own API token."""
    r = requests.get(
        f"{hub.url}/user/{user}/gpuslice/api/status",
        headers={"Authorization": f"token {token}"},
        timeout=30,
    )
    r.raise_for_status()
    return r.json()  # type: ignore[no-any-return]


def start(hub_factory: Any, tmp_path: Path, action: str = "kernel") -> tuple[Any, str, Path]:
    """A hub whose servers run the short idle policy (``action``: what an idle cull
    stops), user ann, and her notebook."""
    settings = write_lab_settings(tmp_path / "lab-settings")
    hub = hub_factory(
        spawner="gpuslice-simple",
        profiles=PROFILES,
        extra_hub_config=hub_config_for_lab(
            [
                *SERVER_ARGS,
                f"--GPUSliceExtension.idle_action={action}",
                f"--LabApp.user_settings_dir={settings}",
            ]
        ),
    )
    token = hub.add_user("ann")
    notebook = Path(hub.config["workdir"]) / "home" / "ann" / "analysis.ipynb"
    write_notebook(notebook, ["import math\n", "print(math.pi)\n"])
    return hub, token, notebook


def test_status_item_and_idle_warning_with_keep_working(hub_factory: Any, tmp_path: Path) -> None:
    sync_api = need_browser_and_labextension()
    hub, token, notebook = start(hub_factory, tmp_path)

    with chromium(sync_api, tmp_path) as page:
        spawn_in_browser(page, hub, "ann", "share-250")

        page.goto(f"{hub.url}/user/ann/lab/tree/analysis.ipynb")
        status = page.locator(".jp-gpuslice-status")
        status.wait_for(state="visible")
        page.wait_for_function(f"() => {STATUS_TEXT}.includes('Quarter GPU')")
        text = status.inner_text()
        # the name the spawn form showed, and the share's memory
        assert "GPU Quarter GPU, time-sliced · " in text and "/ 20 GiB" in text, text
        assert "(sim)" in text and "share-250" not in text, text
        assert "SIMULATED" in (status.get_attribute("title") or "")
        # its text is centred like the status bar's own text items
        ours = page.locator(".jp-gpuslice-status-text").bounding_box()
        theirs = page.locator("#jp-main-statusbar .jp-StatusBar-TextItem").first.bounding_box()
        assert ours and theirs
        middle = [box["y"] + box["height"] / 2 for box in (ours, theirs)]
        assert abs(middle[0] - middle[1]) <= 1.5, (ours, theirs)
        page.locator("#jp-main-statusbar").screenshot(
            path=str(screenshot_path(tmp_path, "lab-statusbar.png"))
        )

        # The kernel starts with the notebook; edit a cell without running it.
        type_into_first_cell(page, "  # edited before the warning")
        wait_for(
            lambda: gpu_status(hub, "ann", token)["kernels"],
            timeout=60,
            what="the notebook's kernel",
        )
        assert "edited before" not in notebook.read_text()

        # Idle: the server warns; the lab shows a sticky notification and saves the notebook.
        toast = page.locator(".Toastify__toast", has_text="idle on the GPU for")
        toast.wait_for(state="visible", timeout=IDLE_TIMEOUT * 1000)
        keep = toast.get_by_role("button", name="Keep working")
        assert keep.is_visible()
        # a kernel's warning: its cull keeps the slice; giving the GPU back is offered there
        # too, as the docs promise (issue 44: it offered only "Keep working")
        # it names the notebook whose kernel goes
        assert "The kernel of analysis.ipynb, idle on the GPU" in toast.inner_text()
        assert toast.get_by_role("button", name="Save and release GPU").is_visible()
        wait_for(
            lambda: "edited before the warning" in notebook.read_text(),
            timeout=20,
            what="the open notebook saved when the warning arrived",
        )
        page.wait_for_function(f"() => {STATUS_TEXT}.includes('idle: kernel stops in ')")
        assert "jp-gpuslice-status-warning" in (status.get_attribute("class") or "")
        settled(toast)
        page.screenshot(path=str(screenshot_path(tmp_path, "lab-idle-warning.png")))

        before = gpu_status(hub, "ann", token)
        (kernel,) = before["kernels"]
        assert kernel["warning"] is True
        keep.click()
        page.locator(".Toastify__toast", has_text="Keeping your GPU").wait_for(
            state="visible", timeout=30_000
        )
        after = wait_for(
            lambda: (
                (s := gpu_status(hub, "ann", token))["kernels"]
                and s["kernels"][0]["deadline"] > kernel["deadline"]
                and s
            ),
            timeout=20,
            what="the idle deadline moved by the keep-alive",
        )
        assert after["kernels"][0]["id"] == kernel["id"]  # the kernel was not culled
        # The warning goes (Toastify removes it after its exit animation).
        wait_for(
            lambda: not page.locator(".Toastify__toast", has_text="idle on the GPU for").count(),
            timeout=10,
            what="the warning to go once the user kept working",
        )
        page.screenshot(path=str(screenshot_path(tmp_path, "lab-kept-working.png")))

        # A busy kernel: the item shows the slice's use across its kernels (it once showed
        # only the server's own processes: 0 % while a kernel ran at 73 %).
        editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
        editor.click()
        page.keyboard.press("Control+a")
        page.keyboard.type("while True:\n    pass")
        page.keyboard.press("Shift+Enter")
        page.wait_for_function(f"() => /· ([2-9]\\d|100)% ·/.test({STATUS_TEXT})", timeout=60_000)

        # The jobs panel polls while it is open.
        find_in_palette(page, "Show GPU jobs", run=True)
        jobs_message = page.locator(".jp-gpuslice-jobs-message")
        page.locator(".jp-gpuslice-jobs").wait_for(state="visible")
        # A lost server the lab did not stop on purpose: the hub's dialog offers a restart.
        lost = page.locator(".jp-Dialog", has_text="Server unavailable or unreachable")
        page.evaluate(LOSE_CONNECTION)
        lost.wait_for(state="visible", timeout=10_000)
        assert lost.get_by_role("button", name="Restart").is_visible()
        lost.get_by_role("button", name="Dismiss").click()
        lost.wait_for(state="hidden")

        # The palette's release command: confirm, then the lab says what happened and polls
        # no more (no orange countdown, no failing status or jobs requests, and no
        # "Server unavailable" dialog: issue 44).
        polls: list[tuple[float, str]] = []
        page.on(
            "request",
            lambda r: polls.append((time.monotonic(), r.url)) if "gpuslice/api/" in r.url else None,
        )
        find_in_palette(page, "Release GPU", run=True)
        confirm = page.locator(".jp-Dialog", has_text="Release the GPU?")
        confirm.get_by_role("button", name="Release GPU").click()
        done = page.locator(".jp-Dialog", has_text="GPU released")
        done.wait_for(timeout=30_000)
        assert "start your server from the hub" in done.inner_text()
        released_at = time.monotonic()
        page.wait_for_function(f"() => {STATUS_TEXT} === 'GPU released'")
        assert "jp-gpuslice-status-warning" not in (status.get_attribute("class") or "")
        done.get_by_role("button", name="Stay on this page").click()
        hub.wait_gone("ann", timeout=60)
        held = hub.api("GET", "/api/allocations?user=ann&state=all", hub.service_token).json()
        reasons = [a["release_reason"] for a in held["allocations"]]
        assert reasons == ["released by its owner: released by the user"], reasons
        # a poll interval (5 s; the open jobs panel's 3 s) and more with no request from the
        # tab; the panel says why it stopped
        wait_for(lambda: time.monotonic() - released_at > 6, 20, "a poll interval")
        assert [u for t, u in polls if t > released_at + 0.5] == []
        assert "This server is stopping with its GPU slice" in jobs_message.inner_text()
        # the server is gone: JupyterLab's lost connection says nothing over what was said
        page.evaluate(LOSE_CONNECTION)
        assert not lost.count()


def test_save_and_release_gives_the_slice_back(hub_factory: Any, tmp_path: Path) -> None:
    sync_api = need_browser_and_labextension()
    # under the server action an idle cull stops the server: its warning offers release,
    # and says so once (the status's kernels carry the server's deadline: no second,
    # kernel-worded warning from them)
    hub, _token, notebook = start(hub_factory, tmp_path, action="server")
    with chromium(sync_api, tmp_path) as page:
        spawn_in_browser(page, hub, "ann", "share-250")
        held = hub.api("GET", "/api/allocations?user=ann", hub.service_token).json()
        assert [a["profile"] for a in held["allocations"]] == ["share-250"]

        # a second tab of the server: the release made in the first must reach it too
        other = page.context.new_page()
        other.goto(f"{hub.url}/user/ann/lab")
        page.goto(f"{hub.url}/user/ann/lab/tree/analysis.ipynb")
        type_into_first_cell(page, "  # unsaved work")

        toast = page.locator(".Toastify__toast", has_text="idle on the GPU for")
        toast.wait_for(state="visible", timeout=IDLE_TIMEOUT * 1000)
        assert toast.inner_text().startswith("This server, idle on the GPU")
        # two status polls later (the first one's warnings shown by the second), still one
        for _ in range(2):
            with page.expect_response(lambda r: "gpuslice/api/status" in r.url, timeout=20_000):
                pass
        assert page.locator(".Toastify__toast", has_text="idle on the GPU for").count() == 1
        other_warning = other.locator(".Toastify__toast", has_text="idle on the GPU for")
        other_warning.wait_for(state="visible", timeout=30_000)
        toast.get_by_role("button", name="Save and release GPU").click()
        done = page.locator(".jp-Dialog", has_text="GPU released")
        done.wait_for(timeout=30_000)
        assert "unsaved work" in notebook.read_text()
        # The other tab: no countdown to a cull that will not come, and it says why. (It
        # once kept its warning and showed 'GPU ?' once the server was gone.)
        told = other.locator(".Toastify__toast", has_text="GPU released in another tab")
        told.wait_for(state="visible", timeout=30_000)
        other.wait_for_function(f"() => {STATUS_TEXT} === 'GPU released'", timeout=10_000)
        wait_for(lambda: not other_warning.count(), 10, "the other tab's warning to go")
        # the tab that released is not told it was another
        assert not page.locator(".Toastify__toast", has_text="in another tab").count()
        hub.wait_gone("ann", timeout=60)
        # the other tab learnt of the release: no "Server unavailable" dialog once it is gone
        other.evaluate(LOSE_CONNECTION)
        assert not other.locator(".jp-Dialog", has_text="Server unavailable").count()
        # how to get a GPU again: the hub's home, where the server starts from the form
        done.get_by_role("button", name="Go to the hub").click()
        page.wait_for_url(re.compile(r"/hub/home"), timeout=30_000)
    wait_for(
        lambda: (
            not hub.api("GET", "/api/allocations?user=ann", hub.service_token).json()["allocations"]
        ),
        timeout=30,
        what="ann's slice released",
    )


def test_an_idle_server_is_culled_with_what_was_typed_after_its_warning(
    hub_factory: Any, tmp_path: Path
) -> None:
    sync_api = need_browser_and_labextension()
    # under the server action the cull stops the server, and with it anything unsaved
    hub, _token, notebook = start(hub_factory, tmp_path, action="server")
    with chromium(sync_api, tmp_path) as page:
        spawn_in_browser(page, hub, "ann", "share-250")
        # A second tab on the same notebook, unchanged in it: every save it made once went
        # over the other tab's, at the same moment, and left the file not even JSON.
        other = page.context.new_page()
        other.goto(f"{hub.url}/user/ann/lab/tree/analysis.ipynb")
        page.goto(f"{hub.url}/user/ann/lab/tree/analysis.ipynb")
        type_into_first_cell(page, "  # typed before the warning")
        toast = page.locator(".Toastify__toast", has_text="idle on the GPU for")
        toast.wait_for(state="visible", timeout=IDLE_TIMEOUT * 1000)
        assert "Notebooks saved, and again just before." in toast.inner_text()
        other.locator(".Toastify__toast", has_text="idle on the GPU for").wait_for()
        wait_for(
            lambda: "typed before the warning" in notebook.read_text(),
            timeout=20,
            what="the changed notebook saved at the warning",
        )
        # Typing is not GPU use: the cull still comes. What was typed goes with the server
        # unless the tab saves it before.
        type_into_first_cell(page, "  # typed after the warning")
        # a glance at the other tab: looking is not using, it must not take the saving over
        other.bring_to_front()
        polls: list[float] = []
        page.on(
            "request",
            lambda r: polls.append(time.monotonic()) if "gpuslice/api/status" in r.url else None,
        )
        culled = page.locator(".Toastify__toast", has_text="Server stopped, idle on the GPU")
        culled.wait_for(state="visible", timeout=(WARNING_LEAD + 60) * 1000)
        culled_at = time.monotonic()
        text = culled.inner_text()
        # saved before the stop, whole (one tab wrote it, once, and not under the stop)
        saved = nbformat.reads(notebook.read_text(), as_version=4)
        assert "typed after the warning" in saved.cells[0].source, saved.cells[0].source
        assert "typed before the warning" in saved.cells[0].source
        # the message names when the notebooks were last saved, and nothing is left unsaved
        assert re.search(r"Notebooks saved at \d\d:\d\d:\d\d\.", text), text
        # the other tab, not the one used, saved nothing and says whose the saving was
        gone = other.locator(".Toastify__toast", has_text="Server stopped, idle on the GPU")
        gone.wait_for(state="visible", timeout=30_000)
        assert "Saving was left to the tab used last." in gone.inner_text()
        # the status bar says so, and how to get a GPU again, and polls no more
        page.wait_for_function(f"() => {STATUS_TEXT} === 'GPU released (idle)'")
        status_title = page.locator(".jp-gpuslice-status").get_attribute("title") or ""
        assert "Start your server from the hub" in status_title, status_title
        # (a second or two; once, with the whole suite and another browser session on the
        # machine's two cores, over 60 s, for a reason not found: not this test's subject)
        hub.wait_gone("ann", timeout=150)
        wait_for(lambda: time.monotonic() - culled_at > 6, 20, "a poll interval")
        assert [t for t in polls if t > culled_at + 0.5] == []
        # Coming back to the server's address: the hub's page says why it is not running.
        page.goto(f"{hub.url}/user/ann/lab")
        notice = page.locator("#gpuslice-stopped")
        notice.wait_for(timeout=30_000)
        assert "culled for idleness" in notice.inner_text()
        assert page.locator("#start").is_visible()
