"""The server extension in a real jupyter_server with real kernels; only the GPU is fake
(the fake NVML, driven by rewriting its state file) and time is driven by the test
(``monitor.tick()`` with a test clock; the sampling loop is off)."""

from __future__ import annotations

import json
import os
import sys
import time

import pytest
from traitlets.config import Config

from gpuslice.extension.events import SCHEMA_ID
from gpuslice.jsonclient import JSONClient
from tests.fakes.fake_pynvml import FakeNVML, write_state

LEAD = 20
TIMEOUT = 60
WINDOW = 10
STEP = 5


class Clock:
    def __init__(self) -> None:
        self.t = time.time() + 1

    def __call__(self) -> float:
        return self.t


def gpu(processes, **kw):
    return {
        "uuid": "GPU-0",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "processes": processes,
        **kw,
    }


@pytest.fixture
def nvml_path(tmp_path, monkeypatch):
    path = tmp_path / "nvml.json"
    write_state(path, {"devices": [gpu([])]})
    # the server runs in this process: the fake driver goes where ``import pynvml`` looks
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML.from_file(str(path)))
    monkeypatch.setenv("JUPYTERHUB_USER", "ann")
    monkeypatch.setenv("GPUSLICE_PROFILE", "share-250")
    monkeypatch.setenv("GPUSLICE_PROFILE_KIND", "share")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0")
    for name in ("GPUSLICE_SERVICE_URL", "GPUSLICE_ALLOCATION_ID", "GPUSLICE_SIMULATED"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def ext_config():
    return {}


@pytest.fixture
def jp_server_config(nvml_path, ext_config):
    cfg = {
        "sample_interval": 0,
        "idle_window": WINDOW,
        "idle_timeout": TIMEOUT,
        "warning_lead": LEAD,
        "max_extension": 100,
        "activity_source": "nvml",
        "policy_from_service": False,
        "memory_cap_mib": 0,
        **ext_config,
    }
    return Config(
        {"ServerApp": {"jpserver_extensions": {"gpuslice": True}}, "GPUSliceExtension": cfg}
    )


class Env:
    def __init__(self, app, loop, fetch, nvml_path):
        self.app = app
        self.loop = loop
        self._fetch = fetch
        self.nvml_path = nvml_path
        self.monitor = app.web_app.settings["gpuslice_monitor"]
        self.clock = Clock()
        self.monitor.clock = self.clock
        self.km = app.kernel_manager
        self.events: list[dict] = []

        async def listener(logger, schema_id, data):
            self.events.append(dict(data))

        app.event_logger.add_listener(schema_id=SCHEMA_ID, listener=listener)
        self.event_logger = app.event_logger

    def run(self, coro):
        return self.loop.run_until_complete(coro)

    def fetch(self, path, method="GET", body=None):
        kw = {"method": method, "raise_error": False}
        if body is not None:
            kw["body"] = json.dumps(body)
        r = self.run(self._fetch(*path.split("/"), **kw))
        return r.code, json.loads(r.body or b"null")

    def start_kernel(self) -> tuple[str, int]:
        code, model = self.fetch("api/kernels", "POST", {"name": "python3"})
        assert code == 201, model
        kid = model["id"]
        return kid, self.km.get_kernel(kid).provisioner.pid

    def gpu(self, processes, **kw):
        write_state(self.nvml_path, {"devices": [gpu(processes, **kw)]})

    def tick(self, until: float) -> list[tuple[float, object]]:
        """Tick every STEP fake seconds up to *until* seconds from the start."""
        out = []
        start = self.start
        while self.clock.t <= start + until:
            out += [(self.clock.t - start, d) for d in self.run(self.monitor.tick())]
            self.clock.t += STEP
        self.run(self.monitor.drain())
        # listeners run as tasks; wait for exactly those, not for an arbitrary delay
        self.run(self.event_logger.gather_listeners())
        return out

    def tick_until_decision(self, poll: bool = False) -> list[tuple[float, object]]:
        for _ in range(1000):
            if poll:
                self.fetch("gpuslice/api/status")
            got = self.tick(self.clock.t - self.start)
            if got:
                return got
        raise AssertionError("no decision")

    @property
    def start(self) -> float:
        if not hasattr(self, "_start"):
            self._start = self.clock.t
        return self._start


@pytest.fixture
def env(jp_serverapp, jp_asyncio_loop, jp_fetch, nvml_path):
    e = Env(jp_serverapp, jp_asyncio_loop, jp_fetch, nvml_path)
    yield e
    for kid in list(e.km.list_kernel_ids()):
        e.run(e.km.shutdown_kernel(kid, now=True))


def actions(got):
    return [(d.action, d.kernel_id) for _, d in got]


def test_status_has_the_contract_and_polling_is_not_activity(env):
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 512, "sm_util": 30}])
    env.tick(0)
    settings = env.app.web_app.settings
    before = settings.get("api_last_activity")
    code, status = env.fetch("gpuslice/api/status")
    assert code == 200
    assert settings.get("api_last_activity") == before
    assert set(status) >= {"slice", "server", "kernels", "policy", "exempt"}
    assert status["slice"] == {
        "profile": "share-250",
        "display_name": "share-250",  # no $GPUSLICE_PROFILE_DISPLAY_NAME here
        "kind": "share",
        "gpu_milli": 0,
        "memory_cap_mib": 0,
        "memory_mib": 0,  # no $GPUSLICE_SLICE here
        "devices": ["GPU-0"],
        "simulated": True,  # the fake driver labels itself
        "idle_timeout": TIMEOUT,
    }
    [k] = status["kernels"]
    assert {key: k[key] for key in ("id", "name", "utilization", "memory_mib", "warning")} == {
        "id": kid,
        "name": "python3",
        "utilization": 30.0,
        "memory_mib": 512.0,
        "warning": False,
    }
    assert k["attribution"] == "per-process" and k["deadline"] is None and not k["exempt"]
    assert status["policy"] == {
        "action": "kernel",
        "idle_timeout": TIMEOUT,
        "warning_lead": LEAD,
        "max_extension": 100,
        "source": "local",
    }
    # The same server counts an ordinary API call (the check above could fail).
    env.fetch("api/kernels")
    assert settings.get("api_last_activity") != before


