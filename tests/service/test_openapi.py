"""docs/openapi.yaml: valid OpenAPI, documents every route of the service, and is what a real
service answers (responses from a running hub validated against the documented schemas)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from tornado import web

from gpuslice_hub.app import GPUSliceService
from tests.harness.engines import need_module

SPEC_PATH = Path(__file__).resolve().parents[2] / "docs" / "openapi.yaml"
METHODS = ("get", "post", "put", "patch", "delete")


@pytest.fixture(scope="module")
def spec() -> dict[str, Any]:
    return yaml.safe_load(SPEC_PATH.read_text())


def test_spec_is_valid_openapi(spec: dict[str, Any]):
    validator = need_module("openapi_spec_validator")
    validator.validate(spec)


def test_the_validator_catches_a_broken_spec(spec: dict[str, Any]):
    validator = need_module("openapi_spec_validator")
    broken = yaml.safe_load(SPEC_PATH.read_text())
    del broken["paths"]["/api/allocations"]["post"]["responses"]
    with pytest.raises(Exception, match="responses"):
        validator.validate(broken)


def app_routes() -> list[tuple[re.Pattern[str], set[str]]]:
    """(path regex, HTTP methods) of every handler the service's Tornado app serves."""
    app = GPUSliceService().make_app()
    routes = []
    for rule in app.wildcard_router.rules:
        handler = rule.target
        if issubclass(handler, web.StaticFileHandler):
            continue  # the admin panel's script and stylesheet, not an API
        methods = {
            m
            for m in METHODS
            if getattr(handler, m) is not getattr(web.RequestHandler, m)  # overridden
        }
        routes.append((rule.matcher.regex, methods))
    return routes


def concrete(spec: dict[str, Any], path: str) -> str:
    """A documented path as a request would name it (prefix added, parameters filled)."""
    base = spec["servers"][0]["url"].rstrip("/")
    return base + re.sub(r"\{[^}]+\}", "1", path)


def test_every_route_and_method_is_documented(spec: dict[str, Any]):
    routes = app_routes()
    assert len(routes) >= 9
    documented = {p: {m for m in ops if m in METHODS} for p, ops in spec["paths"].items()}
    for regex, methods in routes:
        paths = [p for p in documented if regex.fullmatch(concrete(spec, p))]
        assert paths, f"route {regex.pattern} is not in docs/openapi.yaml"
        assert len(paths) == 1, (regex.pattern, paths)
        assert documented[paths[0]] == methods, (
            f"{paths[0]}: the app serves {sorted(methods)}, "
            f"the spec documents {sorted(documented[paths[0]])}"
        )
    for path in documented:
        assert any(regex.fullmatch(concrete(spec, path)) for regex, _ in routes), (
            f"{path} is documented but the app has no such route"
        )


def test_the_admin_guides_route_table_lists_every_api_route(spec: dict[str, Any]):
    # (issue 48: it omitted four admin routes) Parameters by position, not by name: the
    # guide writes {id} where the spec writes {job_id}.
    guide = (SPEC_PATH.parent / "admin-guide.md").read_text()
    table = guide.split("| method | path | who | what |", 1)[1].split("\n\n", 1)[0]
    listed = set()
    for row in table.splitlines()[2:]:
        cells = row.split("|")
        for path in re.findall(r"`([^`?]+)", cells[2]):
            for method in cells[1].split(","):
                listed.add((method.strip(), re.sub(r"\{[^}]*\}", "{}", path)))
    for path, ops in spec["paths"].items():
        if not path.startswith(("/api/", "/metrics")):
            continue  # the pages (/, /admin, the OAuth callback) are for browsers
        shape = re.sub(r"\{[^}]*\}", "{}", path.lstrip("/"))
        for method in ops:
            if method in METHODS:
                assert (method.upper(), shape) in listed, f"{method.upper()} {path}"


# --- a real service answers as documented ------------------------------------------


def check(spec: dict[str, Any], path: str, method: str, response: Any) -> Any:
    """Assert ``response`` has a documented status and its JSON matches the schema."""
    from openapi_schema_validator import OAS30Validator

    operation = spec["paths"][path][method]
    status = str(response.status_code)
    assert status in operation["responses"], (path, method, status, response.text)
    documented = operation["responses"][status]
    if "$ref" in documented:
        documented = spec["components"]["responses"][documented["$ref"].rsplit("/", 1)[1]]
    content = documented.get("content", {})
    if "application/json" not in content:
        return None
    body = response.json()
    # refs ("#/components/...") resolve against a root that carries the components
    schema = {"allOf": [content["application/json"]["schema"]], "components": spec["components"]}
    OAS30Validator(schema).validate(body)
    return body


