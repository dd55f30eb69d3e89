"""Fixture: a real JupyterHub (with configurable-http-proxy) running the gpuslice service.

Each hub runs in a subprocess on random ports, in its own temporary directory, the way
jupyterhub-idle-culler's tests do; tests talk to it over HTTP only.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests

from .engines import need
from .markers import require
from .ports import free_ports

REPO = Path(__file__).resolve().parents[2]

SIM_HOSTS = [
    {
        "name": "node-a",
        "cpu_milli": 32000,
        "memory_mib": 256000,
        "gpus": [
            {
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
            },
            {"model": "NVIDIA A100-SXM4-80GB", "memory_mib": 81920, "count": 2},
        ],
    }
]
SIM_PROFILES = [
    {"name": "mig-1g.10gb", "kind": "mig", "mig_profile": "1g.10gb", "idle_timeout": 600},
    {"name": "mig-3g.40gb", "kind": "mig", "mig_profile": "3g.40gb", "groups": ["physics"]},
    {"name": "share-250", "kind": "share", "gpu_milli": 250, "gpu_memory_mib": 20480},
    {"name": "gpu-1", "kind": "gpu", "count": 1},
]


def chp_path() -> str | None:
    local = REPO / "node_modules" / ".bin" / "configurable-http-proxy"
    return str(local) if local.exists() else shutil.which("configurable-http-proxy")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    """Poll ``predicate`` until it returns something truthy, or fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as e:  # keep polling through connection errors while starting
            last_exc = e
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout}s waiting for {what} (last error: {last_exc})")


@dataclass
class Hub:
    url: str
    service_url: str  # direct URL of the service, prefix included
    admin_token: str
    service_token: str
    workdir: Path
    proc: subprocess.Popen
    log_path: Path
    config: dict[str, Any]
    _tokens: dict[str, str] = field(default_factory=dict)

    # -- hub API ---------------------------------------------------------------------------

    def hub_api(self, method: str, path: str, **kw: Any) -> requests.Response:
        headers = kw.pop("headers", {})
        headers.setdefault("Authorization", f"token {self.admin_token}")
        return requests.request(
            method, f"{self.url}/hub/api{path}", headers=headers, timeout=30, **kw
        )

    def add_user(self, name: str, groups: tuple[str, ...] = (), admin: bool = False) -> str:
        """Create a user (and groups) on the hub; returns an API token of that user."""
        r = self.hub_api("POST", f"/users/{name}", json={"admin": admin})
        assert r.status_code in (201, 409), r.text
        for g in groups:
            self.hub_api("POST", f"/groups/{g}")
            r = self.hub_api("POST", f"/groups/{g}/users", json={"users": [name]})
            assert r.status_code == 200, r.text
        if name not in self._tokens:
            r = self.hub_api(
                "POST", f"/users/{name}/tokens", json={"note": "test", "expires_in": 3600}
            )
            assert r.status_code == 201, r.text
            self._tokens[name] = r.json()["token"]
        return self._tokens[name]

    def spawn(
        self, user: str, options: dict[str, Any] | None = None, server: str = ""
    ) -> requests.Response:
        path = f"/users/{user}/servers/{server}" if server else f"/users/{user}/server"
        return self.hub_api("POST", path, json=options or {})

    def server_model(self, user: str, server: str = "") -> dict[str, Any] | None:
        model = self.hub_api("GET", f"/users/{user}").json()
        return (model.get("servers") or {}).get(server)

    def wait_ready(self, user: str, server: str = "", timeout: float = 90) -> dict[str, Any]:
        return wait_for(
            lambda: (m := self.server_model(user, server)) and m.get("ready") and m,
            timeout,
            f"{user}'s server to be ready",
        )

    def logged_in(self, user: str) -> requests.Session:
        """A session logged in to the hub as ``user`` through its login form: the hub's
        HTML pages (home, spawn) take no API token."""
        s = requests.Session()
        s.get(f"{self.url}/hub/login", timeout=30)
        r = s.post(
            f"{self.url}/hub/login",
            data={"username": user, "password": "test-password", "_xsrf": s.cookies.get("_xsrf")},
            timeout=30,
        )
        assert r.ok, r.text
        return s

    def wait_gone(self, user: str, server: str = "", timeout: float = 90) -> None:
        wait_for(
            lambda: self.server_model(user, server) is None, timeout, f"{user}'s server to stop"
        )

    def progress_events(self, user: str, server: str = "") -> list[dict[str, Any]]:
        """The spawn's progress stream (server-sent events) until it ends."""
        path = (
            f"/users/{user}/servers/{server}/progress"
            if server
            else f"/users/{user}/server/progress"
        )
        r = self.hub_api("GET", path, stream=True)
        events = []
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                events.append(json.loads(line[5:]))
        return events

    # -- gpuslice API ----------------------------------------------------------------------

    def api(
        self, method: str, path: str, token: str | None = None, via_proxy: bool = True, **kw: Any
    ) -> requests.Response:
        base = f"{self.url}/services/gpuslice" if via_proxy else self.service_url.rstrip("/")
        headers = kw.pop("headers", {})
        if token is not None:
            headers["Authorization"] = f"token {token}"
        return requests.request(method, f"{base}{path}", headers=headers, timeout=60, **kw)

    def allocate(self, user: str, profile: str, server: str = "", **fields: Any) -> Any:
        """Take a slice for ``user`` the way the hub-side spawner does (the service token;
        users cannot allocate through the API themselves)."""
        body = {"user": user, "profile": profile, "server_name": server, **fields}
        return self.api("POST", "/api/allocations", self.service_token, json=body)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    # -- lifecycle -------------------------------------------------------------------------

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def service_pid(self) -> int:
        out = subprocess.run(
            ["pgrep", "-f", f"gpuslice_hub.app --config {self.workdir}"],
            capture_output=True,
            text=True,
        )
        pids = [int(p) for p in out.stdout.split()]
        assert len(pids) == 1, f"expected one service process, found {pids}"
        return pids[0]


