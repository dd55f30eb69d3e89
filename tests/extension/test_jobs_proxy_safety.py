"""The batch-job routes of a real single-user server (the gpuslice server extension) against
the user's own planted links and bad request bodies.

The gpuslice service is a small fake on a real port (no JupyterHub here; the real service is
exercised end to end in tests/jobs/test_jobs_proxy.py). Code the user runs can plant links
anywhere under the notebook root: ``gpu-jobs`` itself, a job folder, the notebook snapshot
or an output file. Whatever is planted, nothing outside the root is read or written, and
no request body gets anything but a 4xx with a JSON message.
"""

# The fixtures imported from test_extension are parameters of the tests here.
# ruff: noqa: F811

from __future__ import annotations

import json
import os
import socket
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nbformat
import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from gpuslice.jobs_proxy import Service
from tests.extension.test_extension import (  # noqa: F401  (fixtures)
    env,
    ext_config,
    jp_server_config,
    nvml_path,
)

MAX_ID = 2**63 - 1
SECRET = "do not read me"
PRECIOUS = b"precious bytes outside the notebook folder\n"
OUTPUT_NB = nbformat.writes(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("out")]))
OUTPUT_HTML = b"<html><body>output</body></html>"
LOG = "[t] job started\n[t] job completed\n"


POST_JOBS = ("POST", "/svc/api/jobs")


class FakeJobs:
    """The service's job routes the server calls, with jobs kept in a dict."""

    def __init__(self) -> None:
        self.jobs: dict[int, dict[str, Any]] = {}
        self.calls: list[tuple[str, str, Any]] = []
        self.next_id = 1
        # what the service's api/profiles says of its GPUSliceService.max_notebook_bytes
        self.max_notebook_bytes = 16 * 1024 * 1024

    def add(self, path: str, state: str = "queued", **fields: Any) -> dict[str, Any]:
        job_id = self.next_id
        self.next_id += 1
        name = fields.pop("name", None) or Path(path).stem
        job = {
            "id": job_id,
            "name": name,
            "state": state,
            "profile": "mig-1g.10gb",
            "priority": "preemptible",
            "parameters": {},
            "path": path,
            "output_path": f"gpu-jobs/{name}-{job_id}",
            **fields,
        }
        self.jobs[job_id] = job
        return job

    def posted(self) -> list[dict[str, Any]]:
        """The submissions."""
        return [body for method, path, body in self.calls if (method, path) == POST_JOBS]

    def collected(self) -> list[str]:
        """The jobs the server said it had copied the outputs of."""
        return [p.split("/")[-2] for m, p, _ in self.calls if m == "POST" and "collected" in p]

    def job_calls(self) -> list[tuple[str, str]]:
        """Every call but the watcher's listing."""
        return [(m, p) for m, p, _ in self.calls if p != "/svc/api/jobs" or m != "GET"]