@pytest.mark.hub
def test_a_running_service_answers_as_documented(spec: dict[str, Any], hub_factory: Any):
    need_module("openapi_schema_validator")
    hub = hub_factory()
    ann = hub.add_user("ann")

    check(spec, "/api/health", "get", hub.api("GET", "/api/health"))
    created = check(
        spec,
        "/api/allocations",
        "post",
        hub.allocate("ann", "mig-1g.10gb"),
    )
    assert created["state"] == "active" and created["idle_timeout"] == 600
    alloc = f"/api/allocations/{created['id']}"
    again = hub.allocate("ann", "mig-1g.10gb")
    assert again.status_code == 200
    check(spec, "/api/allocations", "post", again)
    for body, status in (
        ({"profile": "mig-3g.40gb", "server_name": "b"}, 403),
        ({"profile": "nope", "server_name": "b"}, 404),
        ({"profile": "gpu-1", "colour": "red"}, 400),
        ({"profile": "gpu-1", "server_name": "c", "reason": "x" * (2 << 20)}, 413),
    ):
        r = hub.api("POST", "/api/allocations", hub.service_token, json={**body, "user": "ann"})
        assert r.status_code == status, r.text[:300]
        check(spec, "/api/allocations", "post", r)
    r = hub.api("POST", "/api/allocations", ann, json={"profile": "gpu-1"})
    assert r.status_code == 403  # users do not allocate through the API
    check(spec, "/api/allocations", "post", r)

    listed = check(spec, "/api/allocations", "get", hub.api("GET", "/api/allocations", ann))
    assert [a["id"] for a in listed["allocations"]] == [created["id"]]
    check(spec, "/api/allocations/{allocation_id}", "get", hub.api("GET", alloc, ann))
    check(spec, "/api/profiles", "get", hub.api("GET", "/api/profiles", ann))
    inventory = check(spec, "/api/inventory", "get", hub.api("GET", "/api/inventory", ann))
    assert inventory["hosts"][0]["gpus"]
    warning = {"kind": "idle-warning", "reason": "idle 10 min"}
    r = hub.api("POST", "/api/events", ann, json=warning)
    assert r.status_code == 400  # about which allocation?
    check(spec, "/api/events", "post", r)
    detail = {"allocation_id": created["id"], "idle_seconds": 600}
    r = hub.api("POST", "/api/events", ann, json={**warning, "detail": detail})
    assert r.status_code == 201, r.text
    check(spec, "/api/events", "post", r)
    events = check(spec, "/api/events", "get", hub.api("GET", "/api/events", ann))
    assert {e["kind"] for e in events["events"]} >= {"allocated", "idle-warning"}
    released = check(
        spec, "/api/allocations/{allocation_id}", "delete", hub.api("DELETE", alloc, ann)
    )
    assert released["released_now"] is True and released["state"] == "released"
    r = hub.api("POST", f"{alloc}/reclaim", ann, json={"reason": "idle", "idle_seconds": 60})
    assert r.status_code == 409  # already released
    check(spec, "/api/allocations/{allocation_id}/reclaim", "post", r)
    policy = hub.api("GET", f"/api/idle-policy?allocation_id={created['id']}", ann)
    assert check(spec, "/api/idle-policy", "get", policy)["profile"] == "mig-1g.10gb"
    gpu = inventory["hosts"][0]["gpus"][0]["uuid"]
    r = hub.api("POST", f"/api/gpus/{gpu}/drain", ann, json={"drained": True})
    assert r.status_code == 403  # admins only
    check(spec, "/api/gpus/{gpu_uuid}/drain", "post", r)
    r = hub.api("POST", f"/api/gpus/{gpu}/drain", hub.service_token, json={"drained": True})
    assert r.status_code == 403  # the spawner's token carries no admin action
    admin = hub.add_user("admin")
    for drained in (True, False):
        r = hub.api("POST", f"/api/gpus/{gpu}/drain", admin, json={"drained": drained})
        assert check(spec, "/api/gpus/{gpu_uuid}/drain", "post", r)["drained"] is drained
    jobs = hub.api("GET", "/api/jobs", ann)
    assert check(spec, "/api/jobs", "get", jobs)["jobs"] == []
    check(spec, "/api/jobs/{job_id}", "get", hub.api("GET", "/api/jobs/424242", ann))
    r = hub.api("GET", "/api/allocations/999999", ann)
    assert r.status_code == 404
    check(spec, "/api/allocations/{allocation_id}", "get", r)
    r = hub.api("GET", "/api/allocations?state=maybe", ann)
    assert r.status_code == 400
    check(spec, "/api/allocations", "get", r)
    check(spec, "/metrics", "get", hub.api("GET", "/metrics", ann))  # 403 for a user
    metrics = hub.api("GET", "/metrics", admin)
    assert metrics.status_code == 200 and "gpuslice_" in metrics.text
