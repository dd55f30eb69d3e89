"""Job folders are bounded (issue 45): removed at once for a job cancelled before it started,
after ``job_folder_retention_days`` once the owner's server copied the outputs, and at the
history retention whatever became of them; a user whose folders take their cap is refused.

A real SQLite ledger and real folders on disk; the jobs' ends are written into the ledger as
the scheduler writes them (nothing here needs a run), and the sweep is given its clock."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from gpuslice_hub.api.base import STATUS_BY_CODE
from gpuslice_hub.db.jobs_models import JobRow
from gpuslice_hub.db.models import utcnow
from gpuslice_hub.errors import Refused
from gpuslice_hub.jobs.backends import LocalBackend
from gpuslice_hub.jobs.folders import UserUsage
from gpuslice_hub.jobs.manager import JobManager
from gpuslice_hub.ledger import Caller
from tests.jobs.test_jobs_hub import nb_json
from tests.service.conftest import build_ledger

ANN = Caller("ann", (), "ann")
BOB = Caller("bob", (), "bob")
DAY = timedelta(days=1)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[JobManager]:
    ledger = build_ledger(f"sqlite:///{tmp_path}/ledger.sqlite")
    manager = JobManager(ledger, ledger.db, LocalBackend(), tmp_path / "jobs")
    manager.run_jobs_as_service_user = True  # (no system accounts for ann and bob here)
    manager.log = logging.getLogger("test-job-folders")
    yield manager
    ledger.db.dispose()


def submit(jobs: JobManager, caller: Caller = ANN) -> tuple[int, Path]:
    job = jobs.submit(caller, {"notebook": nb_json(["x = 1"]), "profile": "gpu-1"})
    folder = jobs.root / str(job["id"])
    assert (folder / "input.ipynb").is_file()
    return int(job["id"]), folder


def ended(jobs: JobManager, job_id: int, at: datetime, state: str = "completed") -> None:
    """What the scheduler writes when a run ends (it ran: ``started_at`` is set)."""
    with jobs.db.writing() as s:
        row = s.get(JobRow, job_id)
        assert row is not None
        row.state, row.started_at, row.finished_at = state, at - timedelta(hours=1), at


def test_a_job_cancelled_before_it_started_leaves_no_folder(jobs):
    job_id, folder = submit(jobs)
    cancelled = jobs.cancel(job_id, "ann")
    assert cancelled["state"] == "cancelled" and not folder.exists()
    assert cancelled["folder_removed_at"] is not None
    assert jobs.log_text(jobs.row(job_id), 100) == ""  # (its log went with it, no error)
    # one that ran, and is cancelled when queued again (preempted), keeps its outputs
    ran, kept = submit(jobs)
    with jobs.db.writing() as s:
        s.get(JobRow, ran).started_at = utcnow()
    assert jobs.cancel(ran, "ann")["folder_removed_at"] is None and kept.is_dir()


def test_an_ended_jobs_folder_goes_once_its_outputs_were_copied_and_kept_for_its_days(jobs):
    jobs.job_folder_retention_days = 7
    job_id, folder = submit(jobs)
    queued, waiting = submit(jobs)  # never touched however old
    end = utcnow()
    ended(jobs, job_id, end)
    # long after, but its outputs were never copied to ann's folder: kept
    assert jobs.sweep_folders(end + 30 * DAY).removed == 0 and folder.is_dir()
    assert jobs.row(job_id).folder_removed_at is None
    # copying them can only be said of an ended job
    with pytest.raises(Refused) as e:
        jobs.outputs_collected(queued)
    assert e.value.code == "wrong_state"
    copied = jobs.outputs_collected(job_id)["outputs_collected_at"]
    assert copied is not None
    assert jobs.outputs_collected(job_id)["outputs_collected_at"] == copied  # (the first)
    assert jobs.sweep_folders(end + 7 * DAY - timedelta(seconds=1)).removed == 0
    assert folder.is_dir()
    swept = jobs.sweep_folders(end + 7 * DAY + timedelta(seconds=1))
    assert swept.removed == 1 and not folder.exists()
    assert jobs.get(job_id)["folder_removed_at"] is not None
    assert waiting.is_dir() and jobs.get(queued)["state"] == "queued"
    assert jobs.sweep_folders(end + 365 * DAY).removed == 0  # (once)


def test_the_history_retention_removes_folders_whose_outputs_were_never_copied(jobs):
    job_id, folder = submit(jobs)
    end = utcnow()
    ended(jobs, job_id, end, "failed")
    assert jobs.sweep_folders(end + 29 * DAY, history_days=30).removed == 0
    assert jobs.sweep_folders(end + 31 * DAY, history_days=0).removed == 0  # (0: keep all)
    assert folder.is_dir()
    assert jobs.sweep_folders(end + 31 * DAY, history_days=30).removed == 1
    assert not folder.exists()


def test_removing_a_folder_follows_no_link_the_job_planted(jobs, tmp_path):
    outside = tmp_path / "outside"
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "precious.txt").write_text("keep me")
    (outside / "shared.txt").write_text("mine too")
    job_id, folder = submit(jobs)
    os.symlink(outside, folder / "link-to-a-folder")
    os.symlink(outside / "deep" / "precious.txt", folder / "link-to-a-file")
    os.link(outside / "shared.txt", folder / "hard-link")
    (folder / "checkpoints" / "sub").mkdir(parents=True)
    os.symlink(outside / "deep", folder / "checkpoints" / "sub" / "down")
    ended(jobs, job_id, utcnow() - 60 * DAY)
    assert jobs.sweep_folders(utcnow(), history_days=30).removed == 1
    assert not folder.exists()
    assert (outside / "deep" / "precious.txt").read_text() == "keep me"
    assert (outside / "shared.txt").read_text() == "mine too"


def test_a_user_whose_folders_take_their_cap_is_refused_saying_how_much_and_how_to_free_it(
    jobs,
):
    jobs.max_job_folder_bytes_per_user = 4 << 20
    jobs.usage = UserUsage(max_age=0)  # measured at each submission (30 s at a site)
    job_id, folder = submit(jobs)
    (folder / "checkpoints").mkdir()
    (folder / "checkpoints" / "namespace.ckpt").write_bytes(os.urandom(5 << 20))
    with pytest.raises(Refused) as e:
        submit(jobs)
    refusal = e.value
    assert refusal.code == "over_disk_quota" and STATUS_BY_CODE[refusal.code] == 413
    assert "take 5.0 MiB" in refusal.message and "4.0 MiB" in refusal.message, refusal.message
    assert "JobManager.max_job_folder_bytes_per_user" in refusal.message
    assert "cancel queued jobs" in refusal.message and "7 days after" in refusal.message
    assert refusal.detail["limit_bytes"] == 4 << 20
    assert refusal.detail["used_bytes"] >= 5 << 20
    assert [j["id"] for j in jobs.list_jobs("ann", None, 10)[0]] == [job_id]  # none queued
    # another user is not held to ann's use
    submit(jobs, BOB)
    # what ann frees counts: the job cancelled before it ran takes its folder with it
    jobs.cancel(job_id, "ann")
    _, mine = submit(jobs)
    (mine / "big").write_bytes(os.urandom(5 << 20))
    with pytest.raises(Refused):
        submit(jobs)
    jobs.max_job_folder_bytes_per_user = 0  # 0: no cap
    submit(jobs)


def test_the_sweep_measures_the_jobs_root_for_the_admin_overview(jobs):
    assert jobs.disk_standing()["bytes"] is None  # (not measured yet)
    _, folder = submit(jobs)
    (folder / "output.ipynb").write_bytes(os.urandom(1 << 20))
    now = utcnow()
    jobs.sweep_folders(now)
    standing = jobs.disk_standing()
    assert standing["bytes"] >= 1 << 20 and standing["folders"] == 1
    assert standing["path"] == str(jobs.root) and standing["measured_at"] is not None
    assert standing["user_cap_bytes"] == 10 << 30 and standing["retention_days"] == 7
