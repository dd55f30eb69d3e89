"""The pieces behind the trust boundaries, without a hub: request bodies, the merged hub
config, the job environment, and which silent allocations the service reclaims."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from traitlets.config import Config

from gpuslice.idle_policy import PolicyConfig
from gpuslice.jsonbody import BodyError, parse_json_object
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.hubconfig import configure_jupyterhub
from gpuslice_hub.idle import reclaim_record
from gpuslice_hub.jobs.accounts import Account, forbidden_names, job_environment
from gpuslice_hub.ledger import RECLAIM_KINDS, Caller
from gpuslice_hub.silent import find_silent
from tests.harness.logs import said_by


@pytest.mark.parametrize(
    ("raw", "status", "needle"),
    [
        (b'{"a": NaN}', 400, "NaN"),
        (b'{"a": -Infinity}', 400, "-Infinity"),
        (b'{"a": 1e400}', 400, "too large"),
        (b'{"a": "\\ud800"}', 400, "not valid Unicode"),
        (b'{"\\udfff": 1}', 400, "not valid Unicode"),
        (b'{"a": "\xff"}', 400, "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, 400, "nested deeper"),
        (b'{"a": ' + b"[" * 40 + b"]" * 40 + b"}", 400, "nested deeper"),
        (b'{"a": "' + b"x" * 70_000 + b'"}', 400, "longer than"),
        (b'{"a": 1}' + b" " * (1 << 20), 413, "larger than"),
        (b'{"b": 1}', 400, "unknown field 'b'"),
        (b"[]", 400, "JSON object"),
    ],
)
def test_bodies_that_could_not_be_stored_or_served_are_refused(raw, status, needle):
    with pytest.raises(BodyError) as e:
        parse_json_object(raw, {"a"})
    assert e.value.status == status and needle in str(e.value)


def test_a_nul_is_refused_outside_the_fields_stored_as_files():
    """PostgreSQL's text refuses NUL: such a reason or name was a 500 there, on SQLite not."""
    with pytest.raises(BodyError) as e:
        parse_json_object(b'{"reason": "a\\u0000b"}', {"reason"})
    assert e.value.status == 400 and "field 'reason' holds a NUL character" in str(e.value)
    with pytest.raises(BodyError):
        parse_json_object(b'{"detail": {"k\\u0000": 1}}', {"detail"})
    with pytest.raises(BodyError):
        parse_json_object(b'{"groups": ["x", "\\u0000"]}', {"groups"})
    # a notebook is a file: its outputs may hold any character
    body = b'{"notebook": {"cells": [{"outputs": ["\\u0000"]}]}, "name": "n"}'
    parsed = parse_json_object(body, {"notebook", "name"}, file_fields={"notebook"})
    assert parsed["notebook"]["cells"][0]["outputs"] == ["\x00"]


def test_a_fine_body_passes_and_a_notebook_limit_can_be_larger():
    assert parse_json_object(b'{"a": [1, 2.5, "\\u00e9"]}', {"a"}) == {"a": [1, 2.5, "é"]}
    big = json.dumps({"a": "x" * 200_000}).encode()
    assert parse_json_object(big, {"a"}, max_string=1 << 20)["a"] == "x" * 200_000


def test_the_slurm_gres_names_are_set_once_for_servers_and_jobs(tmp_path):
    from gpuslice_spawner.slurm_gres import SlurmGresConfig

    service_config = tmp_path / "gpuslice_config.py"
    service_config.write_text(
        "c.SlurmGresConfig.gpu_gres_types = {'NVIDIA H100 80GB HBM3': 'h100'}\n"
        "c.SlurmGresConfig.shards_per_gpu = 16\n"
    )
    c = Config()
    c.SlurmGresConfig.shards_per_gpu = 16  # the same value in both files is fine
    configure_jupyterhub(c, config_file=str(service_config))
    # what the spawner in the hub reads is what the service reads
    gres = SlurmGresConfig(config=c).value()
    assert gres.gpu_types == {"NVIDIA H100 80GB HBM3": "h100"} and gres.shards_per_gpu == 16
    # two different values would make servers and jobs ask Slurm for different gres
    clash = Config()
    clash.SlurmGresConfig.shards_per_gpu = 8
    with pytest.raises(ValueError, match="shards_per_gpu"):
        configure_jupyterhub(clash, config_file=str(service_config))
    # ... whether the hub's line comes before configure_jupyterhub or after it (the guide's
    # examples set the spawner's options after it)
    c.SlurmGresConfig.shards_per_gpu = 16
    with pytest.raises(ValueError, match=r"shards_per_gpu is 4 in the hub's config but 16"):
        c.SlurmGresConfig.shards_per_gpu = 4
    c.SlurmGresConfig.share_gres = "mps"  # a key the service's file leaves alone: the hub's
    loaded = Config()
    loaded.merge(c)  # what the hub loads
    assert loaded.SlurmGresConfig.shards_per_gpu == 16
    assert SlurmGresConfig(config=loaded).value().share == "mps"


