"""The scheduler reads a runner's files again only when they changed, and never through a
link (RunnerFiles)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from gpuslice.run.jobdir import JobDir
from gpuslice_hub.jobs.runner_files import RunnerFiles


def folder(tmp_path: Path) -> JobDir:
    jd = JobDir(tmp_path / "job")
    jd.root.mkdir()
    jd.checkpoints.mkdir()
    return jd


def test_a_changed_state_is_read_again_and_an_unchanged_one_is_not(tmp_path, monkeypatch):
    jd = folder(tmp_path)
    jd.write_state(status="running", cells_done=1)
    files = RunnerFiles()
    reads = []
    original = JobDir.state
    monkeypatch.setattr(JobDir, "state", lambda self: reads.append(1) or original(self))
    assert files.claims(str(jd.root))["cells_done"] == 1
    assert files.claims(str(jd.root))["cells_done"] == 1
    assert len(reads) == 1  # the second pass learnt from lstat that nothing changed
    jd.write_state(cells_done=2)  # the runner's atomic rename: a new file
    reads.clear()
    assert files.claims(str(jd.root))["cells_done"] == 2
    assert len(reads) == 1


def test_the_last_save_marker_counts_as_a_checkpoint(tmp_path):
    jd = folder(tmp_path)
    jd.write_state(status="running", last_checkpoint_at=1000.0)
    jd.last_save_marker.write_text("2000.5")
    assert RunnerFiles().claims(str(jd.root))["last_checkpoint_at"] == 2000.5


def test_a_link_in_place_of_the_state_is_refused_every_time(tmp_path):
    jd = folder(tmp_path)
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"status": "completed"}))
    os.symlink(secret, jd.state_path)
    files = RunnerFiles()
    assert files.claims(str(jd.root)) == {}
    os.unlink(jd.state_path)
    jd.write_state(status="running")
    assert files.claims(str(jd.root))["status"] == "running"


def test_a_linked_checkpoints_folder_is_never_walked_nor_cached(tmp_path):
    from gpuslice_hub.jobs.runner_files import _key

    jd = JobDir(tmp_path / "job")
    jd.root.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / ".last-save").write_text("5000")
    os.symlink(elsewhere, jd.checkpoints)
    # stat'ed without walking the owner's link: no key, so never cached
    assert _key(str(jd.checkpoints), ".last-save") is None
    jd.write_state(status="running", last_checkpoint_at=1000.0)
    files = RunnerFiles()
    assert files.claims(str(jd.root))["last_checkpoint_at"] == 1000.0  # the link is refused
    assert str(jd.root) not in files._seen


def test_a_file_that_failed_to_read_is_read_again(tmp_path, monkeypatch):
    jd = folder(tmp_path)
    jd.write_state(status="failed", error="CUDA out of memory in cell 7")
    files = RunnerFiles()
    original = JobDir.state
    monkeypatch.setattr(JobDir, "state", lambda self: {})  # an EIO, a full descriptor table
    assert files.claims(str(jd.root)) == {}
    monkeypatch.setattr(JobDir, "state", original)
    assert files.claims(str(jd.root))["error"] == "CUDA out of memory in cell 7"


def test_a_run_that_ended_is_read_afresh(tmp_path, monkeypatch):
    jd = folder(tmp_path)
    jd.write_state(status="running")
    files = RunnerFiles()
    files.claims(str(jd.root))
    reads = []
    original = JobDir.state
    monkeypatch.setattr(JobDir, "state", lambda self: reads.append(1) or original(self))
    files.claims(str(jd.root))
    files.claims(str(jd.root), fresh=True)
    assert len(reads) == 1
