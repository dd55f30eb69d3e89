"""Job submission through a real single-user server (the gpuslice server extension),
behind a real JupyterHub: path checks, the job folder, outputs copied back, resubmit."""

from __future__ import annotations

import asyncio
import json
import os

import nbformat
import pytest
import requests
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

from tests.harness.hub import wait_for
from tests.jobs.notebooks import notebook

pytestmark = pytest.mark.hub


@pytest.fixture(scope="module")
def proxy_hub(tmp_path_factory):
    from tests.harness.hub import start_hub

    hub = start_hub(
        tmp_path_factory.mktemp("proxy-hub"),
        spawner="gpuslice-simple",
        # a window to submit into (always open: the job itself is not the point)
        extra_service_config='c.JobManager.time_windows = {"always": "00:00-24:00"}\n',
    )
    yield hub
    hub.stop()


def server_api(hub, token, method, path, **kw):
    return requests.request(
        method,
        f"{hub.url}/user/alice/gpuslice/api/{path}",
        headers={"Authorization": f"token {token}"},
        timeout=60,
        **kw,
    )


def test_submit_from_the_server_lands_results_in_the_users_folder(proxy_hub, tmp_path):
    hub = proxy_hub
    alice = hub.add_user("alice")
    home = hub.workdir / "home" / "alice"
    home.mkdir(parents=True, exist_ok=True)
    nb = notebook(["x = 6", "print('answer', x * 7)"])
    (home / "work").mkdir(exist_ok=True)
    nbformat.write(nb, home / "work" / "answer.ipynb")
    outside = tmp_path / "secret.ipynb"
    nbformat.write(nb, outside)
    os.symlink(outside, home / "link.ipynb")
    r = hub.spawn("alice", {"profile": "share-250"})
    assert r.status_code in (201, 202), r.text
    hub.wait_ready("alice")
    try:
        refusals = [
            ({"path": "../secret.ipynb", "profile": "mig-1g.10gb"}, 403),
            ({"path": "link.ipynb", "profile": "mig-1g.10gb"}, 403),
            ({"path": "work/missing.ipynb", "profile": "mig-1g.10gb"}, 404),
            ({"path": "work", "profile": "mig-1g.10gb"}, 400),
            ({"path": "work/answer.ipynb", "profile": "mig-1g.10gb", "evil": 1}, 400),
            ({"path": "work/answer.ipynb", "profile": "no-such"}, 404),
        ]
        for body, status in refusals:
            r = server_api(hub, alice, "POST", "jobs", json=body)
            assert r.status_code == status, (body, r.text)

        r = server_api(
            hub, alice, "POST", "jobs", json={"path": "work/answer.ipynb", "profile": "mig-1g.10gb"}
        )
        assert r.status_code == 201, r.text
        job = r.json()
        assert job["user"] == "alice" and job["path"] == "work/answer.ipynb"
        folder = home / job["output_path"]
        assert job["output_path"] == f"gpu-jobs/answer-{job['id']}"
        assert (folder / "answer.ipynb").is_file()  # the snapshot that was submitted

        def finished():
            j = server_api(hub, alice, "GET", f"jobs/{job['id']}").json()
            return j["state"] in ("completed", "failed") and j

        events = start_listening(hub, alice)
        done = wait_for(finished, 120, "the job to finish")
        assert done["state"] == "completed", done
        out = nbformat.read(folder / "output.ipynb", as_version=4)
        assert "answer 42" in out.cells[-1].outputs[0]["text"]
        assert (folder / "output.html").stat().st_size > 1000
        assert "completed" in (folder / "job.log").read_text()
        # the server told the service it has them: the job's own folder may go in time
        # (JobManager.job_folder_retention_days; until then it stays)
        copied = wait_for(
            lambda: hub.api("GET", f"/api/jobs/{job['id']}", alice).json()["outputs_collected_at"],
            30,
            "the server to report the outputs copied",
        )
        assert copied and (hub.workdir / "gpuslice-jobs" / str(job["id"])).is_dir()

        event = events.result(timeout=30)
        assert event["job_id"] == job["id"] and event["state"] == "completed"
        assert event["output_path"] == job["output_path"]

        listed = server_api(hub, alice, "GET", "jobs").json()["jobs"]
        assert [j["id"] for j in listed] == [job["id"]]
        log = server_api(hub, alice, "GET", f"jobs/{job['id']}/log").json()["log"]
        assert "completed" in log

        again = server_api(hub, alice, "POST", f"jobs/{job['id']}/resubmit")
        assert again.status_code == 201, again.text
        assert again.json()["id"] != job["id"] and again.json()["profile"] == "mig-1g.10gb"
        r = server_api(hub, alice, "DELETE", f"jobs/{again.json()['id']}")
        assert r.status_code == 200 and r.json()["state"] == "cancelled", r.text
        # one cancelled before it started (8 whole GPUs: it never fits here) loses its folder
        # on the service's side at once; the snapshot stays in alice's gpu-jobs folder
        body = {"path": "work/answer.ipynb", "profile": "gpu-1", "slices": 8}
        waiting = server_api(hub, alice, "POST", "jobs", json=body).json()
        service_folder = hub.workdir / "gpuslice-jobs" / str(waiting["id"])
        assert waiting["state"] == "queued" and service_folder.is_dir(), waiting
        r = server_api(hub, alice, "DELETE", f"jobs/{waiting['id']}")
        assert r.status_code == 200 and r.json()["folder_removed_at"] is not None, r.text
        assert not service_folder.exists()
        assert (home / waiting["output_path"] / "answer.ipynb").is_file()

        # the submit dialog's time window and burst choices reach the service (which
        # refuses burst here, naming why), and a resubmission keeps the window
        body = {"path": "work/answer.ipynb", "profile": "mig-1g.10gb", "time_window": "always"}
        windowed = server_api(hub, alice, "POST", "jobs", json=body)
        assert windowed.status_code == 201, windowed.text
        assert windowed.json()["time_window"] == "always"
        again = server_api(hub, alice, "POST", f"jobs/{windowed.json()['id']}/resubmit")
        assert again.status_code == 201 and again.json()["time_window"] == "always", again.text
        for j in (windowed.json(), again.json()):
            server_api(hub, alice, "DELETE", f"jobs/{j['id']}")
        r = server_api(hub, alice, "POST", "jobs", json={**body, "burstable": True})
        assert r.status_code == 400 and "no burst partition" in r.json()["message"], r.text
        for bad in ({"time_window": 5}, {"burstable": 1}, {"burstable": "yes"}):
            r = server_api(hub, alice, "POST", "jobs", json={**body, **bad})
            assert r.status_code == 400 and next(iter(bad)) in r.json()["message"], r.text

        profiles = server_api(hub, alice, "GET", "profiles").json()
        assert "mig-1g.10gb" in json.dumps(profiles)
        # the submit dialog offers alice the classes she may submit, and high is not one
        # (JobManager.priority_access: the admins' by default); asked anyway, it is refused
        assert profiles["jobs"]["allowed_priorities"] == ["preemptible", "normal"]
        r = server_api(hub, alice, "POST", "jobs", json={**body, "priority": "high"})
        assert r.status_code == 403, r.text
        assert "JobManager.priority_access" in r.json()["message"], r.text
    finally:
        hub.hub_api("DELETE", "/users/alice/server")
        hub.wait_gone("alice")


def start_listening(hub, token):
    """Subscribe to the server's event bus (as JupyterLab does) in a background thread;
    the future resolves with the first gpuslice job event."""
    import concurrent.futures
    import threading

    result: concurrent.futures.Future = concurrent.futures.Future()
    ready = threading.Event()

    async def listen() -> None:
        url = hub.url.replace("http", "ws", 1) + "/user/alice/api/events/subscribe"
        req = HTTPRequest(url, headers={"Authorization": f"token {token}"})
        conn = await websocket_connect(req)
        ready.set()
        while True:
            msg = await conn.read_message()
            if msg is None:
                result.set_exception(RuntimeError("event stream closed"))
                return
            data = json.loads(msg)
            if "jobs/v1" in str(data.get("schema_id") or data.get("__schema__")):
                result.set_result(data)
                conn.close()
                return

    def run() -> None:
        try:
            asyncio.run(asyncio.wait_for(listen(), 180))
        except Exception as e:
            if not result.done():
                result.set_exception(e)
            ready.set()

    threading.Thread(target=run, daemon=True).start()
    assert ready.wait(30), "could not subscribe to the server's events"
    return result
