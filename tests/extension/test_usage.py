"""Usage reports from the Monitor to the service: the Monitor is driven tick by tick with a
test clock and scripted GPU readings; the service is a small Tornado app on a real port
that records what it is sent (the HTTP boundary is real; the hub's own endpoint is tested
end to end on the hub side)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from gpuslice.activity import SERVER_KEY, Activity, ActivityReport, Attribution, IdleTrackers
from gpuslice.activity.usage import UsageWindow, total_memory, total_utilization
from gpuslice.extension.memcap import MemoryCap
from gpuslice.extension.monitor import Monitor, SliceInfo, _total_json
from gpuslice.extension.service import ServiceClient
from gpuslice.idle_policy import IdlePolicy

MiB = 1024 * 1024
STEP = 5.0
T0 = 1_800_000_000.0
PER_PROCESS = Attribution.PER_PROCESS
PER_INSTANCE = Attribution.PER_INSTANCE


def act(util, mib=None, devices=("GPU-0",), attribution=PER_PROCESS):
    memory = None if mib is None else int(mib * MiB)
    return Activity(util, memory, attribution, devices=tuple(devices) if util or mib else ())


NOTHING = Activity(0.0, 0, PER_PROCESS)
UNKNOWN = Activity(None, None, Attribution.UNAVAILABLE)


# -- the aggregation on its own ----------------------------------------------------------


def test_owners_on_one_device_add_up_and_cap_at_100():
    assert total_utilization([act(30), act(25), NOTHING]) == 55.0
    assert total_utilization([act(70), act(60)]) == 100.0


def test_owners_on_different_devices_give_the_busiest_device():
    assert total_utilization([act(30, devices=["A"]), act(45, devices=["B"])]) == 45.0
    a30, a20, b45 = act(30, devices=["A"]), act(20, devices=["A"]), act(45, devices=["B"])
    assert total_utilization([a30, a20, b45]) == 50.0


def test_a_per_instance_figure_is_taken_once():
    # Both kernels on one MIG instance with GPM: each sees the instance's 40 %.
    mig = {"devices": ["MIG-a"], "attribution": PER_INSTANCE}
    assert total_utilization([act(40, **mig), act(40, **mig)]) == 40.0


def test_unknown_anywhere_is_unknown_and_no_gpu_use_is_zero():
    assert total_utilization([act(50), UNKNOWN]) is None
    assert total_utilization([NOTHING, NOTHING]) == 0.0
    assert total_utilization([]) == 0.0
    assert total_memory([act(1, 100), act(1, 28), UNKNOWN]) == 128 * MiB
    assert total_memory([UNKNOWN]) is None


def test_window_mean_skips_unknown_ticks_and_keeps_the_peak_memory():
    w = UsageWindow()
    for t, util, mem in [(0, 10.0, 100), (5, None, None), (10, 30.0, 300), (15, 20.0, 200)]:
        w.add(T0 + t, util, mem * MiB if mem else None)
    got = w.take(T0 + 20)
    assert (got.utilization, got.memory_mib, got.interval_seconds, got.ticks) == (
        20.0,
        300.0,
        20.0,
        4,
    )
    # The next interval starts where this one ended.
    w.add(T0 + 25, None, None)
    got = w.take(T0 + 30)
    assert (got.utilization, got.memory_mib, got.interval_seconds) == (None, None, 10.0)


# -- the Monitor and a recording service -------------------------------------------------


@dataclass
class Recorder:
    bodies: list[dict] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)
    status: int = 200
    hold: asyncio.Event | None = None  # set: the service answers only once it is set
    url: str = ""


@pytest.fixture
async def service() -> AsyncIterator[Recorder]:
    rec = Recorder()

    class Usage(web.RequestHandler):
        async def post(self, alloc_id: str) -> None:
            rec.bodies.append(json.loads(self.request.body))
            rec.auth.append(self.request.headers.get("Authorization", ""))
            if rec.hold is not None:
                await rec.hold.wait()
            self.set_status(rec.status)
            if rec.status == 200:
                self.write({"allocation_id": int(alloc_id), "recorded_at": "2027-01-15T08:00:00Z"})
            else:
                self.write({"status": rec.status, "message": "no such route yet"})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(web.Application([(r"/svc/api/allocations/(\d+)/usage", Usage)]))
    server.listen(port, "127.0.0.1")
    rec.url = f"http://127.0.0.1:{port}/svc/"
    yield rec
    if rec.hold is not None:
        rec.hold.set()
    server.stop()


class ScriptedSampler:
    """Stands in for the ActivitySampler: each tick returns the report set for it."""

    def __init__(self) -> None:
        self.server = NOTHING
        self.kernels: dict[str, Activity] = {}
        self.now = T0
        self.fail = False

    def tick(self, kernels):
        if self.fail:
            raise RuntimeError("NVML: driver not loaded")
        return ActivityReport(time=self.now, kernels=dict(self.kernels), server=self.server)

    def close(self) -> None:
        pass


class NoKernels:
    last_kernel_activity = None

    def list_kernel_ids(self):
        return []

    def __contains__(self, kid):
        return False


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def make_monitor(url: str, interval: float, allocation_id: int | None = 7, policy=None):
    sampler = ScriptedSampler()
    clock = Clock()
    monitor = Monitor(
        sampler=sampler,  # type: ignore[arg-type]
        trackers=IdleTrackers(window=10.0, threshold=1.0),
        policy=policy or IdlePolicy(idle_timeout=0),
        memcap=MemoryCap(0, "warn"),
        kernel_manager=NoKernels(),
        event_logger=None,
        web_settings={},
        slice_info=SliceInfo(profile="share-250"),
        service=ServiceClient(url, "server-token", allocation_id, "ann", timeout=5),
        usage_interval=interval,
        clock=clock,
    )
    return monitor, sampler, clock


async def tick_until(monitor, sampler, clock, until: float, readings=None, settle=True):
    """Tick every STEP seconds while the clock is at most *until* seconds past T0;
    *readings*(t) sets the sampler's figures for the tick at t seconds. With *settle*, a
    report sent at a tick is answered before the next (test seconds pass instantly; real
    ones leave the service ample time)."""
    while clock.t <= T0 + until:
        if readings is not None:
            readings(clock.t - T0)
        sampler.now = clock.t
        await monitor.tick()
        if settle:
            await monitor.usage.drain()
        clock.t += STEP


async def test_the_mean_over_the_interval_is_reported(service):
    monitor, sampler, clock = make_monitor(service.url, 60)

    def readings(t):
        # a kernel at 10, 20, 30 ... percent, and a terminal script at 5 % beside it
        sampler.kernels = {"k": act(10 + (t // STEP) % 4 * 10, mib=512 + t)}
        sampler.server = act(5, mib=100)

    await tick_until(monitor, sampler, clock, 60, readings)
    await monitor.drain()
    [body] = service.bodies
    # 13 ticks at 0..60 s: the kernel's 10,20,30,40,... plus the script's 5 each time
    kernel = [10 + (i % 4) * 10 for i in range(13)]
    assert body["utilization"] == pytest.approx(sum(kernel) / 13 + 5, abs=0.01)
    assert body["memory_mib"] == 512 + 60 + 100  # the peak, at the last tick
    assert body["interval_seconds"] == 60
    assert body["idle_seconds"] == 0  # busy throughout
    assert set(body) == {"utilization", "memory_mib", "idle_seconds", "interval_seconds"}
    assert service.auth == ["token server-token"]


async def test_unknown_utilization_is_null_and_idle_time_is_the_whole_servers(service):
    monitor, sampler, clock = make_monitor(service.url, 30)
    # MIG without GPM: memory known, utilization never; no kernel executes.
    sampler.kernels = {"k": Activity(None, 700 * MiB, Attribution.UNAVAILABLE, devices=("MIG-a",))}
    await tick_until(monitor, sampler, clock, 30)
    # then measurable and idle, a second kernel idle from its first tick
    sampler.kernels = {"k": NOTHING, "k2": NOTHING}
    await tick_until(monitor, sampler, clock, 60)
    await monitor.drain()
    first, second = service.bodies
    assert (first["utilization"], first["memory_mib"]) == (None, 700.0)
    assert (second["utilization"], second["memory_mib"]) == (0.0, 0.0)
    # Every owner is idle; the least idle one decides: k2, first seen at 35 s, has two
    # closed 10 s windows at 60 s, while the server's idle run goes back to 0 s.
    states = monitor.states
    assert second["idle_seconds"] == min(s.idle_seconds for s in states.values()) > 0
    assert second["idle_seconds"] < states[SERVER_KEY].idle_seconds


@pytest.mark.parametrize("interval", [20.0, 45.0])
async def test_reports_come_every_interval(service, interval):
    monitor, sampler, clock = make_monitor(service.url, interval)
    sampler.kernels = {"k": act(50)}
    await tick_until(monitor, sampler, clock, 180)
    await monitor.drain()
    assert len(service.bodies) == int(180 // interval)
    assert all(b["interval_seconds"] == interval for b in service.bodies)
    assert all(b["utilization"] == 50.0 for b in service.bodies)


@pytest.mark.parametrize(
    ("interval", "allocation_id", "configured"),
    [(0, 7, True), (60, None, True), (60, 7, False)],
    ids=["interval-0-is-off", "no-allocation", "no-service"],
)
async def test_no_reports_when_off_or_nothing_to_report_to(
    service, interval, allocation_id, configured
):
    monitor, sampler, clock = make_monitor(
        service.url if configured else "", interval, allocation_id=allocation_id
    )
    sampler.kernels = {"k": act(50)}
    await tick_until(monitor, sampler, clock, 600)
    await monitor.drain()
    assert service.bodies == [] and monitor.usage.window.ticks == 0


async def test_a_failing_service_is_logged_once_and_reports_go_on(service, caplog):
    monitor, sampler, clock = make_monitor(service.url, 20)
    sampler.kernels = {"k": act(50)}
    service.status = 404  # a hub that does not have the endpoint yet
    caplog.set_level(logging.DEBUG, logger="gpuslice.extension")
    for until in (20, 40, 60):
        await tick_until(monitor, sampler, clock, until)
        await monitor.drain()
    assert len(service.bodies) == 3
    ours = [r for r in caplog.records if r.name == "gpuslice.extension"]
    warnings = [r for r in ours if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "no such route yet" in warnings[0].getMessage()
    service.status = 200
    await tick_until(monitor, sampler, clock, 80)
    await monitor.drain()
    assert len(service.bodies) == 4 and monitor.usage.sent == 1
    assert any("reach the service again" in r.getMessage() for r in caplog.records)
    # failing again after a recovery is news again
    service.status = 409
    await tick_until(monitor, sampler, clock, 100)
    await monitor.drain()
    ours = [r for r in caplog.records if r.name == "gpuslice.extension"]
    assert len([r for r in ours if r.levelno == logging.WARNING]) == 2


async def test_an_unreachable_service_changes_no_decision(service):
    policy = IdlePolicy(action="kernel", idle_timeout=40, warning_lead=10)
    decisions = {}
    for name, url in [("reachable", service.url), ("down", "http://127.0.0.1:9/")]:
        monitor, sampler, clock = make_monitor(url, 10, policy=policy)
        sampler.kernels = {"k": NOTHING}
        got = []
        while clock.t <= T0 + 200:
            sampler.now = clock.t
            got += [(clock.t - T0, d.action) for d in await monitor.tick()]
            clock.t += STEP
        await monitor.drain()
        decisions[name] = got
    assert decisions["down"] == decisions["reachable"]
    assert [a for _, a in decisions["down"]] == ["warning", "culled"]


async def test_at_most_one_report_in_flight(service):
    monitor, sampler, clock = make_monitor(service.url, 20)
    sampler.kernels = {"k": act(20)}
    service.hold = asyncio.Event()
    await tick_until(monitor, sampler, clock, 20, settle=False)
    # wait for the request to arrive (it stays unanswered)
    for _ in range(500):
        if service.bodies:
            break
        await asyncio.sleep(0.01)
    assert len(service.bodies) == 1
    sampler.kernels = {"k": act(80)}
    await tick_until(monitor, sampler, clock, 95, settle=False)
    assert len(service.bodies) == 1  # three more intervals passed: nothing queued behind it
    service.hold.set()
    await monitor.drain()
    # The next report covers everything since the first one ended, at the new level.
    await tick_until(monitor, sampler, clock, 100)
    await monitor.drain()
    assert len(service.bodies) == 2
    assert service.bodies[1]["interval_seconds"] == 80.0
    assert service.bodies[1]["utilization"] == 80.0


async def test_a_failed_reading_adds_nothing_to_the_interval(service):
    monitor, sampler, clock = make_monitor(service.url, 30)
    sampler.kernels = {"k": act(40)}
    await tick_until(monitor, sampler, clock, 10)
    sampler.fail = True
    await tick_until(monitor, sampler, clock, 25)
    sampler.fail = False
    sampler.kernels = {"k": act(10)}
    await tick_until(monitor, sampler, clock, 30)
    await monitor.drain()
    [body] = service.bodies
    # ticks 0, 5, 10 at 40 % and 30 at 10 %; 15, 20, 25 could not be read
    assert body["utilization"] == pytest.approx((3 * 40 + 10) / 4)


def test_the_status_bar_total_is_combined_as_the_reports_are():
    # (the status route's "total": one definition with the usage report's figure)
    per_instance = Activity(50.0, 1024 * MiB, Attribution.PER_INSTANCE, (1,), ("mig-0",))
    other = Activity(50.0, 512 * MiB, Attribution.PER_INSTANCE, (2,), ("mig-0",))
    idle_server = Activity(0.0, None, Attribution.PER_PROCESS)
    # two kernels on one MIG instance share its figure: counted once, not 100 %
    both = ActivityReport(0.0, {"a": per_instance, "b": other}, idle_server)
    assert _total_json(both) == {"utilization": 50.0, "memory_mib": 1536.0}
    # a MIG instance without GPM: unknown, never the 0 % of what could be read
    unknown = Activity(None, 1024 * MiB, Attribution.UNAVAILABLE, (1,), ("mig-0",))
    assert _total_json(ActivityReport(0.0, {"a": unknown}, idle_server))["utilization"] is None
    # two whole GPUs: the busiest one's figure, not the sum
    g0 = Activity(70.0, None, Attribution.PER_PROCESS, (1,), ("gpu-0",))
    g1 = Activity(40.0, None, Attribution.PER_PROCESS, (2,), ("gpu-1",))
    assert _total_json(ActivityReport(0.0, {"a": g0, "b": g1}, idle_server))["utilization"] == 70
