"""gpuslice.checkpoint and the namespace snapshot, in-process and in a real subprocess."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import gpuslice.checkpoint as gckpt
from gpuslice.checkpoint.format import CorruptCheckpoint
from gpuslice.checkpoint.namespace import restore, snapshot


def test_namespace_round_trip_lists_what_could_not_be_saved(tmp_path: Path):
    fh = open(tmp_path / "scratch", "w")  # noqa: SIM115 - an open file is the point
    ns = {
        "weights": np.arange(1_000_000, dtype=np.float32).reshape(1000, 1000),
        "config": {"lr": 0.1, "layers": [64, 32]},
        "lock": threading.Lock(),
        "fh": fh,
        "gen": (i for i in range(3)),
        "np": np,
        "_private": 1,
        "In": ["ipython history"],
    }
    report = snapshot(ns, str(tmp_path / "ns.ckpt"))
    fh.close()
    assert set(report["skipped"]) == {"lock", "fh", "gen"}
    assert "TypeError" in report["skipped"]["lock"]
    assert sorted(report["saved"]) == ["config", "np", "weights"]
    assert report["bytes"] > 4_000_000

    fresh: dict = {}
    result = restore(fresh, str(tmp_path / "ns.ckpt"))
    assert result["failed"] == {}
    assert set(fresh) == {"weights", "config", "np"}
    np.testing.assert_array_equal(fresh["weights"], ns["weights"])
    assert fresh["weights"].flags.writeable
    assert fresh["np"] is np and fresh["config"] == ns["config"]


def test_truncated_checkpoint_is_refused(tmp_path: Path):
    ck = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0)
    ck.save(x=np.ones(100))
    data = (tmp_path / "c.ckpt").read_bytes()
    (tmp_path / "c.ckpt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CorruptCheckpoint):
        gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0).restore()


def test_steps_continue_from_the_saved_step(tmp_path: Path):
    ck = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0)  # write after every step
    total = 0
    for step in ck.steps(10):
        total += step
        ck.save(total=total)
        if step == 4:
            break  # dies inside step 4: its work is lost, steps 0-3 are safe
    again = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0)
    state = again.restore()
    assert state == {"total": 0 + 1 + 2 + 3} and again.step == 4
    assert list(again.steps(10)) == [4, 5, 6, 7, 8, 9]


DISK_FULL = """
import resource, signal, sys
import numpy as np
import gpuslice.checkpoint as g
ck = g.Checkpoint(sys.argv[1], interval=0)
ck.save(w=np.ones(1000))                   # small: fits
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
ck.save(w=np.zeros(1 << 20))               # 8 MB: the write fails like a full disk
print("saves", ck.saves)
"""


def test_a_failed_write_keeps_the_previous_good_checkpoint(tmp_path: Path):
    path = tmp_path / "c.ckpt"
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(DISK_FULL), str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert "saves 1" in out.stdout and "previous one is kept" in out.stderr
    state = gckpt.Checkpoint(str(path), interval=0).restore()
    assert state is not None
    np.testing.assert_array_equal(state["w"], np.ones(1000))
    assert [p.name for p in tmp_path.iterdir()] == ["c.ckpt"]  # no temporary file left


@pytest.fixture
def batch_job(tmp_path: Path, monkeypatch):
    """gpuslice.checkpoint as a batch job's kernel sees it, state reset around the test."""
    monkeypatch.setenv("GPUSLICE_JOB_DIR", str(tmp_path))
    (tmp_path / "checkpoints").mkdir()
    monkeypatch.setattr(gckpt, "_opened", set())
    monkeypatch.setattr(gckpt, "_cell", None)
    monkeypatch.setattr(gckpt, "_preempted", False)
    monkeypatch.setattr(gckpt, "_raised", False)
    return tmp_path


def _sum_loop(ck, total_steps, save_every, state=None, preempt_at=None):
    total = state["total"] if state else 0
    try:
        for step in ck.steps(total_steps):
            total += step
            if step % save_every == 0:
                ck.save(total=total)
            if step == preempt_at:
                gckpt.request_preemption()
    except gckpt.Preempted:
        return None
    return total