@pytest.fixture
def jobs(env, jp_root_dir):
    svc = FakeJobs()

    class Base(web.RequestHandler):
        def prepare(self) -> None:
            body = json.loads(self.request.body) if self.request.body else None
            svc.calls.append((self.request.method, self.request.path, body))

        def job(self, job_id: str) -> dict[str, Any]:
            number = int(job_id)
            if number > MAX_ID or number not in svc.jobs:
                raise web.HTTPError(404)
            return svc.jobs[number]

        def write_error(self, status_code: int, **kw: Any) -> None:
            self.finish({"message": f"fake service: {status_code}"})

    class List(Base):
        def get(self) -> None:
            self.write({"jobs": []})  # the watcher stops after one round

        def post(self) -> None:
            body = json.loads(self.request.body)
            job = svc.add(body["path"], name=body.get("name"), profile=body.get("profile"))
            self.set_status(201)
            self.write(job)

    class One(Base):
        def get(self, job_id: str) -> None:
            self.write(self.job(job_id))

        def delete(self, job_id: str) -> None:
            job = self.job(job_id)
            job["state"] = "cancelled"
            self.write(job)

    class Output(Base):
        def get(self, job_id: str) -> None:
            self.job(job_id)
            if self.get_argument("format") == "html":
                self.write(OUTPUT_HTML)
            else:
                self.write(OUTPUT_NB)

    class Log(Base):
        def get(self, job_id: str) -> None:
            self.job(job_id)
            self.write({"log": LOG})

    class Collected(Base):
        def post(self, job_id: str) -> None:
            self.write(self.job(job_id))

    class Profiles(Base):
        def get(self) -> None:
            self.write({"profiles": [], "jobs": {"max_notebook_bytes": svc.max_notebook_bytes}})

    app = web.Application(
        [
            (r"/svc/api/jobs", List),
            (r"/svc/api/jobs/(\d+)", One),
            (r"/svc/api/jobs/(\d+)/output", Output),
            (r"/svc/api/jobs/(\d+)/log", Log),
            (r"/svc/api/profiles", Profiles),
            (r"/svc/api/jobs/(\d+)/collected", Collected),
        ]
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = HTTPServer(app)
    server.listen(port, "127.0.0.1")
    settings = env.app.web_app.settings
    settings["gpuslice_jobs_service"] = Service(f"http://127.0.0.1:{port}/svc/", "server-token")
    yield svc
    watcher = settings.get("gpuslice_jobs_watcher")
    if watcher is not None and watcher.task is not None and not watcher.task.done():
        watcher.task.cancel()
    server.stop()


def fetch(env, path: str, method: str = "GET", body: Any = None) -> tuple[int, Any]:
    """``body``: bytes as they are, anything else as JSON."""
    kw: dict[str, Any] = {"method": method, "raise_error": False}
    if body is not None:
        kw["body"] = body if isinstance(body, bytes) else json.dumps(body)
    elif method == "POST":
        kw["body"] = b""
    r = env.run(env._fetch(*path.split("/"), **kw))
    return r.code, json.loads(r.body) if r.body else None


def api(path: str) -> str:
    return "gpuslice/api/" + path


def write_notebook(path: Path, text: str) -> dict[str, Any]:
    path.parent.mkdir(parents=True, exist_ok=True)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(text)])
    nbformat.write(nb, path)
    return json.loads(path.read_text())


def tree(path: Path) -> dict[str, tuple[bytes | None, int]]:
    """Everything under ``path`` (itself included): contents and modification times."""
    out: dict[str, tuple[bytes | None, int]] = {".": (None, path.lstat().st_mtime_ns)}
    for p in sorted(path.rglob("*")):
        data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
        out[str(p.relative_to(path))] = (data, p.lstat().st_mtime_ns)
    return out


@pytest.fixture
def outside(tmp_path, jp_root_dir):
    """A folder next to the notebook root, with a notebook and a file the user may link to."""
    folder = tmp_path / "outside"
    folder.mkdir()
    assert jp_root_dir.resolve() not in folder.resolve().parents
    write_notebook(folder / "secret.ipynb", f"print({SECRET!r})")
    (folder / "precious.txt").write_bytes(PRECIOUS)
    return folder


@pytest.fixture
def root(jp_root_dir):
    write_notebook(jp_root_dir / "work" / "answer.ipynb", "print('answer', 6 * 7)")
    return jp_root_dir


def submit_body(**extra: Any) -> dict[str, Any]:
    return {"path": "work/answer.ipynb", "profile": "mig-1g.10gb", **extra}


def refused(code: int, reply: Any, *names: str) -> None:
    assert 400 <= code < 500, (code, reply)
    assert isinstance(reply, dict) and isinstance(reply.get("message"), str), reply
    for name in names:
        assert name in reply["message"], (name, reply)


def no_secret_sent(jobs: FakeJobs) -> None:
    assert SECRET not in json.dumps(jobs.calls)


# -- the way it works when nothing is planted ---------------------------------------------


