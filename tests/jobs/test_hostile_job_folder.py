"""A job's own code owns its folder and its processes, and may be hostile: what it leaves
there or starts must not stall the service, stop it watching the other jobs, keep a slice
forever, or go on using a GPU after the job's slice has gone to someone else."""

from __future__ import annotations

import json
import os
import pwd
import secrets
import stat
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from gpuslice.run.jobdir import JobDir
from gpuslice_hub.jobs.accounts import Account
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


def test_a_fifo_in_place_of_the_runner_output_is_replaced_not_waited_on(tmp_path):
    """With no reader, opening a FIFO to write blocks: the whole scheduler pass would
    wait with it, for every user's jobs. It is never opened: its name is taken for a new
    file, and the run starts."""
    os.mkfifo(tmp_path / "runner.out")
    outcome: list[BaseException | dict] = []
    backend = LocalBackend()

    def start() -> None:
        try:
            outcome.append(backend.start(1, str(tmp_path), {"PATH": os.environ["PATH"]}))
        except OSError as e:
            outcome.append(e)

    thread = threading.Thread(target=start, daemon=True)
    thread.start()
    thread.join(10)
    assert outcome, "starting the run waited on the FIFO"
    assert isinstance(outcome[0], dict), outcome[0]
    ref = outcome[0]
    # (no job.json here: the runner says so in runner.out, and exits)
    wait_for(lambda: not backend.poll(ref).alive, 30, "the runner to exit")
    out = tmp_path / "runner.out"
    assert stat.S_ISREG(out.lstat().st_mode)
    assert "job.json does not exist" in out.read_text()


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


# What the owner's code can leave where the service opens a file of the job folder: a hard
# link to another user's file (the group-shared file of issue 45; with
# fs.protected_hardlinks=0, any file), a symbolic link to it, a FIFO, and a file of another
# user with no other name (a hard link whose first name was removed since).
PLANTS = ("hard link", "symbolic link", "FIFO", "another user's file")


