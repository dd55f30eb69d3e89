"""What the hub's progress page tells a researcher while their server starts."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from jupyterhub.spawner import SimpleLocalProcessSpawner

from gpuslice_spawner import GPUSliceSimpleSpawner


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
