"""What the hub's progress page tells a researcher while their server starts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

from jupyterhub.spawner import SimpleLocalProcessSpawner
from traitlets import Bool, Instance

from gpuslice_hub.client import ServiceClient
from gpuslice_spawner import GPUSliceSimpleSpawner
from gpuslice_spawner.spawner import GPUSliceMixin
from tests.harness.engines import need_module


async def test_the_progress_names_the_slice_as_the_spawn_form_did(monkeypatch):
    """The spawn form offers "Quarter GPU"; the progress page said "Requesting a share-250
    slice" and "Got share-250 on …" (issue 44: internal names where a person reads)."""
    user = SimpleNamespace(name="ann", id=3, url="/user/ann/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    spawner = GPUSliceSimpleSpawner(user=user, hub=hub, user_options={"profile": "share-250"})
    grant = {
        "id": 7,
        "profile": "share-250",
        "display_name": "Quarter GPU",
        "host": "node-a",
        "assignments": [{"mig_uuid": None, "gpu_uuid": "GPU-sim-1"}],
    }
    asked: list[str] = []

    async def allocate(self: Any, profile: str) -> dict[str, Any]:
        asked.append(profile)
        return grant

    async def nothing_left(self: Any, reason: str, starts: int | None = None) -> None:
        return None

    async def started(self: Any) -> tuple[str, int]:
        return ("127.0.0.1", 12345)

    monkeypatch.setattr(GPUSliceSimpleSpawner, "_allocate", allocate)
    monkeypatch.setattr(GPUSliceSimpleSpawner, "_release_unrecorded", nothing_left)
    monkeypatch.setattr(SimpleLocalProcessSpawner, "start", started)
    assert await spawner.start() == ("127.0.0.1", 12345)
    assert asked == ["share-250"]  # the service is asked by the profile's name
    said = [e["message"] for e in spawner._spawn_log.events]
    assert said == [
        "Asking gpuslice for a GPU slice",
        "Got Quarter GPU on node-a (GPU-sim-1)",
        "Starting your server",
        "Server started",
    ]
    assert not any("share-250" in m for m in said)


# -- the wrapped spawner's own progress (issue 46) -------------------------------------------

GRANT = {
    "id": 11,
    "profile": "mig-1g.10gb",
    "display_name": "Small MIG slice",
    "kind": "mig",
    "host": "gpu-node-3",
    "assignments": [
        {
            "gpu_uuid": "GPU-1",
            "gpu_model": "NVIDIA A100-SXM4-80GB",
            "milli": 142,
            "memory_mib": 10240,
            "mig_uuid": "MIG-1",
            "mig_profile": "1g.10gb",
        }
    ],
}


def recorded_service(monkeypatch: Any, asked: list[tuple[str, str]]) -> None:
    """The service's answers to the spawn's calls (its allocations listing, the grant)."""

    async def request(_client: Any, method: str, path: str, body: Any = None, **kw: Any) -> Any:
        asked.append((method, path))
        if (method, path) == ("GET", "api/allocations"):
            return {"allocations": []}
        if (method, path) == ("POST", "api/allocations"):
            assert body["profile"] == GRANT["profile"]
            return GRANT
        raise AssertionError(f"unexpected call {method} {path}")

    monkeypatch.setattr(ServiceClient, "request", request)


async def until(
    predicate: Any, what: str, starting: asyncio.Future[Any], timeout: float = 10.0
) -> None:
    """Poll ``predicate`` on the event loop until true, or fail after ``timeout`` s (or
    with the spawn's own error, if it ended)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if starting.done():
            starting.result()  # its error, if it failed
            raise AssertionError(f"the spawn ended before {what}")
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_batchspawners_queue_messages_follow_the_granted_slice(monkeypatch):
    """GPUSliceMixin.progress never asked the wrapped spawner: batchspawner's "Pending in
    queue..." never reached the progress page, which said "Starting your server" until the
    job ran (issue 46). Here batchspawner's own start() and progress() run, sbatch and
    squeue answering as Slurm does."""
    need_module("batchspawner")
    from gpuslice_spawner.slurm import GPUSliceSlurmSpawner

    user = SimpleNamespace(name="ann", id=3, url="/user/ann/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    spawner = GPUSliceSlurmSpawner(
        user=user,
        hub=hub,
        db=SimpleNamespace(commit=lambda: None),
        user_options={"slice": "mig-1g.10gb"},
        home_dir_template="/cluster/home/{username}",
        startup_poll_interval=0.05,
    )
    asked: list[tuple[str, str]] = []
    recorded_service(monkeypatch, asked)
    squeue = ["PENDING "]  # what `squeue -h -j 4242 -o '%T %B'` prints, as the job goes
    scripts: list[str] = []

    async def run_command(cmd: str, input: str | None = None, env: Any = None) -> str:
        # (batchspawner runs them as the user: "sudo -E -u ann sbatch --parsable")
        if "sbatch" in cmd:
            scripts.append(input or "")
            return "4242"
        assert "squeue" in cmd, cmd
        return squeue[0]

    spawner.run_command = run_command  # type: ignore[method-assign]
    starting = asyncio.ensure_future(spawner.start())
    said = lambda: [e["message"] for e in spawner._spawn_log.events]  # noqa: E731
    await until(lambda: "Pending in queue..." in said(), "batchspawner's queue message", starting)
    assert not starting.done()
    # Slurm starts the job; its server reports its port to the hub
    squeue[0] = "RUNNING gpu-node-3"
    spawner.port = 8888
    assert await starting == ("gpu-node-3", 8888)

    messages = said()
    assert messages[:3] == [
        "Asking gpuslice for a GPU slice",
        "Got Small MIG slice on gpu-node-3 (MIG-1)",
        "Starting your server",
    ]
    assert messages[-1] == "Server started"
    # batchspawner's own words, between gpuslice's, as it said them
    relayed = messages[3:-1]
    assert "Pending in queue..." in relayed
    assert set(relayed) <= {
        "Unknown status...",  # (before sbatch answered)
        "Pending in queue...",
        "Cluster job running... waiting to connect",
    }
    # its events carry no progress: the bar stays where gpuslice left it, never goes back
    bar = [e["progress"] for e in spawner._spawn_log.events if "progress" in e]
    assert bar == sorted(bar) == [10, 40, 60, 90]
    assert "#SBATCH --gres=gpu:1g.10gb:1" in scripts[0]
    assert asked == [("GET", "api/allocations"), ("POST", "api/allocations")]


class PodEventsSpawner(SimpleLocalProcessSpawner):
    """A launcher that reports its own progress with numbers, as KubeSpawner does with its
    pod's events (30, 50, 63, ... towards 90), and starts when the test lets it."""

    let_start = Instance(asyncio.Event, args=())
    started = Bool(False)

    async def start(self) -> tuple[str, int]:
        await self.let_start.wait()
        self.started = True
        return ("10.0.0.7", 8888)

    async def progress(self) -> AsyncIterator[dict[str, Any]]:
        for percent, message in (
            (30, "Successfully assigned jhub/jupyter-ann to gpu-node-3"),
            (50, 'Pulling image "quay.io/jupyter/pytorch-notebook:cuda12-2024-12-02"'),
            (63, "Started container notebook"),
        ):
            yield {"progress": percent, "message": f"[Normal] {message}", "raw_event": {}}
        yield {"message": "Your server is taking longer than usual to start"}  # no number


class GPUSlicePodEventsSpawner(GPUSliceMixin, PodEventsSpawner):
    pass


async def test_the_wrapped_spawners_numbers_move_the_bar_between_gpuslices(monkeypatch):
    user = SimpleNamespace(name="ann", id=3, url="/user/ann/", groups=[])
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/", public_host="")
    spawner = GPUSlicePodEventsSpawner(
        user=user, hub=hub, user_options={"slice": "mig-1g.10gb"}, cmd=["true"]
    )
    recorded_service(monkeypatch, [])
    starting = asyncio.ensure_future(spawner.start())
    events = spawner._spawn_log.events
    await until(
        lambda: any("taking longer" in e["message"] for e in events), "the pod events", starting
    )
    spawner.let_start.set()
    assert await starting == ("10.0.0.7", 8888)
    shown = [(e.get("progress"), e["message"]) for e in events]
    assert shown == [
        (10, "Asking gpuslice for a GPU slice"),
        (40, "Got Small MIG slice on gpu-node-3 (MIG-1)"),
        (60, "Starting your server"),
        (69, "[Normal] Successfully assigned jhub/jupyter-ann to gpu-node-3"),
        (74, '[Normal] Pulling image "quay.io/jupyter/pytorch-notebook:cuda12-2024-12-02"'),
        (78, "[Normal] Started container notebook"),
        (None, "Your server is taking longer than usual to start"),
        (90, "Server started"),
    ]
    assert "raw_event" in events[3]  # the rest of the event is passed on as it was