def as_user(user: pwd.struct_passwd, *argv: str) -> None:
    """``argv`` run as ``user``: what the owner's running job can do, and no more."""
    r = subprocess.run(
        ["runuser", "-u", user.pw_name, "--", *argv], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def folders(accounts, shared_dir):
    """Makes a job folder of ann's (0700, hers, as the service hands it over, with her
    job.log) holding ``name`` planted by her as ``kind``, and bob's file it points at;
    returns both."""
    ann, bob = accounts
    bobs = shared_dir / "bob-files"
    bobs.mkdir(mode=0o711)
    os.chown(bobs, bob.pw_uid, bob.pw_gid)
    root = shared_dir / "jobs"
    root.mkdir(mode=0o711)
    made = iter(range(1, 1000))

    def make(name: str, kind: str) -> tuple[Path, Path]:
        folder = root / str(next(made))
        folder.mkdir(mode=0o700)
        (folder / "job.log").write_text("[start] ann's log\n")
        for path in (folder / "job.log", folder):
            os.chown(path, ann.pw_uid, ann.pw_gid)
        victim = bobs / f"data-{secrets.token_hex(4)}"
        # what the service would take for a finished run, if it read it
        victim.write_text(json.dumps({"status": "completed", "secret": "bob's data"}))
        os.chown(victim, bob.pw_uid, bob.pw_gid)
        # read and write for others: fs.protected_hardlinks lets ann link it (as it lets
        # a group member link a 0660 file of her group)
        victim.chmod(0o666)
        place = folder / name
        as_user(ann, "rm", "-f", str(place))
        if kind == "hard link":
            as_user(ann, "ln", str(victim), str(place))
        elif kind == "symbolic link":
            as_user(ann, "ln", "-s", str(victim), str(place))
        elif kind == "FIFO":
            as_user(ann, "mkfifo", str(place))
        else:  # only root can put it there (ann cannot give a file away)
            place.write_text(victim.read_text())
            os.chown(place, bob.pw_uid, bob.pw_gid)
            place.chmod(0o666)
            victim = place
        return folder, victim

    return make


def unchanged(victim: Path, bob: pwd.struct_passwd) -> None:
    """Bob's file is still his, with its mode and its content."""
    st = victim.lstat()
    assert stat.S_ISREG(st.st_mode)
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (bob.pw_uid, 0o666)
    assert json.loads(victim.read_text()) == {"status": "completed", "secret": "bob's data"}


@pytest.mark.parametrize("kind", PLANTS)
def test_a_run_starts_with_a_runner_output_of_its_own_whatever_was_planted(accounts, folders, kind):
    """Found by an attack (issue 45): the root service opened a hard link to another
    user's file as runner.out, chown'ed it to the job's owner and appended the runner's
    output to it. The planted name is replaced by a new file of the owner's; what it named
    is not opened."""
    ann, bob = accounts
    folder, victim = folders("runner.out", kind)
    backend = LocalBackend()
    account = Account.lookup(ann.pw_name)
    env = {"PATH": os.environ["PATH"]}
    if kind == "another user's file":
        # its only name: replacing it would delete it. The job fails, saying why.
        with pytest.raises(OSError, match=r"belongs to uid .* its only name"):
            backend.start(7, str(folder), env, account=account)
        unchanged(victim, bob)
        return
    ref = backend.start(7, str(folder), env, account=account)
    wait_for(lambda: not backend.poll(ref).alive, 30, "the runner to exit")
    unchanged(victim, bob)
    out = (folder / "runner.out").lstat()
    assert stat.S_ISREG(out.st_mode) and (out.st_uid, out.st_nlink) == (ann.pw_uid, 1)
    # the runner (as ann) wrote through it: no job.json in this folder, it says so
    assert "job.json does not exist" in (folder / "runner.out").read_text()


def test_the_owners_own_runner_output_is_appended_to_as_it_is(accounts, folders):
    ann, _ = accounts
    folder, _ = folders("runner.out", "FIFO")
    (folder / "runner.out").unlink()
    as_user(ann, "sh", "-c", f"echo 'an earlier run' > {folder}/runner.out")
    before = (folder / "runner.out").lstat()
    backend = LocalBackend()
    ref = backend.start(
        7, str(folder), {"PATH": os.environ["PATH"]}, account=Account.lookup(ann.pw_name)
    )
    wait_for(lambda: not backend.poll(ref).alive, 30, "the runner to exit")
    after = (folder / "runner.out").lstat()
    assert after.st_ino == before.st_ino and after.st_uid == ann.pw_uid
    text = (folder / "runner.out").read_text()
    assert text.startswith("an earlier run\n") and "job.json does not exist" in text


def test_a_run_does_not_start_in_a_folder_of_another_account(accounts, folders):
    """The account the runner would run as must own its folder (the service made it for
    them at submission)."""
    _, bob = accounts
    folder, _ = folders("runner.out", "FIFO")
    with pytest.raises(OSError, match="not to " + bob.pw_name):
        LocalBackend().start(
            7, str(folder), {"PATH": os.environ["PATH"]}, account=Account.lookup(bob.pw_name)
        )
    assert stat.S_ISFIFO((folder / "runner.out").lstat().st_mode)  # nothing touched


@pytest.mark.parametrize("kind", PLANTS)
def test_the_service_reads_and_appends_to_no_planted_file(accounts, folders, shared_dir, kind):
    """job.log (appended to by the service, its tail served to the owner), output.ipynb
    (served) and state.json (believed): a planted one is neither written nor read, and
    the job is seen as one whose state is unknown."""
    _, bob = accounts
    jobs = JobManager(None, None, LocalBackend(), shared_dir / "jobs")  # type: ignore[arg-type]
    folder, victim = folders("job.log", kind)
    job = SimpleNamespace(id=1, job_dir=str(folder))
    jobs.log_line(job, "preempted for another user's server")
    unchanged(victim, bob)
    assert jobs.log_text(job, 4000) == ""  # type: ignore[arg-type]

    folder, victim = folders("output.ipynb", kind)
    assert jobs.output(SimpleNamespace(id=1, job_dir=str(folder)), "ipynb", 10_000) is None  # type: ignore[arg-type]
    unchanged(victim, bob)

    folder, victim = folders("state.json", kind)
    # read through, bob's file would say the run completed (exit 0)
    assert LocalBackend().poll({"pid": 0, "job_dir": str(folder)}) == RunStatus(False, None)
    unchanged(victim, bob)


def test_the_service_appends_to_the_owners_own_log(accounts, folders, shared_dir):
    ann, _ = accounts
    jobs = JobManager(None, None, LocalBackend(), shared_dir / "jobs")  # type: ignore[arg-type]
    folder, _ = folders("output.ipynb", "FIFO")
    job = SimpleNamespace(id=1, job_dir=str(folder))
    jobs.log_line(job, "preempted for another user's server")
    assert "service: preempted for another user's server" in jobs.log_text(job, 4000)  # type: ignore[arg-type]
    assert (folder / "job.log").lstat().st_uid == ann.pw_uid
