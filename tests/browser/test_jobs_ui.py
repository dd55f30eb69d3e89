"""Batch jobs from JupyterLab, end to end: a real hub, gpuslice service (local job backend),
single-user server with its jobs proxy, and Debian's Chromium. The command is found where
users look for it; the dialog shows live availability, refuses bad input itself and shows the
service's refusals; the submitted job runs, the Jobs panel follows it to ``completed``, and its
output notebook (with the parameters injected) opens.

Screenshots for the docs: ``GPUSLICE_SCREENSHOTS=docs/images .venv/bin/pytest <this file>``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
    write_lab_settings,
    write_notebook,
)

pytestmark = [pytest.mark.hub, pytest.mark.browser, pytest.mark.timeout(420)]

GRACE = 8

PROFILES = [
    {
        "name": "share-250",
        "display_name": "Quarter GPU, time-sliced",
        "kind": "share",
        "gpu_milli": 250,
        "gpu_memory_mib": 20480,
    },
    {
        "name": "mig-3g.40gb",
        "display_name": "Medium MIG slice (3g.40gb)",
        "kind": "mig",
        "mig_profile": "3g.40gb",
        "groups": ["physics"],
    },
]


def kernel_ids(hub: Any, token: str) -> list[str]:
    """The kernels running in ann's server, read with her own token."""
    r = requests.get(
        f"{hub.url}/user/ann/api/kernels", headers={"Authorization": f"token {token}"}, timeout=30
    )
    r.raise_for_status()
    return sorted(k["id"] for k in r.json())


