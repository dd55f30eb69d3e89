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