def test_busy_kernel_is_never_culled_and_keeps_the_server_active(env):
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 4096, "sm_util": 40}])
    assert env.tick(10 * TIMEOUT) == []
    assert kid in env.km
    assert env.app.web_app.settings.get("gpuslice_last_activity") is not None
    assert env.app.web_app.last_activity() >= env.app.web_app.settings["gpuslice_last_activity"]


def test_idle_kernel_holding_memory_is_warned_then_culled(env, monkeypatch):
    kid, pid = env.start_kernel()
    # Memory held, no utilization samples (NVML's NotFound): idle.
    env.gpu([{"pid": pid, "used_memory_mib": 2048}])
    # The server's activity as the cull begins (read then, not before the ticks: the
    # kernel's own start messages count as activity and may still arrive meanwhile)
    shutdown, before = env.km.shutdown_kernel, []

    async def shutdown_kernel(*args, **kwargs):
        before.append(env.km.last_kernel_activity)
        return await shutdown(*args, **kwargs)

    monkeypatch.setattr(env.km, "shutdown_kernel", shutdown_kernel)
    got = env.tick(4 * TIMEOUT)
    assert actions(got) == [("warning", kid), ("culled", kid)]
    (t_warn, warn), (t_cull, cull) = got
    assert t_cull - t_warn >= LEAD
    assert warn.deadline == cull.deadline == env.start + t_cull
    assert kid not in env.km
    # Our cull is not user activity; and an idle GPU did not refresh the server.
    assert len(before) == 1 and env.km.last_kernel_activity == before[0]
    assert "gpuslice_last_activity" not in env.app.web_app.settings
    assert [e["action"] for e in env.events] == ["warning", "culled"]
    assert env.events[0]["kernel_id"] == kid and env.events[0]["deadline"].endswith("Z")
    assert env.events[1]["idle_seconds"] >= TIMEOUT