def test_submit_the_open_notebook_and_follow_it_to_its_output(
    hub_factory: Any, tmp_path: Path
) -> None:
    sync_api = need_browser_and_labextension()
    settings = write_lab_settings(tmp_path / "lab-settings")
    hub = hub_factory(
        spawner="gpuslice-simple",
        profiles=PROFILES,
        extra_hub_config=hub_config_for_lab(
            [
                f"--LabApp.user_settings_dir={settings}",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
            ]
        ),
        # short enough to see a preemption through in the test (its default is 60 s)
        extra_service_config=f"c.JobManager.preempt_grace = {GRACE}\n",
    )
    token = hub.add_user("ann")
    home = Path(hub.config["workdir"]) / "home" / "ann"
    write_notebook(
        home / "train.ipynb",
        [
            "epochs = 1\n",
            "print('trained for', epochs, 'epochs')\n",
            "open('trained.txt', 'w').write(str(epochs))\n",  # next to the notebook
        ],
        parameters_cell=True,
    )
    write_notebook(
        home / "untagged.ipynb",
        [
            "epochs = 1\n",
            "print('epochs', epochs)\n",
            # code that takes no notice of a preemption (as a long call into a library
            # may not): it runs on until the grace period ends
            "import signal, time\nsignal.signal(signal.SIGUSR1, signal.SIG_IGN)\ntime.sleep(600)\n",
        ],
    )

    with chromium(sync_api, tmp_path) as page:
        spawn_in_browser(page, hub, "ann", "share-250")
        page.goto(f"{hub.url}/user/ann/lab/tree/train.ipynb")
        page.locator(".jp-gpuslice-status").wait_for(state="visible")

        # The command is in the file browser's context menu for notebooks...
        page.locator('.jp-DirListing-item[data-file-type="notebook"]').first.click(button="right")
        page.locator(".lm-Menu-itemLabel", has_text="Submit as GPU job…").wait_for()
        page.keyboard.press("Escape")
        page.locator(".lm-Menu").wait_for(state="hidden")
        # ... in the command palette ...
        find_in_palette(page, "Submit as GPU job")
        # ... and in the notebook toolbar, which is what we click.
        page.locator('.jp-NotebookPanel-toolbar [data-jp-item-name="gpuslice-submit"]').click()

        dialog = page.locator(".jp-Dialog")
        dialog.get_by_text("Submit as GPU job").first.wait_for()
        assert "train.ipynb" in dialog.locator(".jp-gpuslice-submit-path").inner_text()
        page.wait_for_function(
            "() => document.querySelector('.jp-Dialog select[name=profile]')?.options.length === 2"
        )
        profile = dialog.locator("select[name=profile]")
        options = profile.locator("option").all_inner_texts()
        assert options[0].startswith("Quarter GPU, time-sliced — "), options
        assert " free" in options[0], options
        assert "unavailable: not allowed for your groups" in options[1], options
        assert profile.input_value() == "share-250"  # the first available one
        # only the classes ann may submit: high is the admins' (JobManager.priority_access)
        priorities = dialog.locator("select[name=priority] option").all_inner_texts()
        assert priorities == ["preemptible", "normal"], priorities
        # no time window nor burst partition is configured: their fields are not shown
        # (once, a style that made the fields flex boxes overrode their hidden attribute)
        assert dialog.locator("input[name=burstable]").is_hidden()
        assert dialog.locator("select[name=time_window]").is_hidden()

        # Empty fields say what the service will use (its figures, not "no limit").
        runtime = dialog.locator("input[name=max_runtime]")
        page.wait_for_function(
            "() => document.querySelector('.jp-Dialog input[name=max_runtime]')"
            "?.placeholder.startsWith('empty: 24h')"
        )
        assert runtime.get_attribute("placeholder") == "empty: 24h 00m (at most 168h 00m)"
        checkpoint = dialog.locator("input[name=checkpoint_interval]")
        assert checkpoint.input_value() == ""
        # ... the interval it will get, never past the max runtime typed (issue 44: with 5 min
        # it said "10m 00s" and the job got 300 s)
        default = "empty: 10m 00s (at most the max runtime, and 24h)"
        assert checkpoint.get_attribute("placeholder") == default
        runtime.fill("5m")
        assert (
            checkpoint.get_attribute("placeholder") == "empty: 5m 00s (capped at the max runtime)"
        )
        runtime.fill("")
        assert checkpoint.get_attribute("placeholder") == default

        # Bad input is refused in the dialog itself, every problem named, nothing sent.
        dialog.locator("input[name=max_runtime]").fill("soon")
        dialog.locator("textarea[name=parameters]").fill("1x = 2")
        dialog.get_by_role("button", name="Submit").click()
        errors = page.locator(".jp-gpuslice-submit-errors")
        errors.get_by_text("is not a duration").wait_for()
        assert "not a valid Python variable name" in errors.inner_text()
        # the errors are at the top of the dialog, in sight, not under the fields
        top = page.locator(".jp-Dialog .jp-gpuslice-submit").bounding_box()
        box = errors.bounding_box()
        assert top and box and box["y"] - top["y"] < 40, (top, box)

        # The service's own refusal is shown in the dialog, which keeps what was typed.
        dialog = page.locator(".jp-Dialog")
        dialog.locator("input[name=max_runtime]").fill("")
        dialog.locator("input[name=checkpoint_interval]").fill("2d")
        dialog.locator("textarea[name=parameters]").fill("epochs = 3")
        dialog.get_by_role("button", name="Submit").click()
        page.locator(".jp-gpuslice-submit-errors").get_by_text(
            "Submitting the job was refused: field 'checkpoint_interval' must be 1 to 86400"
        ).wait_for()
        dialog = page.locator(".jp-Dialog")
        assert dialog.locator("textarea[name=parameters]").input_value() == "epochs = 3"

        dialog.locator("input[name=checkpoint_interval]").fill("30s")
        dialog.locator("input[name=max_runtime]").fill("10m")
        dialog.locator("select[name=priority]").select_option("normal")
        settled(dialog.locator(".jp-Dialog-content"))
        dialog.locator(".jp-Dialog-content").screenshot(
            path=str(screenshot_path(tmp_path, "lab-submit-dialog.png"))
        )
        dialog.get_by_role("button", name="Submit").click()

        # The Jobs panel opens and follows the job to completed.
        card = page.locator(".jp-gpuslice-job").first
        card.wait_for()
        assert "share-250 · normal" in card.inner_text()
        page.wait_for_function(
            "() => document.querySelector('.jp-gpuslice-job')?.dataset.state === 'completed'",
            timeout=180_000,
        )
        # Every cell ran (the runner adds one with the injected parameters).
        text = card.inner_text()
        assert re.search(r"\b(\d+) / \1 cells", text), text
        # when it ran, and no word about checkpoints once it is done
        assert re.search(r"ended (\d+m )?\d+s ago, ran \d+", text), text
        assert "checkpoint" not in text, text
        job_id = card.get_attribute("data-job-id")
        output = home / "gpu-jobs" / f"train-{job_id}" / "output.ipynb"
        wait_for(output.exists, timeout=60, what="the job's output copied into ann's folder")
        assert "trained for 3 epochs" in output.read_text()
        # it ran in the notebook's folder: what it wrote by a relative path is there
        assert (home / "trained.txt").read_text() == "3"

        card.get_by_role("button", name="Log").click()
        card.locator(".jp-gpuslice-job-log").wait_for()
        wait_for(
            lambda: card.locator(".jp-gpuslice-job-log").inner_text().strip(),
            timeout=30,
            what="the job's log in the panel",
        )
        # The open log survives the panel's polls: the same node, its selection kept (each
        # poll once rebuilt it, scrolled it to the bottom and dropped what was selected).
        page.evaluate(
            """() => {
                const log = document.querySelector('.jp-gpuslice-job-log');
                log.dataset.marked = 'yes';
                window.getSelection().selectAllChildren(log);
            }"""
        )
        for _ in range(2):
            with page.expect_response(lambda r: "gpuslice/api/jobs" in r.url, timeout=20_000):
                pass
        kept = page.evaluate(
            """() => [document.querySelector('.jp-gpuslice-job-log')?.dataset.marked,
                      window.getSelection().toString().length]"""
        )
        assert kept[0] == "yes" and kept[1] > 0, kept
        done = page.locator(".Toastify__toast", has_text="GPU job train completed.")
        done.wait_for(timeout=60_000)
        settled(done)
        page.screenshot(path=str(screenshot_path(tmp_path, "lab-jobs-panel.png")))

        kernels = kernel_ids(hub, token)
        outputs = output.parent

        def listed() -> list[str]:
            return sorted(p.name for p in outputs.iterdir() if not p.name.startswith("."))

        before = listed()
        assert "output.ipynb" in before, before
        card.get_by_role("button", name="Open output").click()
        # its tab is the file's (JupyterLab renames a document whose tab is renamed) ...
        tab = page.locator(
            ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text="output.ipynb"
        )
        tab.wait_for()
        page.locator(".jp-OutputArea-output", has_text="trained for 3 epochs").wait_for()
        # ... and reading it starts no kernel on the GPU slice
        visible = ".jp-NotebookPanel:not(.lm-mod-hidden)"
        page.locator(f"{visible} .jp-Toolbar-kernelName", has_text="No Kernel").wait_for()
        assert kernel_ids(hub, token) == kernels
        # opening it changed nothing in ann's folder (a tab label set on the document once
        # renamed output.ipynb to "train #1 output", extension lost)
        assert listed() == before
        assert card.get_by_role("button", name="Resubmit").is_visible()

        # A notebook with no parameters cell that sets the parameter itself: the job would
        # compute with its own value, and the lab says so when it is submitted.
        page.goto(f"{hub.url}/user/ann/lab/tree/untagged.ipynb")
        # The lab restores the train.ipynb tab too; once untagged.ipynb is on screen, its
        # toolbar's button submits it, whichever notebook the lab considers current.
        page.locator(
            ".lm-DockPanel-tabBar .lm-TabBar-tab.lm-mod-current", has_text="untagged.ipynb"
        ).wait_for()
        visible = ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-NotebookPanel-toolbar"
        page.locator(f'{visible} [data-jp-item-name="gpuslice-submit"]').click()
        dialog = page.locator(".jp-Dialog")
        # the button submits the notebook whose toolbar it is in, not the restored train tab
        dialog.get_by_text("Submit as GPU job").first.wait_for()
        assert "untagged.ipynb" in dialog.locator(".jp-gpuslice-submit-path").inner_text()
        dialog.locator("textarea[name=parameters]").fill("epochs = 3")
        page.wait_for_function(
            "() => document.querySelector('.jp-Dialog select[name=profile]')?.value"
        )
        dialog.get_by_role("button", name="Submit").click()
        warning = page.locator(".Toastify__toast", has_text="is set again in code cell 1")
        warning.wait_for(timeout=60_000)
        assert "your value 3 is overwritten (+1 in the job's log)" in warning.inner_text()

        # An admin preempts it: the lab says it is asked to checkpoint and for how long, then
        # what came of it (issue 44: "is preempted; it runs again when a slice is free",
        # while it ran on for its whole grace period, and was killed)
        card = page.locator(".jp-gpuslice-job").first
        card.get_by_text("untagged").first.wait_for()
        untagged = card.get_attribute("data-job-id")
        wait_for(
            lambda: hub.api("GET", f"/api/jobs/{untagged}", token).json()["cells_done"] == 3,
            60,
            "the untagged job in its last cell, which ignores the preemption signal",
        )
        admin = hub.add_user("admin")
        r = hub.api("POST", f"/api/jobs/{untagged}/preempt", admin, json={"reason": "a demo"})
        assert r.status_code == 202, r.text
        asked = page.locator(".Toastify__toast", has_text="GPU job untagged is asked to checkpoint")
        asked.wait_for(timeout=30_000)
        assert re.search(
            r"\(a demo \(by admin\)\); it has up to \d+s before it is stopped\.", asked.inner_text()
        )
        killed = page.locator(
            ".Toastify__toast",
            has_text=f"GPU job untagged was preempted: killed after its {GRACE} s grace period;",
        )
        killed.wait_for(timeout=60_000)
        assert re.search(r"; \d+s of work to redo; requeued\.", killed.inner_text())

        # Cancelling it asks first (its work is lost); keeping it keeps it.
        card.get_by_role("button", name="Cancel").click()
        confirm = page.locator(".jp-Dialog")
        confirm.get_by_text("Cancel GPU job").wait_for()
        confirm.get_by_role("button", name="Keep it").click()
        confirm.wait_for(state="hidden")
        assert hub.api("GET", f"/api/jobs/{untagged}", token).json()["state"] != "cancelled"
        card.get_by_role("button", name="Cancel").click()
        page.locator(".jp-Dialog").get_by_role("button", name="Cancel job").click()
        page.wait_for_function(
            "() => document.querySelector('.jp-gpuslice-job')?.dataset.state === 'cancelled'"
        )
        # and still nothing renamed, however long the output's tab stayed open
        assert listed() == before
    hub.hub_api("DELETE", "/users/ann/server")
    hub.wait_gone("ann")
