"""Helpers for driving JupyterLab in Debian's Chromium (Playwright cannot download its own
browser here, so it launches /usr/bin/chromium through ``executable_path``)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.harness.engines import need, need_module
from tests.harness.markers import require

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]
LABEXT_IN_VENV = Path(sys.prefix) / "share/jupyter/labextensions/gpuslice-labextension"


def need_browser_and_labextension() -> Any:
    """The Playwright sync API, once Chromium and the built labextension are in place."""
    need(Path(CHROMIUM).exists(), "Chromium (apt-get install chromium)")
    need(
        (LABEXT_IN_VENV / "package.json").exists(),
        f"the labextension installed in {LABEXT_IN_VENV} (make labextension)",
    )
    return need_module("playwright.sync_api")


def screenshot_path(tmp_path: Path, name: str) -> Path:
    """Where a screenshot goes: ``$GPUSLICE_SCREENSHOTS`` (e.g. docs/images), else tmp_path,
    so ordinary test runs do not rewrite the committed images."""
    folder = Path(os.environ.get("GPUSLICE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder / name


KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}


def write_notebook(path: Path, sources: list[str], parameters_cell: bool = False) -> None:
    """A notebook of code cells; the first one tagged ``parameters`` when asked (papermill
    style, where a batch job's parameters are injected)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    cells: list[dict[str, Any]] = [
        {
            "cell_type": "code",
            "execution_count": None,
            "id": f"cell-{i}",
            "metadata": {"tags": ["parameters"]} if parameters_cell and i == 0 else {},
            "outputs": [],
            "source": source,
        }
        for i, source in enumerate(sources)
    ]
    path.write_text(
        json.dumps(
            {
                "cells": cells,
                "metadata": {"kernelspec": KERNELSPEC},
                "nbformat": 4,
                "nbformat_minor": 5,
            }
        )
    )


def login(page: Any, hub_url: str, user: str) -> None:
    page.goto(f"{hub_url}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", "test-password")
    page.click("#login_submit")
    page.wait_for_url("**/hub/**")


def write_lab_settings(folder: Path) -> Path:
    """User settings for the spawned JupyterLab: no prompt about Jupyter news (it would
    cover the notifications under test and appear in the screenshots)."""
    target = folder / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"fetchNews": "false"}))
    return folder


def hub_config_for_lab(workdir_args: list[str]) -> str:
    """extra_hub_config that passes ``workdir_args`` to every single-user server."""
    return f"c.Spawner.args = list(c.Spawner.args) + {workdir_args!r}\n"


@contextmanager
def chromium(sync_api: Any, tmp_path: Path) -> Iterator[Any]:
    """A page in Debian's Chromium with a fresh profile, closed afterwards."""
    require("browser", "drives Chromium")
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 800},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(120_000)
            yield page
        except BaseException:
            show_failure(page, tmp_path)
            raise
        finally:
            context.close()


def show_failure(page: Any, tmp_path: Path) -> None:
    """What the user would have seen when a browser test failed: a screenshot, and the text
    of open dialogs and notifications (printed, so pytest shows it with the failure)."""
    try:
        shot = tmp_path / "failure.png"
        page.screenshot(path=str(shot))
        print(f"screenshot at failure: {shot}")
        for selector in (".jp-Dialog", ".Toastify__toast"):
            for text in page.locator(selector).all_inner_texts():
                print(f"{selector}: {text!r}")
    except Exception as e:  # the page may be gone; the original failure matters more
        print(f"no screenshot at failure: {e}")


def spawn_in_browser(page: Any, hub: Any, user: str, profile: str) -> None:
    """Log in and start the server through the spawn form with ``profile`` chosen."""
    login(page, hub.url, user)
    page.goto(f"{hub.url}/hub/spawn")
    page.locator(f'[data-profile="{profile}"] input').check()
    page.locator("form#spawn_form input[type=submit], form#spawn_form button").first.click()
    hub.wait_ready(user, timeout=120)
    # The spawn-pending page redirects to the server once it is up; let that land first, or
    # it interrupts the test's own navigation.
    page.wait_for_url(f"**/user/{user}/**", timeout=120_000)
    page.wait_for_load_state()


def find_in_palette(page: Any, label: str, run: bool = False) -> None:
    """Open the command palette and find ``label`` in it (``run``: and run it). Opening it
    is retried: the modal palette closes when it loses focus, which a busy page can make it
    do at once."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    palette = page.locator(".lm-CommandPalette-input")
    for _ in range(3):
        page.locator(".lm-MenuBar-itemLabel", has_text="View").click()
        page.locator(".lm-Menu-itemLabel", has_text="Activate Command Palette").click()
        try:
            palette.fill(label, timeout=10_000)
            page.locator(".lm-CommandPalette-item", has_text=label).wait_for(timeout=10_000)
        except PlaywrightTimeout:
            page.keyboard.press("Escape")
            continue
        if run:
            page.locator(".lm-CommandPalette-item", has_text=label).first.click()
        else:
            page.keyboard.press("Escape")
        return
    raise AssertionError(f"{label!r} not found in the command palette")


def settled(locator: Any, timeout: float = 10) -> None:
    """Wait until an element stops moving (a toast slides in), so screenshots are whole."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        box = locator.bounding_box()
        if box is not None and box == last:
            return
        last = box
        locator.page.wait_for_timeout(150)  # one animation frame batch between two readings
    raise TimeoutError(f"{locator} kept moving for {timeout}s")


def type_into_first_cell(page: Any, text: str) -> None:
    """Append ``text`` to the first cell's source (unsaved), and make sure it landed: a click
    while JupyterLab is still laying out the notebook can leave the editor without focus."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    editor = page.locator(".jp-Notebook .jp-Cell .cm-content").first
    for _ in range(3):
        editor.click()
        page.keyboard.press("End")
        page.keyboard.type(text)
        try:
            editor.get_by_text(text.strip()).wait_for(timeout=5_000)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"could not type {text!r} into the first cell")