def test_warning_precedes_the_cull_by_the_lead_even_when_first_seen_late(env):
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 10}])
    env.tick(0)
    # The sampler stalls for a long time: the next ticks are far past the deadline.
    env.clock.t += 10 * TIMEOUT
    got = env.tick(10 * TIMEOUT + 3 * LEAD)
    assert actions(got) == [("warning", kid), ("culled", kid)]
    assert got[1][0] - got[0][0] >= LEAD


def test_child_and_container_processes_count_for_their_kernel(env, tmp_path, fake_proc_for):
    k1, pid1 = env.start_kernel()
    k2, pid2 = env.start_kernel()
    fake_proc_for(env, {pid1: [70001]}, container={pid2: 90002})
    env.gpu(
        [
            {"pid": 70001, "used_memory_mib": 100, "sm_util": 35},  # k1's DataLoader worker
            {"pid": 90002, "used_memory_mib": 200, "sm_util": 25},  # k2's child, host PID
        ]
    )
    assert env.tick(5 * TIMEOUT) == []
    kernels = {k["id"]: k for k in env.fetch("gpuslice/api/status")[1]["kernels"]}
    assert (kernels[k1]["utilization"], kernels[k1]["memory_mib"]) == (35.0, 100.0)
    assert (kernels[k2]["utilization"], kernels[k2]["memory_mib"]) == (25.0, 200.0)


@pytest.fixture
def fake_proc_for(tmp_path):
    """Point the extension at a fake /proc: the server, its kernels, kernel children, and
    kernels seen from the host (a container's PIDs translated through NSpid)."""

    def make(env, children, container):
        root = tmp_path / "proc"
        root.mkdir()

        def add(pid, ppid, nspid=None):
            d = root / str(pid)
            d.mkdir()
            ns = "\t".join(str(p) for p in (nspid or (pid,)))
            (d / "status").write_text(f"Name:\tpython\nPPid:\t{ppid}\nUid:\t1000\nNSpid:\t{ns}\n")

        server = os.getpid()
        add(1, 0)
        add(server, 1)
        for kpid, kids in children.items():
            add(kpid, server)
            for c in kids:
                add(c, kpid)
        # the host's view of the container: host PIDs 9xxxx, the server and kernel inside
        add(90000, 1, (90000, server))
        for kpid, child in container.items():
            add(90001, 90000, (90001, kpid))
            add(child, 90001, (child, 555))
        env.monitor.sampler.attributor.proc.root = str(root)

    return make


@pytest.mark.parametrize(
    ("errors", "want"),
    [({}, (45.0, "per-instance")), ({"nvmlDeviceGetUtilizationRates": "NotSupported"}, None)],
    ids=["device-figure", "nothing"],
)
def test_not_supported_per_process_utilization_is_labelled(env, errors, want):
    # No per-process utilization (vGPU, some drivers): the device's figure stands in,
    # labelled per-instance; with no figure at all, "unavailable" and no number.
    _kid, pid = env.start_kernel()
    device = gpu(
        [{"pid": pid, "used_memory_mib": 300, "sm_util": 50}],
        process_utilization=False,
        gpu_util=45,
    )
    write_state(env.nvml_path, {"devices": [device], "errors": errors})
    env.tick(0)
    [k] = env.fetch("gpuslice/api/status")[1]["kernels"]
    assert (k["utilization"], k["attribution"]) == (want or (None, "unavailable"))
    assert k["memory_mib"] == 300.0


