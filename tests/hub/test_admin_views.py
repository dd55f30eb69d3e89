"""The admin read endpoints behind a real JupyterHub: who may read them, what they show
after a real allocation and usage report, and the sampler filling the usage series."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpuslice_hub.scopes import ADMIN_SCOPE
from tests.harness.engines import need_module
from tests.harness.hub import wait_for
from tests.service.test_openapi import SPEC_PATH, check

OVERVIEW = "/api/admin/overview"
USAGE = "/api/admin/usage"


@pytest.mark.hub
def test_admins_read_the_pool_and_its_history_and_users_may_not(hub_factory: Any):
    need_module("openapi_schema_validator")
    spec = yaml.safe_load(SPEC_PATH.read_text())
    hub = hub_factory(extra_service_config="c.GPUSliceService.usage_sample_interval = 0.5\n")
    admin, ann = hub.add_user("admin"), hub.add_user("ann")

    r = hub.api("GET", OVERVIEW, allow_redirects=False)
    assert r.status_code == 403 and "authentication required" in r.json()["message"]
    for path in (OVERVIEW, USAGE):
        r = hub.api("GET", path, ann)
        assert r.status_code == 403 and ADMIN_SCOPE in r.json()["message"], r.text
        check(spec, path, "get", r)

    alloc = hub.allocate("ann", "mig-1g.10gb").json()
    r = hub.api(
        "POST",
        f"/api/allocations/{alloc['id']}/usage",
        ann,
        json={"utilization": 40, "memory_mib": 3000, "idle_seconds": 5, "interval_seconds": 60},
    )
    assert r.status_code == 200, r.text

    view = check(spec, OVERVIEW, "get", hub.api("GET", OVERVIEW, admin))
    assert view["simulated"] is True and view["backend"] == "simulated"
    held = [
        s for h in view["hosts"] for g in h["gpus"] for s in g["slices"] if s["holder"] is not None
    ]
    assert len(held) == 1
    assert held[0]["mig_uuid"] == alloc["assignments"][0]["mig_uuid"]
    holder = held[0]["holder"]
    assert holder["allocation_id"] == alloc["id"] and holder["user"] == "ann"
    assert holder["utilization"] == 40 and holder["memory_used_mib"] == 3000
    totals = view["totals"]
    assert totals["allocated_milli"] == 142 and totals["active_allocations"] == 1
    assert totals["used_milli"] == 57 and totals["reported_milli"] == 142  # 40 % of 142
    assert totals["fragmented_milli"] == 285  # the 2g instance: no profile asks for it

    for query in ("days=0", "days=91", "days=week", "points=0", "points=2001"):
        r = hub.api("GET", f"{USAGE}?{query}", admin)
        assert r.status_code == 400, (query, r.text)
        assert query.split("=")[0] in r.json()["message"]
        check(spec, USAGE, "get", r)

    def sampled() -> dict[str, Any] | None:
        usage = hub.api("GET", f"{USAGE}?days=1", admin).json()
        series = usage["series"]
        # taken after the usage report (one taken between the allocation and the report
        # knows the allocation but not its use)
        known = any(p["allocated_milli"] == 142 and p["used_milli"] == 57 for p in series)
        return usage if known else None

    usage = wait_for(sampled, 30, "a usage sample taken after the usage report")
    r = hub.api("GET", f"{USAGE}?days=1&points=50", admin)
    usage = check(spec, USAGE, "get", r)
    assert usage["interval_seconds"] == pytest.approx(86400 / 50)
    latest = usage["series"][-1]
    assert latest["capacity_milli"] == 3000 and latest["used_milli"] == 57
    (group,) = usage["groups"]
    assert group["group"] == "(no group)" and group["allocations_30d"] == 1
    # the 1g instance (0.142 GPU) held for the few seconds this test has run
    assert 0 < group["interactive_gpu_hours_30d"] < 0.142 * 300 / 3600
    assert group["batch_gpu_hours_30d"] == 0
    assert "usage sample failed" not in hub.log()

    # the capacity check over the same samples, and ann's quota suggestion from her slice
    capacity = check(
        spec, "/api/admin/capacity", "get", hub.api("GET", "/api/admin/capacity", admin)
    )
    week = capacity["windows"][0]
    assert week["samples"] >= 1 and 0 < week["allocation_rate"] < 1
    # seconds of samples: too little history for the own/rent lines, said as such
    assert [v["code"] for v in capacity["verdicts"]] == ["history", "no-queue"]
    r = hub.api("GET", "/api/admin/quota-suggestions", admin)
    suggestions = check(spec, "/api/admin/quota-suggestions", "get", r)["suggestions"]
    (row,) = suggestions
    assert (row["subject"], row["name"]) == ("user", "ann")
    assert (row["peak_slices"], row["peak_milli"]) == (1.0, 142)
    # 1 * 1.2 + 1 -> 3 slices; 142 * 1.2 + 250 = 420.4 -> 450 milli
    assert row["suggested"] == {"max_slices": 3, "max_milli": 450}
    assert row["current"] is None and row["change"] == "new"