def test_a_service_config_the_hub_cannot_run_does_not_stop_the_hub(tmp_path):
    service_config = tmp_path / "gpuslice_config.py"
    # reads a secret only the service's environment has
    service_config.write_text(
        "import os\nc.GPUSliceService.db_url = os.environ['GPUSLICE_TEST_NO_SUCH_SECRET']\n"
        "c.SlurmGresConfig.shards_per_gpu = 16\n"
    )
    c = Config()
    with said_by("JupyterHub") as said:  # (not caplog: see tests/harness/logs.py)
        configure_jupyterhub(c, config_file=str(service_config))
    assert any("could not be read in the hub (KeyError" in m for m in said), said
    assert "SlurmGresConfig" not in c  # nothing half-copied
    assert c.JupyterHub.services  # the hub's own part is configured


def test_hub_config_is_merged_whatever_the_order():
    c = Config()
    c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "read:users:activity"]}]
    c.JupyterHub.custom_scopes = {"custom:site:thing": {"description": "site's own"}}
    configure_jupyterhub(c, config_file="g.py", admin_users={"ada"}, metrics_services={"prom"})
    # an admin's later lines replace the lists: gpuslice's entries are merged back in
    c.JupyterHub.services = [{"name": "prom", "api_token": "t"}]
    c.JupyterHub.load_roles = [*c.JupyterHub.load_roles, {"name": "ops", "scopes": ["admin:users"]}]
    c.JupyterHub.custom_scopes = {"custom:later": {"description": "x"}}
    c.JupyterHub.template_paths = ["/srv/site-templates"]
    assert sorted(s["name"] for s in c.JupyterHub.services) == ["gpuslice", "prom"]
    # the "Server not running" page that says why gpuslice stopped a server, after the
    # site's own templates (theirs win), and a folder that has it
    site, pages = c.JupyterHub.template_paths
    assert site == "/srv/site-templates"
    assert (Path(pages) / "not_running.html").is_file()
    assert (Path(pages) / "home.html").is_file()
    roles = {r["name"]: r for r in c.JupyterHub.load_roles}
    # the site's user role keeps its scope and gains the service access
    assert roles["user"]["scopes"] == [
        "self",
        "read:users:activity",
        "access:services!service=gpuslice",
    ]
    assert roles["gpuslice-metrics"]["services"] == ["prom"]
    assert "custom:gpuslice:admin" not in roles["gpuslice-metrics"]["scopes"]
    assert roles["gpuslice-admin"]["users"] == ["ada"] and "ops" in roles
    assert {"custom:later", "custom:gpuslice:admin", "custom:gpuslice:metrics"} <= set(
        c.JupyterHub.custom_scopes
    )
    # a user cannot switch idle reclaim off from ~/.jupyter
    assert c.Spawner.disable_user_config is True
    # no fixed default port: two hubs on one host get a service each
    other = Config()
    configure_jupyterhub(other, config_file="g.py")
    ours = next(s for s in c.JupyterHub.services if s["name"] == "gpuslice")["url"]
    theirs = other.JupyterHub.services[0]["url"]
    assert ours.startswith("http://127.0.0.1:") and ours != theirs
    assert c.GPUSliceMixin.service_url == ours + "/services/gpuslice/"
    # what the hub loads (a merged copy) still has it all
    loaded = Config()
    loaded.merge(c)
    assert sorted(s["name"] for s in loaded.JupyterHub.services) == ["gpuslice", "prom"]


def test_a_later_update_or_merge_keeps_gpuslices_service_and_roles():
    """Issue 45: ``c.JupyterHub.update({...})`` and ``c.merge(...)`` after
    ``configure_jupyterhub`` replaced its service and roles (dict.update bypasses the
    merging assignment), leaving the hub without the service."""
    c = Config()
    configure_jupyterhub(c, config_file="g.py", admin_users={"ada"})
    c.JupyterHub.update({"services": [{"name": "prom", "api_token": "t"}]})
    site = Config({"JupyterHub": {"load_roles": [{"name": "ops", "scopes": ["admin:users"]}]}})
    c.merge(site)
    assert sorted(s["name"] for s in c.JupyterHub.services) == ["gpuslice", "prom"]
    roles = {r["name"] for r in c.JupyterHub.load_roles}
    assert {"ops", "gpuslice-admin", "gpuslice-service"} <= roles, roles