@pytest.mark.parametrize("gpm", [False, True])
def test_mig_is_per_instance_with_gpm_and_unavailable_without(env, gpm, monkeypatch):
    _kid, pid = env.start_kernel()
    state = {
        "devices": [
            {
                "uuid": "GPU-0",
                "name": "NVIDIA H100 80GB HBM3",
                "memory_mib": 81559,
                "mig_mode": "enabled",
                "gpm": gpm,
                "mig_devices": [
                    {
                        "uuid": "MIG-a",
                        "gi_slices": 3,
                        "memory_mib": 40192,
                        "gi_id": 1,
                        "gpm_util": 63.0,
                        "processes": [{"pid": pid, "used_memory_mib": 700}],
                    }
                ],
            }
        ]
    }
    write_state(env.nvml_path, state)
    env.tick(STEP)  # GPM needs two samples to diff
    [k] = env.fetch("gpuslice/api/status")[1]["kernels"]
    if gpm:
        assert (k["utilization"], k["attribution"]) == (63.0, "per-instance")
    else:
        assert (k["utilization"], k["attribution"]) == (None, "unavailable")
    assert k["memory_mib"] == 700.0


def test_keepalive_moves_the_deadline_and_is_bounded(env):
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 10}])
    got = env.tick_until_decision()
    assert actions(got) == [("warning", kid)]
    old = got[0][1].deadline
    code, reply = env.fetch("gpuslice/api/keepalive", "POST", {"kernel_id": kid, "seconds": 40})
    assert code == 200, reply
    [k] = reply["kernels"]
    assert k["id"] == kid and k["deadline"] is not None
    assert reply["extension_left_seconds"] == 60
    status = env.fetch("gpuslice/api/status")[1]
    assert status["kernels"][0]["warning"] is False
    # beyond the admin's maximum: refused with a message
    code, reply = env.fetch("gpuslice/api/keepalive", "POST", {"kernel_id": kid, "seconds": 61})
    assert code == 400 and "at most 60 s more" in reply["message"]
    for body, want in [
        ({"kernel_id": "nope"}, 404),
        ({"seconds": -3}, 400),
        ({"seconds": "10"}, 400),
        ({"minutes": 3}, 400),
    ]:
        assert env.fetch("gpuslice/api/keepalive", "POST", body)[0] == want, body
    got = env.tick(5 * TIMEOUT)
    assert actions(got) == [("warning", kid), ("culled", kid)]
    assert got[1][1].deadline == old + 40
    assert [e["action"] for e in env.events] == ["warning", "extended", "warning", "culled"]


@pytest.mark.parametrize(
    "ext_config",
    [{"exempt_users": ["ann"]}, {"exempt_profiles": ["share-250"]}],
    ids=["user", "profile"],
)
def test_exempt_users_and_profiles_are_never_culled(env, ext_config):
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 10}])
    assert env.tick(20 * TIMEOUT) == []
    assert kid in env.km
    status = env.fetch("gpuslice/api/status")[1]
    assert status["exempt"] is True and status["kernels"][0]["exempt"] is True
    assert "is exempt" in status["exempt_reason"]


@pytest.mark.parametrize(
    "ext_config", [{"memory_cap_mib": 1000, "memory_action": "shutdown", "memory_grace": 30}]
)
def test_memory_over_the_cap_shuts_down_only_that_kernel(env):
    big, big_pid = env.start_kernel()
    small, small_pid = env.start_kernel()
    env.gpu(
        [
            {"pid": big_pid, "used_memory_mib": 3000, "sm_util": 50},
            {"pid": small_pid, "used_memory_mib": 500, "sm_util": 50},
        ]
    )
    got = env.tick(60)
    assert actions(got) == [("memory-warning", big), ("memory-culled", big)]
    assert got[1][0] - got[0][0] >= 30
    assert big not in env.km and small in env.km


def test_notifier_hears_only_what_no_open_tab_could_show(env):
    heard = []
    env.monitor.notifier = heard.append
    env.monitor.notify_without_tab_after = LEAD / 2
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 10}])
    # A tab polls the status throughout the first stretch: it shows the warning itself.
    got = env.tick_until_decision(poll=True)
    assert actions(got) == [("warning", kid)] and heard == []
    # The tab is closed: the cull reaches the user out of band.
    got = env.tick(4 * TIMEOUT)
    assert actions(got) == [("culled", kid)]
    assert [(m["action"], m["user"], m["kernel_id"]) for m in heard] == [("culled", "ann", kid)]