def test_submit_outputs_and_resubmit_land_in_the_job_folder(jobs, env, root):
    submitted = json.loads((root / "work" / "answer.ipynb").read_text())
    code, job = fetch(env, api("jobs"), "POST", submit_body())
    assert code == 201, job
    assert job["output_path"] == "gpu-jobs/answer-1"
    assert jobs.posted()[0]["notebook"] == submitted
    assert jobs.posted()[0]["path"] == "work/answer.ipynb"
    folder = root / "gpu-jobs" / "answer-1"
    assert json.loads((folder / "answer.ipynb").read_text()) == submitted

    jobs.jobs[1]["state"] = "completed"
    code, reply = fetch(env, api("jobs/1"))
    assert code == 200 and reply["state"] == "completed"
    assert (folder / "output.ipynb").read_text() == OUTPUT_NB
    assert (folder / "output.html").read_bytes() == OUTPUT_HTML
    assert (folder / "job.log").read_text() == LOG
    assert json.loads((folder / ".gpuslice-job.json").read_text()) == {
        "id": 1,
        "state": "completed",
    }
    # and the service is told, once all of it is here: it may remove the job's own folder
    assert jobs.collected() == ["1"]
    # copied once: the next look asks the service for the job only
    before = len(jobs.job_calls())
    assert fetch(env, api("jobs/1"))[0] == 200
    assert jobs.job_calls()[before:] == [("GET", "/svc/api/jobs/1")]

    (root / "work" / "answer.ipynb").unlink()  # the snapshot is what runs again
    code, again = fetch(env, api("jobs/1/resubmit"), "POST", {})
    assert code == 201, again
    assert again["id"] == 2 and again["profile"] == "mig-1g.10gb"
    assert jobs.posted()[1]["notebook"] == submitted
    assert jobs.posted()[1]["path"] == "work/answer.ipynb"
    assert json.loads((root / "gpu-jobs" / "answer-2" / "answer.ipynb").read_text()) == submitted


def test_a_missing_snapshot_is_404(jobs, env, root):
    jobs.add("work/answer.ipynb", "completed")
    code, reply = fetch(env, api("jobs/1/resubmit"), "POST", {})
    assert code == 404 and "snapshot of job 1 is gone" in reply["message"], reply
    assert jobs.posted() == []


def test_a_source_notebook_linked_from_outside_is_refused(jobs, env, root, outside):
    before = tree(outside)
    os.symlink(outside / "secret.ipynb", root / "link.ipynb")
    code, reply = fetch(env, api("jobs"), "POST", submit_body(path="link.ipynb"))
    refused(code, reply, "link.ipynb")
    assert jobs.posted() == []
    no_secret_sent(jobs)
    assert tree(outside) == before


# -- links planted in gpu-jobs/ -----------------------------------------------------------


def test_gpu_jobs_linked_outside(jobs, env, root, outside):
    """``gpu-jobs`` -> a folder outside, holding what looks like job 1's folder."""
    write_notebook(outside / "answer-1" / "answer.ipynb", f"print({SECRET!r})")
    os.symlink(outside, root / "gpu-jobs")
    jobs.add("work/answer.ipynb", "completed")
    before = tree(outside)

    code, reply = fetch(env, api("jobs"), "POST", submit_body())
    refused(code, reply, "gpu-jobs")
    code, reply = fetch(env, api("jobs/1/resubmit"), "POST", {})
    refused(code, reply, "gpu-jobs/answer-1/answer.ipynb")
    assert jobs.posted() == []  # nothing submitted, nothing read

    code, reply = fetch(env, api("jobs/1"))  # finished: outputs would be copied
    assert code == 200 and reply["id"] == 1
    no_secret_sent(jobs)
    assert tree(outside) == before
    assert (root / "gpu-jobs").is_symlink()