def test_a_job_environment_is_an_allow_list():
    account = Account("ann", 1234, 1234, (1234,), "/nonexistent-home", "/bin/bash")
    service_env = {
        "JUPYTERHUB_API_TOKEN": "secret",
        "JPY_API_TOKEN": "secret",
        "GPUSLICE_SERVICE_TOKEN": "secret",
        "LANG": "C.UTF-8",
        "DATABASE_URL": "postgresql://x:pw@db",
        "PATH": "/opt/service/bin:/usr/bin",
    }
    env = job_environment(
        account,
        "/jobs/7",
        "/venv/bin/python",
        {"GPUSLICE_JOB_ID": "7"},
        keep=["LANG", "JUPYTERHUB_API_TOKEN"],
        extra={"HF_HOME": "/scratch/hf", "JPY_X": "y"},
        source=service_env,
    )
    assert env == {
        "HOME": "/jobs/7",  # the account's home does not exist here
        "USER": "ann",
        "LOGNAME": "ann",
        "SHELL": "/bin/bash",
        "PATH": "/venv/bin:/usr/local/bin:/usr/bin:/bin",
        "JUPYTER_RUNTIME_DIR": "/jobs/7/.runtime",
        "PYTHONUNBUFFERED": "1",
        "LANG": "C.UTF-8",
        "HF_HOME": "/scratch/hf",
        "GPUSLICE_JOB_ID": "7",
    }
    assert forbidden_names(["LANG", "jupyterhub_api_url", "JPY_COOKIE"]) == [
        "jupyterhub_api_url",
        "JPY_COOKIE",
    ]


def test_only_allocations_silent_past_their_idle_timeout_are_found(make_ledger):
    ledger = make_ledger()
    config = PolicyConfig.parse({"profiles": {"gpu-1": {"idle_timeout": 0}}})

    def policy_for(a):
        profile = ledger.profiles[a.profile]
        return config.resolve(a.user, a.groups, a.profile, profile.idle_timeout)

    def caller(user):
        return Caller(user, (), "spawner")

    quiet, _ = ledger.allocate(caller("ann"), "mig-1g.10gb", "", "interactive", 0, False)
    talks, _ = ledger.allocate(caller("bob"), "mig-1g.10gb", "", "interactive", 0, False)
    never, _ = ledger.allocate(caller("cy"), "gpu-1", "", "interactive", 0, False)
    exempt, _ = ledger.allocate(caller("dee"), "share-250", "", "interactive", 0, False)
    ledger.record_usage(talks["id"], 10.0, 100.0, 0.0, 60.0)
    timeout = ledger.profiles["mig-1g.10gb"].idle_timeout  # 600 s in SIM_PROFILES
    soon = utcnow() + timedelta(seconds=timeout + 50)
    later = utcnow() + timedelta(seconds=timeout + 200)

    def found(now, exempt_users=()):
        items = find_silent(ledger, policy_for, lambda u: u in exempt_users, 100, now)
        return sorted(i.allocation.id for i in items)

    assert found(soon) == []  # within timeout + grace
    # ann and bob's allocations are silent past 600 + 100 s; gpu-1 has no idle timeout; the
    # share-250 profile has none either (no idle_timeout in SIM_PROFILES)
    assert found(later) == sorted([quiet["id"], talks["id"]])
    assert found(later, exempt_users={"ann", "bob"}) == []
    # a young allocation's server may still be starting: left alone
    assert find_silent(ledger, policy_for, lambda u: False, 100, later, min_age=1e6) == []
    assert never["id"] not in found(later) and exempt["id"] not in found(later)


def test_figures_stored_by_an_older_version_cannot_break_metrics_or_json(make_ledger):
    """Before the service computed reclaimed GPU-hours itself, a client could store anything
    there: such records count as 0, and every API answer stays strict JSON."""
    from prometheus_client import generate_latest

    from gpuslice_hub.admin.accounting import reclaimed
    from gpuslice_hub.api.base import dumps
    from gpuslice_hub.metrics import make_registry

    ledger = make_ledger()
    for junk in ("lots", -5, 1e300, [1], {"a": 1}, True):
        ledger.record_event("idle-culled", "ann", "ann", "old", {"reclaimed_gpu_hours": junk})
    ledger.record_event("idle-culled", "ann", "service", "ok", {"reclaimed_gpu_hours": 1.5})
    registry, _ = make_registry(ledger)
    text = generate_latest(registry).decode()
    assert 'gpuslice_reclaimed_gpu_hours_total{profile=""} 1.5' in text
    assert reclaimed(ledger, utcnow())["total"] == 1.5
    assert json.loads(dumps({"a": float("nan"), "b": [float("inf"), 1.0]})) == {
        "a": None,
        "b": [None, 1.0],
    }