def test_event_schema_is_registered(env):
    assert SCHEMA_ID in env.app.event_logger.schemas.schema_ids


def test_gpu_processes_outside_kernels_count_for_the_server(env):
    # A script started from a terminal runs in the server's tree but in no kernel; the
    # test process is the server here, so its own PID stands in for that script.
    env.gpu([{"pid": os.getpid(), "used_memory_mib": 1024, "sm_util": 60}])
    env.tick(0)
    server = env.fetch("gpuslice/api/status")[1]["server"]
    assert (server["utilization"], server["memory_mib"]) == (60.0, 1024.0)
    assert env.app.web_app.settings.get("gpuslice_last_activity") is not None


def test_the_total_is_the_whole_slice_across_kernels_and_server(env):
    _kid, pid = env.start_kernel()
    env.gpu(
        [
            {"pid": pid, "used_memory_mib": 512, "sm_util": 30},
            {"pid": os.getpid(), "used_memory_mib": 1024, "sm_util": 60},
        ]
    )
    env.tick(0)
    status = env.fetch("gpuslice/api/status")[1]
    assert status["total"] == {"utilization": 90.0, "memory_mib": 1536.0}


def test_batch_job_routes_are_registered_next_to_ours(env):
    ext = env.app.extension_manager.extension_points["gpuslice"].app
    routes = {pattern for pattern, *_ in ext.handlers}
    assert {"/gpuslice/api/status", "/gpuslice/api/keepalive", "/gpuslice/api/release"} <= routes
    assert "/gpuslice/api/jobs" in routes  # gpuslice.jobs_proxy.handlers()


def test_release_without_an_allocation_is_refused(env):
    code, reply = env.fetch("gpuslice/api/release", "POST", {})
    assert code == 409 and "no gpuslice allocation" in reply["message"]
    assert env.fetch("gpuslice/api/release", "POST", {"now": True})[0] == 400


class FakeService:
    """A stand-in for the gpuslice service's three routes the extension calls (the real
    service is exercised end to end in tests/e2e_idle)."""

    def __init__(self, policy: dict) -> None:
        self.policy = policy
        self.requests: list[tuple[str, str, dict | None, str]] = []
        self.up = True


@pytest.fixture
def fake_service(jp_asyncio_loop, monkeypatch, nvml_path):
    import socket

    from tornado import web
    from tornado.httpserver import HTTPServer

    svc = FakeService({"action": "kernel", "idle_timeout": 40, "warning_lead": 10})

    class Handler(web.RequestHandler):
        def prepare(self):
            if not svc.up:
                raise web.HTTPError(503)
            body = json.loads(self.request.body) if self.request.body else None
            auth = self.request.headers.get("Authorization", "")
            svc.requests.append((self.request.method, self.request.path, body, auth))

        def get(self, *args):
            self.write({"policy": svc.policy})

        def post(self, *args):
            self.set_status(202 if "reclaim" in self.request.path else 201)
            self.write({})

    app = web.Application([(r"/svc/api/(idle-policy|events|allocations/7/reclaim)", Handler)])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    monkeypatch.setenv("GPUSLICE_SERVICE_URL", f"http://127.0.0.1:{port}/svc/")
    monkeypatch.setenv("GPUSLICE_ALLOCATION_ID", "7")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "server-token")
    yield svc
    server.stop()