def test_job_folder_linked_outside(jobs, env, root, outside):
    """``gpu-jobs/<folder>`` -> a folder outside: an old job's, and the next job's."""
    write_notebook(outside / "answer.ipynb", f"print({SECRET!r})")
    (root / "gpu-jobs").mkdir()
    os.symlink(outside, root / "gpu-jobs" / "answer-1")
    os.symlink(outside, root / "gpu-jobs" / "answer-2")  # the id the next job will get
    jobs.add("work/answer.ipynb", "completed")
    before = tree(outside)

    code, reply = fetch(env, api("jobs/1/resubmit"), "POST", {})
    refused(code, reply, "gpu-jobs/answer-1/answer.ipynb")
    assert jobs.posted() == []

    code, reply = fetch(env, api("jobs/1"))
    assert code == 200 and reply["id"] == 1
    assert ("GET", "/svc/api/jobs/1/log") not in jobs.job_calls()  # nothing to copy into

    code, reply = fetch(env, api("jobs"), "POST", submit_body())
    refused(code, reply, "gpu-jobs/answer-2/answer.ipynb", "cancelled")
    assert len(jobs.posted()) == 1  # the service had it: it is taken back
    assert ("DELETE", "/svc/api/jobs/2") in jobs.job_calls()
    assert jobs.jobs[2]["state"] == "cancelled"

    no_secret_sent(jobs)
    assert tree(outside) == before


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
def test_snapshot_linked_to_a_file_outside(jobs, env, root, outside, kind):
    """``gpu-jobs/<folder>/<notebook>.ipynb`` -> a notebook outside: never read, never
    written, whether it is the old job's snapshot or where the next one would go."""
    link = os.symlink if kind == "symlink" else os.link
    for n in (1, 2):
        (root / "gpu-jobs" / f"answer-{n}").mkdir(parents=True)
        link(outside / "secret.ipynb", root / "gpu-jobs" / f"answer-{n}" / "answer.ipynb")
    jobs.add("work/answer.ipynb", "completed")
    before = tree(outside)

    code, reply = fetch(env, api("jobs/1/resubmit"), "POST", {})
    refused(code, reply, "gpu-jobs/answer-1/answer.ipynb")
    assert jobs.posted() == []

    code, reply = fetch(env, api("jobs"), "POST", submit_body())
    refused(code, reply, "gpu-jobs/answer-2/answer.ipynb")
    assert jobs.jobs[2]["state"] == "cancelled"

    no_secret_sent(jobs)
    assert tree(outside) == before


@pytest.mark.parametrize("kind", ["symlink", "hardlink"])
@pytest.mark.parametrize("name", ["output.ipynb", "output.html", "job.log"])
def test_outputs_are_never_written_through_a_link(jobs, env, root, outside, name, kind):
    folder = root / "gpu-jobs" / "answer-1"
    folder.mkdir(parents=True)
    (os.symlink if kind == "symlink" else os.link)(outside / "precious.txt", folder / name)
    jobs.add("work/answer.ipynb", "completed")
    before = tree(outside)

    code, reply = fetch(env, api("jobs/1"))
    assert code == 200 and reply["state"] == "completed"
    assert tree(outside) == before
    assert (outside / "precious.txt").read_bytes() == PRECIOUS
    assert (folder / name).is_symlink() == (kind == "symlink")
    # the rest was copied
    written = {"output.ipynb", "output.html", "job.log", ".gpuslice-job.json"} - {name}
    assert {p.name for p in folder.iterdir() if not p.is_symlink() and p.stat().st_nlink == 1} == (
        written
    )
    # not all of it: the service keeps the job's folder (until its history retention)
    assert jobs.collected() == []


def test_the_done_marker_is_neither_read_nor_written_through_a_link(jobs, env, root, outside):
    """A marker linked to a file saying "already copied" must not stop the copy either."""
    (outside / "marker.json").write_text(json.dumps({"id": 1, "state": "completed"}))
    folder = root / "gpu-jobs" / "answer-1"
    folder.mkdir(parents=True)
    os.symlink(outside / "marker.json", folder / ".gpuslice-job.json")
    jobs.add("work/answer.ipynb", "completed")
    before = tree(outside)

    code, _ = fetch(env, api("jobs/1"))
    assert code == 200
    assert (folder / "output.ipynb").read_text() == OUTPUT_NB
    assert (folder / ".gpuslice-job.json").is_symlink()
    assert tree(outside) == before


def test_a_fifo_for_the_snapshot_is_refused_without_blocking(jobs, env, root):
    (root / "gpu-jobs" / "answer-1").mkdir(parents=True)
    os.mkfifo(root / "gpu-jobs" / "answer-1" / "answer.ipynb")
    jobs.add("work/answer.ipynb", "completed")
    code, reply = fetch(env, api("jobs/1/resubmit"), "POST", {})
    refused(code, reply, "gpu-jobs/answer-1/answer.ipynb")
    assert jobs.posted() == []


# -- request bodies -----------------------------------------------------------------------

DEEP_ARRAY = b"[" * 50_000 + b"]" * 50_000
DEEP_FIELD = b'{"parameters": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001
BIG = b'{"path": "' + b"a" * (2 * 1024 * 1024) + b'"}'