def test_a_server_token_is_confined_to_the_servers_its_scopes_name():
    from gpuslice_hub.api.base import confined_servers

    server = {"users:activity!user=ann", "access:servers!server=ann/a"}
    assert confined_servers("ann", server) == {"a"}
    assert confined_servers("ann", {"access:servers!server=ann/"}) == {""}  # the default one
    # another user's server gives ann's token none of ann's
    assert confined_servers("ann", {"access:servers!server=bob/a"}) == frozenset()
    # wider server access, or none at all (the browser's session): not confined
    for scopes in (
        {"access:servers!server=ann/a", "access:servers!user=ann"},
        {"access:servers"},
        {"access:servers!group=physics", "access:servers!server=ann/a"},
        {"access:services!service=gpuslice", "read:users:name!user=ann"},
        set(),
    ):
        assert confined_servers("ann", scopes) is None, scopes


def test_a_servers_stop_is_recorded_once_and_pending_while_its_slice_is_held(make_ledger):
    """A cull, the server's retry of it, and a silent server's reclaim of the same slice are
    one request to stop it: one event, counted once (a server whose reply was lost asked
    again and its cull was counted twice). Until the slice goes, the request is pending."""
    ledger = make_ledger()
    ann = Caller("ann", (), "spawner")
    alloc, _ = ledger.allocate(ann, "share-250", "", "interactive", 0, False)
    other, _ = ledger.allocate(
        Caller("bob", (), "spawner"), "share-250", "", "interactive", 0, False
    )
    kind, detail = reclaim_record(alloc, 60.0, voluntary=False)
    first, new = ledger.record_stop_request(kind, "ann", "ann", "GPU idle for 60 s", detail)
    assert new and first["kind"] == "idle-culled"
    again, new = ledger.record_stop_request(kind, "ann", "ann", "GPU idle for 120 s", detail)
    assert not new and again == first
    silent = {**detail, "scope": "server"}
    assert (
        ledger.record_stop_request("reclaim-silent", "ann", "service", "quiet", silent)[1] is False
    )
    culls = [e for e in ledger.events(user="ann", limit=100) if e["kind"] in RECLAIM_KINDS]
    assert [e["id"] for e in culls] == [first["id"]]

    later = utcnow() + timedelta(seconds=1)
    assert ledger.pending_stops(later) == [(alloc["id"], "ann", "")]
    assert ledger.pending_stops(utcnow() - timedelta(seconds=60)) == []  # asked just now
    ledger.release(alloc["id"], "spawner", "server stopped", server_stopped=True)
    assert ledger.pending_stops(later) == []
    assert ledger.get(other["id"])["state"] == "active"


def test_a_kernels_cull_is_no_request_to_stop_its_server(make_ledger):
    """Issue 44: a kernel's idle cull shares the kind ``idle-culled`` with a server's. Read
    as a stop request, it had the reconciler stop a working server; it also stood in for
    the server's own later cull, whose reclaimed GPU-hours were then never recorded, and
    named the reason of an unrelated release."""
    ledger = make_ledger()
    alloc, _ = ledger.allocate(Caller("ann", (), "spawner"), "share-250", "", "interactive", 0)
    kernel = {"allocation_id": alloc["id"], "scope": "kernel", "kernel_id": "k1"}
    ledger.record_event("idle-culled", "ann", "ann", "GPU idle for 60 s", kernel)
    later = utcnow() + timedelta(seconds=1)
    assert ledger.pending_stops(later) == []
    kind, detail = reclaim_record(alloc, 60.0, voluntary=False)
    first, new = ledger.record_stop_request(kind, "ann", "ann", "GPU idle for 60 s", detail)
    assert new and first["detail"]["scope"] == "server"
    assert first["detail"]["reclaimed_gpu_hours"] > 0
    assert ledger.pending_stops(later) == [(alloc["id"], "ann", "")]
    released, _ = ledger.release(alloc["id"], "spawner", "server stopped", server_stopped=True)
    assert released["release_reason"] == "culled for idleness: GPU idle for 60 s"

    # a release after kernel culls only keeps its own reason
    other, _ = ledger.allocate(Caller("bob", (), "spawner"), "share-250", "", "interactive", 0)
    ledger.record_event(
        "idle-culled", "bob", "bob", "idle", {**kernel, "allocation_id": other["id"]}
    )
    released, _ = ledger.release(other["id"], "spawner", "server stopped", server_stopped=True)
    assert released["release_reason"] == "server stopped"
