"""A job's own code owns its folder and its processes, and may be hostile: what it leaves
there or starts must not stall the service, stop it watching the other jobs, keep a slice
forever, or go on using a GPU after the job's slice has gone to someone else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import psutil
import pytest

from gpuslice.run.jobdir import JobDir
from gpuslice_hub.jobs.backends.base import RunStatus
from gpuslice_hub.jobs.backends.local import LocalBackend
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.runner_state import ATTEMPT_ID, runner_claims
from gpuslice_hub.jobs.scheduler import Scheduler
from tests.harness.hub import wait_for
from tests.jobs.full_cluster import PROFILES, hosts
from tests.jobs.test_jobs_hub import nb_json
from tests.jobs.test_restart_recovery import ANN, batch_held, cleanup, row  # noqa: F401
from tests.service.conftest import build_ledger

DEEP = "[" * 100_000 + "]" * 100_000


def test_a_fifo_in_place_of_the_runner_output_is_refused_not_waited_on(tmp_path):
    """With no reader, opening a FIFO to write blocks: the whole scheduler pass would
    wait with it, for every user's jobs."""
    os.mkfifo(tmp_path / "runner.out")
    outcome: list[BaseException | None] = []

    def start() -> None:
        try:
            LocalBackend().start(1, str(tmp_path), {"PATH": os.environ["PATH"]})
            outcome.append(None)
        except OSError as e:
            outcome.append(e)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome, "starting the run waited on the FIFO"
    assert isinstance(outcome[0], OSError)
    assert "its runner.out cannot be written as a plain file" in str(outcome[0])


def test_a_state_nested_past_the_parsers_depth_reads_as_no_state(tmp_path):
    (tmp_path / "state.json").write_text(DEEP)
    assert JobDir(tmp_path).state() == {}
    # the run is gone: its outcome is unknown, which stops nothing else
    assert LocalBackend().poll({"pid": 0, "job_dir": str(tmp_path)}) == RunStatus(False, None)


def test_one_run_that_cannot_be_asked_about_does_not_stop_the_answers_for_the_others(
    tmp_path, monkeypatch
):
    backend = LocalBackend()
    real = backend.poll

    def poll(ref):  # type: ignore[no-untyped-def]
        if ref.get("job_dir") == "broken":
            raise RecursionError("maximum recursion depth exceeded")
        return real(ref)

    monkeypatch.setattr(backend, "poll", poll)
    (tmp_path / "state.json").write_text(json.dumps({"status": "completed"}))
    answers = backend.poll_many([{"job_dir": "broken"}, {"pid": 0, "job_dir": str(tmp_path)}])
    # the broken one concludes nothing (still running); the other is answered
    assert answers == [RunStatus(True), RunStatus(False, 0)]


def test_text_no_database_stores_is_made_storable():
    """A lone surrogate (JSON may spell one) fails every UTF-8 write: the job's end could
    never be recorded, and it would keep its slice."""
    state = json.loads(
        '{"status": "failed", "error": "\\ud800 forged \\u00e9", "attempt_id": "a\\udfffb"}'
    )
    claims = runner_claims(state)
    assert claims["error"] == "\ufffd forged \u00e9" and claims["attempt_id"] == "a\ufffdb"
    claims["error"].encode("utf-8")
    # and NUL, which PostgreSQL's text refuses (a failed cell's own message may hold one)
    claims = runner_claims({"status": "failed", "error": "cell 1: ValueError: bad\x00byte"})
    assert claims["error"] == "cell 1: ValueError: bad\ufffdbyte"


LEFT_BEHIND = """
import os, subprocess, sys, time
# a child that keeps the run's environment, in a session of its own (as a kernel is)
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
# and one that cleans its environment but is still a descendant
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env={})
print("ready", flush=True)
time.sleep(120)
"""