@pytest.mark.parametrize("save_every", [1, 3, 4])
def test_saving_every_few_steps_never_skips_work_after_a_resume(batch_job, save_every):
    # The state saved in a step is written under that step, even when the write comes
    # later (interval 0: due at every step; the preemption comes mid-way between saves).
    ck = gckpt.Checkpoint(str(batch_job / "a.ckpt"), interval=0)
    ck.restore()
    assert _sum_loop(ck, 10, save_every, preempt_at=6) is None
    gckpt._preempted = False
    again = gckpt.Checkpoint(str(batch_job / "a.ckpt"), interval=0)
    state = again.restore()
    assert again.step <= 7 and state is not None
    assert _sum_loop(again, 10, save_every, state) == sum(range(10))


def test_in_place_updates_saved_every_few_steps_resume_exactly(batch_job):
    # save(w=w) keeps a reference; w changes in place afterwards. A state saved in an
    # earlier step must not be written later under a newer step number.
    ck = gckpt.Checkpoint(str(batch_job / "w.ckpt"), interval=0)
    w = np.zeros(3)
    with pytest.raises(gckpt.Preempted):
        for step in ck.steps(5):
            w += 1
            if step % 2 == 0:
                ck.save(w=w)
            if step == 3:
                gckpt.request_preemption()
    gckpt._preempted = False
    again = gckpt.Checkpoint(str(batch_job / "w.ckpt"), interval=0)
    w = again.restore()["w"]
    assert again.step == 3  # saved in step 2: steps 0-2 are in it
    for _ in again.steps(5):
        w += 1
    np.testing.assert_array_equal(w, np.full(3, 5.0))


def test_steps_refuse_a_saved_state_that_was_not_restored(batch_job):
    ck = gckpt.Checkpoint(str(batch_job / "r.ckpt"), interval=0)
    ck.save(total=3)
    again = gckpt.Checkpoint(str(batch_job / "r.ckpt"), interval=0)
    with pytest.raises(gckpt.CheckpointMisuse, match="call restore"):
        next(again.steps(10))


def test_each_cell_of_a_job_has_its_own_default_checkpoint(batch_job):
    gckpt.begin_cell(2)
    first = gckpt.open()
    assert first.name == "cell-3" and first.path.endswith("checkpoints/cell-3.ckpt")
    with pytest.raises(gckpt.CheckpointMisuse, match="already open in this job"):
        gckpt.open()
    gckpt.begin_cell(3)
    assert gckpt.open().name == "cell-4"
    gckpt.open("train")
    with pytest.raises(gckpt.CheckpointMisuse, match="give each its own name"):
        gckpt.open("train")


def test_interactive_runs_do_not_resume_unless_asked(tmp_path: Path, monkeypatch):
    monkeypatch.delenv("GPUSLICE_JOB_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    ck = gckpt.open()
    assert ck.restore() is None
    assert _sum_loop(ck, 5, 1) == 10
    assert (tmp_path / ".gpuslice-checkpoints" / "default.ckpt").exists()
    # a second run of the same cell starts over, and opening the name again is allowed
    again = gckpt.open()
    assert again.restore() is None and list(again.steps(5)) == [0, 1, 2, 3, 4]
    asked = gckpt.open(resume=True)
    assert asked.restore() == {"total": 10} and list(asked.steps(5)) == []


def test_a_resume_names_steps_as_the_docs_number_them(tmp_path: Path, capsys):
    """Issue 44: steps are numbered from 0 ("saved in step n ... starts at n+1"); a loop
    whose steps 0...53 were restored said it "resumed after step 54"."""
    ck = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0, name="train")
    for step in ck.steps(100):
        if step == 54:  # (a step's save is written at its end: step 53's is the last)
            break
        ck.save(last=step)
    again = gckpt.Checkpoint(str(tmp_path / "c.ckpt"), interval=0, name="train")
    assert again.restore() == {"last": 53}
    said = capsys.readouterr().err
    assert "'train' resumed after step 53: continuing at step 54" in said, said
    assert next(iter(again.steps(100))) == 54
    assert gckpt.resumed_at(0) == "resumed before its first step (step 0)"
