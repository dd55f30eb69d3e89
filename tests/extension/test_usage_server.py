"""Usage reports from a real jupyter_server with a real kernel (fake NVML, test clock), to
a small recording service on a real port: the trait, the environment a gpuslice-started
server gets, and the figures of a kernel and a terminal script sharing the GPU."""

from __future__ import annotations

import json
import os
import socket

import pytest
from tornado import web
from tornado.httpserver import HTTPServer
from traitlets import TraitError

from gpuslice.extension.app import GPUSliceExtension
from tests.extension.test_extension import (  # noqa: F401  (fixtures)
    env,
    ext_config,
    jp_server_config,
    nvml_path,
)


@pytest.fixture
def usage_service(jp_asyncio_loop, monkeypatch, nvml_path):  # noqa: F811
    received: list[tuple[str, dict]] = []

    class Usage(web.RequestHandler):
        def post(self, alloc_id):
            received.append((self.request.path, json.loads(self.request.body)))
            self.write({"allocation_id": int(alloc_id), "recorded_at": "2027-01-15T08:00:00Z"})

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(web.Application([(r"/svc/api/allocations/(\d+)/usage", Usage)]))
    server.listen(port, "127.0.0.1")
    monkeypatch.setenv("GPUSLICE_SERVICE_URL", f"http://127.0.0.1:{port}/svc/")
    monkeypatch.setenv("GPUSLICE_ALLOCATION_ID", "12")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "server-token")
    yield received
    server.stop()


@pytest.mark.parametrize("ext_config", [{"usage_report_interval": 30}])
def test_kernel_and_script_on_one_gpu_are_reported_together(usage_service, env):  # noqa: F811
    assert env.monitor.usage.interval == 30 and env.monitor.usage.enabled
    _kid, pid = env.start_kernel()
    env.gpu(
        [
            {"pid": pid, "used_memory_mib": 1024, "sm_util": 30},
            # the server's own PID stands in for a script started from a terminal
            {"pid": os.getpid(), "used_memory_mib": 256, "sm_util": 20},
        ]
    )
    env.tick(30)
    # the kernel stops using the GPU (NVML has no samples for it); the script goes on
    env.gpu(
        [
            {"pid": pid, "used_memory_mib": 1024},
            {"pid": os.getpid(), "used_memory_mib": 256, "sm_util": 20},
        ]
    )
    env.tick(60)
    assert [path for path, _ in usage_service] == ["/svc/api/allocations/12/usage"] * 2
    both, script = (body for _, body in usage_service)
    assert both == {
        "utilization": 50.0,
        "memory_mib": 1280.0,
        "idle_seconds": 0.0,
        "interval_seconds": 30.0,
    }
    assert script == {
        "utilization": 20.0,
        "memory_mib": 1280.0,
        "idle_seconds": 0.0,  # the script keeps the server busy
        "interval_seconds": 30.0,
    }


def test_reports_are_on_by_default_only_with_an_allocation(usage_service, env):  # noqa: F811
    # the default interval, with the environment a gpuslice-started server has
    assert env.monitor.usage.interval == 60 and env.monitor.usage.enabled
    env.tick(60)
    assert len(usage_service) == 1


@pytest.mark.parametrize("ext_config", [{"usage_report_interval": 0}])
def test_interval_zero_sends_nothing(usage_service, env):  # noqa: F811
    env.tick(300)
    assert usage_service == [] and not env.monitor.usage.enabled


def test_a_server_not_started_by_gpuslice_reports_nothing(env):  # noqa: F811
    assert not env.monitor.usage.enabled  # no service URL, no allocation


def test_a_negative_interval_is_refused():
    with pytest.raises(TraitError, match="usage_report_interval must be >= 0"):
        GPUSliceExtension(usage_report_interval=-5)