def spawn(attempt: str) -> subprocess.Popen:
    env = {**os.environ, ATTEMPT_ID: attempt, "GPUSLICE_JOB_ID": "7"}
    proc = subprocess.Popen(
        [sys.executable, "-c", LEFT_BEHIND],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def tree(proc: subprocess.Popen) -> list[psutil.Process]:
    top = psutil.Process(proc.pid)
    return [top, *top.children(recursive=True)]


def test_reaping_a_run_kills_every_process_it_left_and_nothing_else():
    mine, other = spawn("attempt-1"), spawn("attempt-2")
    try:
        left = tree(mine)
        assert len(left) == 3
        # the detached child keeps the run's environment: found without the tree too
        detached = [p for p in left[1:] if p.environ().get(ATTEMPT_ID) == "attempt-1"]
        assert len(detached) == 1
        killed = LocalBackend().reap({"attempt_id": "attempt-1", "uid": os.getuid()})
        assert killed == 3
        for p in left:
            wait_for(
                lambda p=p: not p.is_running() or p.status() == psutil.STATUS_ZOMBIE,
                10,
                "the run's processes to end",
            )
        # another attempt (another job, or this job's next run) is left alone
        assert all(p.is_running() for p in tree(other))
        # a ref without an attempt, or another user's, reaps nothing
        assert LocalBackend().reap({"uid": os.getuid()}) == 0
        assert LocalBackend().reap({"attempt_id": "attempt-2", "uid": os.getuid() + 1}) == 0
        assert all(p.is_running() for p in tree(other))
    finally:
        for proc in (mine, other):
            for p in tree(proc) if proc.poll() is None else ():
                p.kill()
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("marker", [DEEP[:8000], "not json", "[1, 2]"])
def test_a_broken_output_marker_reads_as_none(tmp_path, marker):
    """The marker of copied outputs is in the user's folder, which the job can write: one
    that does not read as a marker means "not copied yet", never an error."""
    import asyncio

    from gpuslice.jobs_proxy import sync_outputs

    folder = tmp_path / "gpu-jobs" / "train-3"
    folder.mkdir(parents=True)
    (folder / ".gpuslice-job.json").write_text(marker)

    class Service:
        async def call(self, method: str, path: str, raw: bool = False):
            if "/log" in path:
                return {"log": "done\n"}
            return b"{}" if raw else {}

    job = {"id": 3, "name": "train", "state": "completed", "output_path": "gpu-jobs/train-3"}
    copied = asyncio.run(sync_outputs(Service(), str(tmp_path), job))  # type: ignore[arg-type]
    assert copied is True
    assert json.loads((folder / ".gpuslice-job.json").read_text())["state"] == "completed"


def test_a_failed_cell_whose_message_holds_a_nul_ends_the_job_on_postgresql(
    postgres_db,
    tmp_path,
    cleanup,  # noqa: F811 (the fixture imported above)
):
    """Found by an attack: the job's end could not be written ("PostgreSQL text fields
    cannot contain NUL"), so it stayed "running" on its slice for good."""
    ledger = build_ledger(postgres_db, profiles=PROFILES, hosts=hosts(1))
    try:
        jobs = JobManager(ledger, ledger.db, LocalBackend(), tmp_path / "jobs")
        jobs.run_jobs_as_service_user = True
        notebook = nb_json(['raise ValueError("bad\\x00byte")'])
        body = {"notebook": notebook, "profile": "gpu-1", "path": "nul.ipynb"}
        job_id = int(jobs.submit(ANN, body)["id"])
        cleanup.append((tmp_path, job_id))
        scheduler = Scheduler(jobs, simulated=True)
        wait_for(
            lambda: (scheduler.tick(), row(jobs, job_id).state == "failed")[1],
            60,
            "the job to fail",
        )
        assert "ValueError: bad\ufffdbyte" in (row(jobs, job_id).error or "")
        assert batch_held(jobs) == []
    finally:
        ledger.db.dispose()