BAD_BODIES = {
    "deep array": (DEEP_ARRAY, 400, "nested"),
    "deep object": (DEEP_FIELD, 400, "nested"),
    "lone surrogate": (rb'{"path": "\ud800.ipynb"}', 400, "Unicode"),
    "lone surrogate key": (rb'{"\udfff": 1}', 400, "Unicode"),
    "invalid UTF-8": (b'{"path": "\xff\xfe.ipynb"}', 400, "JSON"),
    "2 MiB": (BIG, 413, "larger"),
    "NaN": (b'{"path": "work/answer.ipynb", "max_runtime": NaN}', 400, "NaN"),
    "Infinity": (b'{"path": "work/answer.ipynb", "slices": -Infinity}', 400, "Infinity"),
    "1e400": (b'{"path": "work/answer.ipynb", "max_runtime": 1e400}', 400, "too large"),
    "long string": (json.dumps({"name": "x" * 70_000}).encode(), 400, "longer"),
    "not JSON": (b"{path: 1}", 400, "JSON"),
    "array": (b"[]", 400, "object"),
    "string": (b'"work/answer.ipynb"', 400, "object"),
    "null": (b"null", 400, "object"),
}


@pytest.mark.parametrize("case", BAD_BODIES)
def test_bad_bodies_are_4xx_on_submit(jobs, env, root, case):
    raw, status, words = BAD_BODIES[case]
    code, reply = fetch(env, api("jobs"), "POST", raw)
    assert code == status, (case, code, reply)
    refused(code, reply, words)
    assert jobs.posted() == []


@pytest.mark.parametrize("case", ["deep array", "lone surrogate key", "invalid UTF-8", "2 MiB"])
@pytest.mark.parametrize("route", ["keepalive", "release"])
def test_bad_bodies_are_4xx_on_the_idle_routes(env, case, route):
    raw, status, words = BAD_BODIES[case]
    code, reply = fetch(env, api(route), "POST", raw)
    assert code == status, (case, code, reply)
    refused(code, reply, words)


WRONG_TYPES = [
    ("path", {}),
    ("path", []),
    ("path", 7),
    ("path", 1.5),
    ("path", True),
    ("path", None),
    ("path", ""),
    ("name", 1),
    ("name", ["a"]),
    ("profile", {"name": "mig-1g.10gb"}),
    ("profile", 3),
    ("priority", {}),
    ("priority", ["high"]),
    ("slices", "2"),
    ("slices", True),
    ("slices", 1.5),
    ("slices", {}),
    ("checkpoint_interval", "10m"),
    ("checkpoint_interval", False),
    ("checkpoint_interval", []),
    ("max_runtime", {}),
    ("max_runtime", "1h"),
    ("parameters", []),
    ("parameters", "x=1"),
    ("parameters", 1),
    ("time_window", 5),
    ("time_window", ["night"]),
    ("burstable", 1),
    ("burstable", "yes"),
]


@pytest.mark.parametrize(("field", "value"), WRONG_TYPES)
def test_wrong_types_are_400_before_the_service_sees_them(jobs, env, root, field, value):
    code, reply = fetch(env, api("jobs"), "POST", submit_body(**{field: value}))
    assert code == 400, (field, value, reply)
    refused(code, reply, "path" if field == "path" else f"'{field}'")
    assert jobs.posted() == []


def test_other_fields_and_paths_are_refused(jobs, env, root):
    code, reply = fetch(env, api("jobs"), "POST", submit_body(evil=1))
    refused(code, reply, "evil")
    for path, status in (("../x.ipynb", 403), ("work", 400), ("work/none.ipynb", 404)):
        code, reply = fetch(env, api("jobs"), "POST", submit_body(path=path))
        assert code == status, (path, reply)
        refused(code, reply, path)
    # a path the system cannot even look up (a name over 255 bytes, a path over 4096) is
    # the user's mistake, told as one: it was a 500 (OSError: File name too long)
    for path in ("x" * 5000 + ".ipynb", "work/" + "a" * 300 + ".ipynb", "a/" * 2500 + "b.ipynb"):
        code, reply = fetch(env, api("jobs"), "POST", submit_body(path=path))
        assert code == 400, (path[:20], code, reply)
        refused(code, reply, "too long")
    assert jobs.posted() == []