HUB_CONFIG = """\
import json, os, sys
from gpuslice_hub.hubconfig import configure_jupyterhub

cfg = json.load(open({cfg_path!r}))
c.JupyterHub.bind_url = "http://127.0.0.1:%d" % cfg["hub_port"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = cfg["hub_internal_port"]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%d" % cfg["proxy_api_port"]
c.ConfigurableHTTPProxy.command = [cfg["chp"]]
c.ConfigurableHTTPProxy.should_start = True
c.JupyterHub.db_url = "sqlite:///" + cfg["workdir"] + "/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = cfg["workdir"] + "/cookie_secret"
c.JupyterHub.pid_file = cfg["workdir"] + "/hub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = "test-password"
c.Authenticator.allow_all = True
c.Authenticator.admin_users = set(cfg["admin_users"])
c.JupyterHub.cleanup_servers = True
c.JupyterHub.load_groups = {{"physics": {{"users": []}}}}
configure_jupyterhub(
    c,
    config_file=cfg["workdir"] + "/gpuslice_config.py",
    url="http://127.0.0.1:%d" % cfg["service_port"],
    admin_users=cfg["admin_users"],
    metrics_services=["prom"],
    spawner=cfg["spawner"],
    api_token=cfg["service_token"],
    # (the service checks its lean statements against SQLAlchemy, as the suite does; not
    # where a benchmark measures it: the check runs each of them twice)
    environment={{
        "PYTHONUNBUFFERED": "1", "GPUSLICE_LEAN_CHECK": "1" if cfg["lean_check"] else ""
    }},
)
c.JupyterHub.load_roles = c.JupyterHub.load_roles + [
    {{"name": "tester", "scopes": ["admin:users", "admin:servers", "tokens", "admin:groups",
      "list:users", "read:users", "access:servers", "access:services", "admin:server_state"],
      "services": ["tester"]}},
]
# Assigned after configure_jupyterhub: its service and roles must survive (they are merged).
c.JupyterHub.services = [
    {{"name": "tester", "api_token": cfg["admin_token"]}},
    {{"name": "prom", "api_token": cfg["metrics_token"]}},
]
if cfg["spawner"]:
    c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
    c.Spawner.args = ["--allow-root"] if os.getuid() == 0 else []
    # a local server starts in seconds: 30 s of the 120 for it, 90 s to wait while a batch
    # job gives its slice up (JobManager.preempt_grace is 60 s)
    c.Spawner.start_timeout = 120
    c.GPUSliceMixin.server_start_margin = 30
    c.Spawner.http_timeout = 60
    c.Spawner.default_url = "/tree"
    c.SimpleLocalProcessSpawner.home_dir_template = cfg["workdir"] + "/home/{{username}}"
# JupyterHub restarts a managed service that died when it next polls it: every 30 s, not
# configurable for services. Poll every 2 s so the restart tests wait for the service's own
# start, not for the hub to look.
from jupyterhub.services import service as _services
_start_polling = _services._ServiceSpawner.start_polling
def _poll_often(self):
    self.poll_interval = 2
    return _start_polling(self)
_services._ServiceSpawner.start_polling = _poll_often
exec(cfg["extra_hub_config"])
"""

SERVICE_CONFIG = """\
import json
cfg = json.load(open({cfg_path!r}))
c.GPUSliceService.db_url = cfg["db_url"]
c.GPUSliceService.gpu_backend = "simulated"
c.GPUSliceService.hosts = cfg["hosts"]
c.GPUSliceService.profiles = cfg["profiles"]
c.GPUSliceService.quotas = cfg["quotas"]
c.GPUSliceService.reconcile_interval = cfg["reconcile_interval"]
c.GPUSliceService.reconcile_grace = cfg["reconcile_grace"]
c.GPUSliceService.log_level = "DEBUG"
# The hub's test users have no system accounts: their jobs run as the test's own account.
# Tests about who runs what (tests/jobs/test_job_accounts.py) switch this off.
c.JobManager.run_jobs_as_service_user = cfg.get("jobs_as_service_user", True)
# Tests compare a job's NumPy results bit for bit with their own (same_blas in harness/hub.py),
# as a site sets what its jobs need in job_environment.
c.JobManager.job_environment = cfg.get("job_environment") or dict()
exec(cfg.get("extra_service_config", ""))
"""