@pytest.mark.parametrize("ext_config", [{"policy_from_service": True}])
def test_policy_from_the_service_and_every_decision_reported(fake_service, env):
    env.run(env.monitor.refresh_policy())
    assert env.monitor.policy.idle_timeout == 40 and env.monitor.policy_source == "service"
    method, path, _, auth = fake_service.requests[0]
    assert (method, path, auth) == ("GET", "/svc/api/idle-policy", "token server-token")
    kid, pid = env.start_kernel()
    env.gpu([{"pid": pid, "used_memory_mib": 10}])
    got = env.tick_until_decision()
    env.fetch("gpuslice/api/keepalive", "POST", {"seconds": 5})
    got += env.tick(10 * 40)
    assert actions(got) == [("warning", kid), ("warning", kid), ("culled", kid)]
    env.run(env.monitor.drain())
    reported = [(b["kind"], b["detail"]["scope"]) for m, _, b, _ in fake_service.requests if b]
    assert reported == [
        ("idle-warning", "kernel"),
        ("idle-extended", "kernel"),
        ("idle-warning", "kernel"),
        ("idle-culled", "kernel"),
    ]
    culled = next(b for _, _, b, _ in fake_service.requests if b and b["kind"] == "idle-culled")
    assert culled["reason"].startswith("GPU idle") and culled["detail"]["allocation_id"] == 7


def idle_server(env, fake_service) -> None:
    """A server under the service's "server" action (40 s, warned 10 s before), with a
    kernel that does nothing on the GPU."""
    fake_service.policy = {"action": "server", "idle_timeout": 40, "warning_lead": 10}
    env.run(env.monitor.refresh_policy())
    env.start_kernel()
    env.gpu([])


@pytest.mark.parametrize("ext_config", [{"policy_from_service": True, "idle_action": "server"}])
def test_server_mode_asks_the_service_and_retries_when_it_is_down(fake_service, env):
    idle_server(env, fake_service)
    fake_service.up = False
    got = env.tick_until_decision()
    assert actions(got) == [("warning", None)]
    got = env.tick(env.clock.t - env.start + 15)
    assert actions(got) == [("culled", None)]
    assert not env.monitor.server_reclaimed  # the service was down: nothing was stopped
    fake_service.up = True
    got = env.tick(env.clock.t - env.start + 90)
    assert actions(got) == [("culled", None)]  # tried again later
    assert env.monitor.server_reclaimed
    calls = [(m, p) for m, p, _, _ in fake_service.requests]
    assert ("POST", "/svc/api/allocations/7/reclaim") in calls
    # the service records a server cull itself; the extension does not post it twice
    assert not any(b and b.get("kind") == "idle-culled" for _, _, b, _ in fake_service.requests)


@pytest.mark.parametrize("ext_config", [{"policy_from_service": True, "idle_action": "server"}])
def test_a_release_is_told_to_every_tab_and_nothing_is_warned_or_culled_after(fake_service, env):
    idle_server(env, fake_service)
    assert actions(env.tick_until_decision()) == [("warning", None)]
    code, reply = env.fetch("gpuslice/api/release", "POST", {})
    assert code == 202 and reply["released"] is True, reply
    env.run(env.event_logger.gather_listeners())
    # every tab's event stream hears it: the tabs that did not ask stop counting down
    assert env.events[-1]["action"] == "released" and env.events[-1]["kernel_id"] is None
    assert env.events[-1]["reason"] == "released by the user"
    # still idle, past the old deadline, while the hub stops the server: no warning, no
    # second reclaim of a slice already given back
    assert env.tick(env.clock.t - env.start + 200) == []
    reclaims = [b for _, p, b, _ in fake_service.requests if p.endswith("/reclaim")]
    assert [b["voluntary"] for b in reclaims] == [True]


@pytest.mark.parametrize("ext_config", [{"policy_from_service": True}])
def test_unreachable_service_falls_back_to_the_local_policy(env):
    env.monitor.service.http = JSONClient("http://127.0.0.1:9/", "t", retry_delay=0.01)
    assert env.monitor.service.configured  # so the policy is asked for, and nobody answers
    env.run(env.monitor.refresh_policy())
    assert env.monitor.policy_source == "local" and env.monitor.policy.idle_timeout == TIMEOUT
