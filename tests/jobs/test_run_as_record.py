"""Whoever can write the ledger does not choose whose account runs a job (issue 45).

Found by an attack: with the ledger's password (then in a world-readable config file), a
user rewrote her queued job's ``user`` to another account, made its folder writable to all,
and the scheduler ran her notebook as the other user. A job now starts only as the account
that owns the folder the service made for it at submission, at the place it made it.

Real system accounts, a real SQLite ledger rewritten through its own connection (as the
attacker did with psql), the local backend's real runners and the scheduler's pass.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
from pathlib import Path

from gpuslice_hub.jobs.backends.local import LocalBackend
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.jobs.scheduler import Scheduler
from gpuslice_hub.ledger import Caller
from tests.harness.hub import wait_for
from tests.jobs.full_cluster import PROFILES, hosts
from tests.jobs.test_jobs_hub import nb_json
from tests.jobs.test_restart_recovery import row
from tests.service.conftest import build_ledger


def rewrite(ledger_path: Path, job_id: int, **fields: str) -> None:
    """What the attacker did: an UPDATE of the job's row, its revision moved so the
    service's cached queue reads it again."""
    sets = ", ".join(f'"{k}" = ?' for k in fields)
    with sqlite3.connect(ledger_path) as conn:
        conn.execute(
            f"UPDATE jobs SET {sets}, revision = revision + 1 WHERE id = ?",
            (*fields.values(), job_id),
        )


def test_a_job_whose_ledger_row_was_rewritten_runs_as_no_other_account(
    accounts, shared_dir, caplog
):
    ann, bob = accounts
    ledger_path = shared_dir / "run-as.sqlite"
    ledger = build_ledger(f"sqlite:///{ledger_path}", profiles=PROFILES, hosts=hosts(1))
    root = shared_dir / "run-as-jobs"
    jobs = JobManager(ledger, ledger.db, LocalBackend(), root)
    # a logger of its own: the suite's traitlets applications stop theirs propagating
    jobs.log = logging.getLogger("test-run-as")
    # Where each run says whose account ran it: a folder every account may write.
    ran = shared_dir / "ran-as"
    ran.mkdir(mode=0o1777)
    ran.chmod(0o1777)
    probe = [
        f"import os\nopen(os.path.join({str(ran)!r}, os.environ['GPUSLICE_JOB_ID']), 'w')"
        ".write(str(os.getuid()))"
    ]
    body = {"notebook": nb_json(probe), "profile": "gpu-1", "path": "probe.ipynb"}
    caller = Caller(ann.pw_name, (), ann.pw_name)
    try:
        owner_changed = int(jobs.submit(caller, body)["id"])
        folder_changed = int(jobs.submit(caller, body)["id"])
        honest = int(jobs.submit(caller, body)["id"])

        # 1. the attack: the row names bob, and ann opened her folder to everyone
        rewrite(ledger_path, owner_changed, user=bob.pw_name)
        for path in (root / str(owner_changed), *(root / str(owner_changed)).iterdir()):
            path.chmod(0o777)
        # 2. the row names bob and a folder of his that ann can write (a project folder
        # he shares): his folder, but not the one the service made for this job
        shared = shared_dir / "bobs-project"
        shutil.copytree(root / str(folder_changed), shared)
        for path in (shared, *shared.iterdir()):
            os.chown(path, bob.pw_uid, bob.pw_gid)
        shared.chmod(0o777)
        rewrite(ledger_path, folder_changed, user=bob.pw_name, job_dir=str(shared))

        scheduler = Scheduler(jobs, simulated=True)
        ended = ("completed", "failed")
        with caplog.at_level(logging.WARNING, logger="test-run-as"):
            wait_for(
                lambda: (
                    scheduler.tick(),
                    all(
                        row(jobs, i).state in ended for i in (owner_changed, folder_changed, honest)
                    ),
                )[1],
                90,
                "the three jobs to end",
            )

        # the honest job ran, as ann: the check refuses no job it should run
        assert row(jobs, honest).state == "completed", row(jobs, honest).error
        assert (ran / str(honest)).read_text() == str(ann.pw_uid)
        for job_id in (owner_changed, folder_changed):
            # no run of it at all: nothing ran as bob (nor as anyone), no runner started
            run_by = (ran / str(job_id)).read_text() if (ran / str(job_id)).exists() else ""
            assert not run_by, f"job {job_id} ran as uid {run_by} (bob's: {bob.pw_uid})"
            job = row(jobs, job_id)
            assert job.state == "failed"
            assert f"refused to run it as {bob.pw_name}" in (job.error or "")
            assert not (Path(job.job_dir) / "runner.out").exists()
            assert not (Path(job.job_dir) / "state.json").exists()
        # the reason is in the service's log, for the admin
        assert f"job {owner_changed}: refused to run it as {bob.pw_name}: its folder" in caplog.text
        assert f"belongs to uid {ann.pw_uid}, not to {bob.pw_name}" in caplog.text
        said = f"job {folder_changed}: refused to run it as {bob.pw_name}: its folder in the "
        assert said + f"ledger is {str(shared)!r}" in caplog.text
        # and their slices went back
        assert ledger.allocations(user=None, active_only=True, limit=100) == []
    finally:
        ledger.db.dispose()
