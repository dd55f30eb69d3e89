"""Overcommit of shares behind a real JupyterHub and service process: a holder whose history
leaves room gets more shares on the same GPUs, keeps the memory cap they asked for, and the
admin sees what was promised and what it cost (API, metrics)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuslice_spawner.env import slice_env
from tests.browser.lab import CHROMIUM, chromium, login
from tests.harness.engines import need, need_module
from tests.harness.hub import SIM_HOSTS, SIM_PROFILES
from tests.service.conftest import build_ledger
from tests.service.test_openapi import SPEC_PATH, check
from tests.service.test_overcommit import history

OVERCOMMIT = "/api/admin/overcommit"


@pytest.mark.hub
@pytest.mark.browser
def test_a_holder_with_room_gets_more_shares_and_keeps_their_cap(hub_factory: Any, tmp_path: Path):
    need(Path(CHROMIUM).exists(), "Chromium (apt-get install chromium)")
    sync_api = need_module("playwright.sync_api")
    spec = yaml.safe_load(SPEC_PATH.read_text())
    url = f"sqlite:///{tmp_path}/seeded.sqlite"
    seed = build_ledger(url, profiles=SIM_PROFILES, hosts=SIM_HOSTS)
    # ann held a 20 GiB share for 30 hours and used at most 6000 MiB: charged 0.8
    history(seed, "ann", 6000, held=timedelta(hours=30))
    seed.db.dispose()
    hub = hub_factory(
        db_url=url, extra_service_config="c.GPUSliceService.share_overcommit_ratio = 1.25\n"
    )
    admin, ann = hub.add_user("admin"), hub.add_user("ann")
    bob = hub.add_user("bob")

    # two whole GPUs take 8 shares of 250 charged in full, 10 of ann's charged 200
    allocs = []
    for i in range(10):
        r = hub.allocate("ann", "share-250", f"s{i}")
        assert r.status_code == 201, r.text
        allocs.append(r.json())
    for alloc in allocs:
        (a,) = alloc["assignments"]
        assert (a["milli"], a["memory_mib"]) == (250, 20480)
        assert (a["charged_milli"], a["charged_memory_mib"]) == (200, 16384)
        # the server is told the cap it asked for, which its extension enforces
        env = slice_env(alloc, "http://service")
        assert env["GPUSLICE_MEMORY_CAP_MIB"] == "20480" and env["GPUSLICE_GPU_MILLI"] == "250"
    for user, server in (("ann", "s10"), ("bob", "")):
        r = hub.allocate(user, "share-250", server)
        assert r.status_code == 409, r.text
        assert "more held through overcommit" in r.json()["message"]

    # what it costs: ann's first server nears its cap, and says so
    first = allocs[0]["id"]
    r = hub.api(
        "POST",
        f"/api/allocations/{first}/usage",
        ann,
        json={"utilization": 90, "memory_mib": 19000, "idle_seconds": 0, "interval_seconds": 60},
    )
    assert r.status_code == 200, r.text
    event = {
        "kind": "memory-warning",
        "reason": "kernel near its memory cap",
        "detail": {"allocation_id": first, "kernel_id": "k1", "memory_mib": 19000},
    }
    r = hub.api("POST", "/api/events", ann, json=event)
    assert r.status_code == 201, r.text

    # another user sees that shares are held, not what ann is charged (her memory use)
    inventory = hub.api("GET", "/api/inventory", bob).json()
    seen = [h for g in inventory["hosts"] for gpu in g["gpus"] for h in gpu.get("holders", [])]
    assert seen and all(h["charged_memory_mib"] is None for h in seen), seen
    mine = hub.api("GET", "/api/inventory", ann).json()
    mine_seen = [h for g in mine["hosts"] for gpu in g["gpus"] for h in gpu.get("holders", [])]
    assert {h["charged_memory_mib"] for h in mine_seen} == {16384}

    r = hub.api("GET", OVERCOMMIT, ann)
    assert r.status_code == 403
    view = check(spec, OVERCOMMIT, "get", hub.api("GET", OVERCOMMIT, admin))
    assert view["settings"]["ratio"] == 1.25
    assert len(view["gpus"]) == 2
    for gpu in view["gpus"]:
        assert gpu["memory_mib"] == 81920 and gpu["promised_memory_mib"] == 5 * 20480
        assert gpu["charged_memory_mib"] == 5 * 16384 and gpu["charged_milli"] == 1000
    assert sorted(g["in_use_memory_mib"] or 0 for g in view["gpus"]) == [0, 19000.0]
    assert view["totals"] == {
        "overcommitted_shares": 10,
        "gpus": 2,
        "promised_beyond_memory_mib": 2 * (5 * 20480 - 81920),
    }
    assert view["cost"]["memory_warnings"] == 1 and view["cost"]["overcommitted_allocations"] == 10
    (charge,) = view["next_charges"]
    assert (charge["user"], charge["profile"], charge["charge"]) == ("ann", "share-250", 0.8)

    metrics = hub.api("GET", "/metrics", admin).text
    assert "gpuslice_overcommit_shares 10.0" in metrics
    assert f"gpuslice_overcommit_memory_mib {10 * (20480 - 16384)}.0" in metrics

    # the admin panel says the same
    with chromium(sync_api, tmp_path) as page:
        login(page, hub.url, "admin")
        page.goto(f"{hub.url}/services/gpuslice/admin")
        page.wait_for_selector("body[data-loaded=true]")
        summary = page.inner_text("#gs-overcommit-summary")
        assert "10 overcommitted shares on 2 GPUs" in summary, summary
        assert "40 GiB promised beyond" in summary and "1 memory-cap warnings" in summary, summary
        assert page.locator("#gs-overcommit-table tbody tr").count() == 2
        used = page.locator("#gs-overcommit-table tbody tr", has_text="using 18.6 GiB")
        assert "charged 16 GiB" in used.inner_text()
        next_row = page.locator("#gs-overcommit-next tr[data-user=ann]")
        assert "80% of the share" in next_row.inner_text()
        held = page.locator(f'li[data-allocation="{first}"]').inner_text()
        assert "overcommitted: charged 16 GiB" in held, held