@pytest.mark.parametrize("seconds", ["5", [], {}, True, 0, -1, 10**400])
def test_keepalive_seconds_of_the_wrong_kind_are_400(env, seconds):
    code, reply = fetch(env, api("keepalive"), "POST", {"seconds": seconds})
    assert code == 400, (seconds, reply)
    refused(code, reply, "seconds")


@pytest.mark.parametrize("kernel_id", [[], {}, 1, "nope"])
def test_keepalive_unknown_kernels_are_404(env, kernel_id):
    code, reply = fetch(env, api("keepalive"), "POST", {"kernel_id": kernel_id})
    assert code == 404, (kernel_id, reply)
    refused(code, reply, "no kernel")


# -- job ids ------------------------------------------------------------------------------

HUGE = "1" * 30


@pytest.mark.parametrize("job_id", [HUGE, str(MAX_ID + 1), "9" * 5000])
@pytest.mark.parametrize(
    ("method", "suffix"), [("GET", ""), ("DELETE", ""), ("GET", "/log"), ("POST", "/resubmit")]
)
def test_job_ids_beyond_64_bits_are_404(jobs, env, job_id, method, suffix):
    jobs.add("work/answer.ipynb", "completed")
    code, reply = fetch(env, api(f"jobs/{job_id}{suffix}"), method)
    assert code == 404, (job_id, reply)
    refused(code, reply)
    assert jobs.posted() == [] and ("DELETE", "/svc/api/jobs/1") not in jobs.job_calls()


def test_the_largest_job_id_reaches_the_service(jobs, env):
    code, reply = fetch(env, api(f"jobs/{MAX_ID}"))
    assert code == 404, reply
    refused(code, reply, "fake service")
    assert ("GET", f"/svc/api/jobs/{MAX_ID}") in jobs.job_calls()
    code, reply = fetch(env, api("jobs/0001"))  # leading zeros name job 1
    assert code == 404 and ("GET", "/svc/api/jobs/1") in jobs.job_calls()


@pytest.mark.parametrize("mib", [16, 1])
def test_a_notebook_over_the_services_limit_is_refused_before_it_is_sent(jobs, env, root, mib):
    """The limit is the service's max_notebook_bytes, as its api/profiles says (it was 16 MiB
    written here too, whatever the service's setting)."""
    jobs.max_notebook_bytes = mib << 20
    big = root / "work" / "big.ipynb"
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="y" * (mib << 20))]
    nbformat.write(nb, big)
    code, reply = fetch(env, api("jobs"), "POST", submit_body(path="work/big.ipynb"))
    refused(code, reply, f"larger than {mib} MiB", "max_notebook_bytes", "clear its outputs")
    assert code == 413 and jobs.posted() == []
    # one just under the limit is sent
    nb.cells[0].outputs = [nbformat.v4.new_output("stream", text="y" * ((mib << 20) - 4096))]
    nbformat.write(nb, big)
    code, reply = fetch(env, api("jobs"), "POST", submit_body(path="work/big.ipynb"))
    assert code == 201 and len(jobs.posted()) == 1, reply


def test_a_service_that_does_not_answer_in_time_is_a_504_that_says_so(env, root):
    """Tornado reports a timeout as 599, which is no HTTP status: the browser gets 504."""
    with socket.socket() as listener:  # accepts connections, never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        settings = env.app.web_app.settings
        settings["gpuslice_jobs_service"] = Service(
            f"http://127.0.0.1:{port}/svc/", "server-token", timeout=0.5
        )
        code, reply = fetch(env, api("jobs/1"))
    assert code == 504 and "did not answer within 0.5 s" in reply["message"], reply


def test_the_panels_polls_are_not_activity_and_a_submit_is(jobs, env, root):
    # a hidden tab polls while a job is unfinished: that must not keep the server "used"
    settings = env.app.web_app.settings
    long_ago = datetime(2000, 1, 1, tzinfo=UTC)
    settings["api_last_activity"] = long_ago
    assert fetch(env, api("jobs"), "POST", submit_body())[0] == 201
    assert settings["api_last_activity"] > long_ago
    settings["api_last_activity"] = long_ago
    for path in ("jobs", "jobs/1", "jobs/1/log"):
        assert fetch(env, api(path))[0] == 200, path
    assert settings["api_last_activity"] == long_ago