def same_blas() -> dict[str, str]:
    """What a job's environment needs for its NumPy results to equal the test's bit for bit:
    a machine may pin its BLAS kernels (OPENBLAS_CORETYPE), and another kernel sums in
    another order. A job's environment is an allow-list, so the tests pass it on."""
    return {k: os.environ[k] for k in ("OPENBLAS_CORETYPE",) if k in os.environ}


def start_hub(
    workdir: Path,
    db_url: str | None = None,
    profiles: list[dict] | None = None,
    quotas: dict | None = None,
    hosts: list[dict] | None = None,
    spawner: str | None = None,
    admin_users: tuple[str, ...] = ("admin",),
    reconcile_interval: float = 0,
    reconcile_grace: float = 120,
    extra_hub_config: str = "",
    extra_service_config: str = "",
    jobs_as_service_user: bool = True,
    reuse: dict[str, Any] | None = None,
    wait: bool = True,
    lean_check: bool = True,
) -> Hub:
    """Start a hub in ``workdir``. ``reuse`` (a previous Hub.config) restarts the same setup.
    ``lean_check=False``: the service runs its statements as it does at a site, unchecked
    (benchmarks)."""
    require("hub", "starts a JupyterHub")
    chp = chp_path()
    need(chp is not None, "configurable-http-proxy (npm install)")
    workdir.mkdir(parents=True, exist_ok=True)
    hub_port, hub_internal_port, proxy_api_port, service_port = free_ports(4)
    cfg = reuse or {
        "workdir": str(workdir),
        "hub_port": hub_port,
        "hub_internal_port": hub_internal_port,
        "proxy_api_port": proxy_api_port,
        "service_port": service_port,
        "chp": chp,
        "db_url": db_url or f"sqlite:///{workdir}/gpuslice.sqlite",
        "profiles": profiles if profiles is not None else SIM_PROFILES,
        "quotas": quotas or {},
        "hosts": hosts or SIM_HOSTS,
        "spawner": spawner,
        "admin_users": list(admin_users),
        "admin_token": secrets.token_hex(16),
        "service_token": secrets.token_hex(16),
        "metrics_token": secrets.token_hex(16),
        "reconcile_interval": reconcile_interval,
        "reconcile_grace": reconcile_grace,
        "extra_hub_config": extra_hub_config,
        "extra_service_config": extra_service_config,
        "jobs_as_service_user": jobs_as_service_user,
        "job_environment": same_blas(),
        "lean_check": lean_check,
    }
    cfg_path = workdir / "test_config.json"
    cfg_path.write_text(json.dumps(cfg))
    (workdir / "jupyterhub_config.py").write_text(HUB_CONFIG.format(cfg_path=str(cfg_path)))
    (workdir / "gpuslice_config.py").write_text(SERVICE_CONFIG.format(cfg_path=str(cfg_path)))
    log_path = workdir / "hub.log"
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.pop("JUPYTERHUB_API_TOKEN", None)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "jupyterhub", "-f", str(workdir / "jupyterhub_config.py")],
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    hub = Hub(
        url=f"http://127.0.0.1:{cfg['hub_port']}",
        service_url=f"http://127.0.0.1:{cfg['service_port']}/services/gpuslice",
        admin_token=cfg["admin_token"],
        service_token=cfg["service_token"],
        workdir=workdir,
        proc=proc,
        log_path=log_path,
        config=cfg,
    )
    if wait:
        wait_until_up(hub)
    return hub


def wait_until_up(hub: Hub, timeout: float = 90) -> None:
    def up() -> bool:
        if hub.proc.poll() is not None:
            raise RuntimeError(f"hub exited with {hub.proc.returncode}:\n{hub.log()[-4000:]}")
        r = requests.get(f"{hub.url}/services/gpuslice/api/health", timeout=5)
        return r.status_code == 200

    try:
        wait_for(up, timeout, "the hub and the gpuslice service")
    except (TimeoutError, RuntimeError):
        print(hub.log()[-6000:])
        raise


@pytest.fixture
def hub_factory(tmp_path: Path) -> Iterator[Callable[..., Hub]]:
    hubs: list[Hub] = []

    def make(**kw: Any) -> Hub:
        hub = start_hub(tmp_path / f"hub{len(hubs)}", **kw)
        hubs.append(hub)
        return hub

    yield make
    for hub in hubs:
        hub.stop()


@pytest.fixture
def hub(hub_factory: Callable[..., Hub]) -> Hub:
    return hub_factory()
